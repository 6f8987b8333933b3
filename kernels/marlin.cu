// FP16 x INT4 GEMM on the MARLIN dense layout: host side (tile choice, launches) and the act-order gather.
// The kernel itself is in marlin_kernel.cuh, instantiated per chunk height in marlin_mb1.cu .. marlin_mb4.cu.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90 -c <file>.cu
#include "marlin_kernel.cuh"

namespace marlin_cli {
namespace detail {

// A[:, perm] into a scratch buffer: one thread per 8 output columns.
__global__ void gather_columns(const __half* __restrict__ a, const int* __restrict__ perm, __half* __restrict__ out,
                               int m, int k) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t groups = static_cast<int64_t>(m) * (k / 8);
  if (idx >= groups) return;
  const int64_t row = idx / (k / 8);
  const int c0 = static_cast<int>(idx % (k / 8)) * 8;
  const __half* src = a + row * k;
  __half v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = src[perm[c0 + i]];
  *reinterpret_cast<int4*>(out + row * k + c0) = *reinterpret_cast<int4*>(v);
}

// ---------------------------------------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------------------------------------

int smem_of(const Choice& c) {
#define MARLIN_SMEM(ROWS, NS, ST) \
  if (c.rows == ROWS && c.ns == NS && c.stages == ST) return CfgFor<ROWS, NS, ST>::SMEM;
  MARLIN_CONFIGS(MARLIN_SMEM)
#undef MARLIN_SMEM
  return -1;
}

cudaError_t launch_choice(const Choice& c, bool grouped, const Params& p, int grid, int device,
                          cudaStream_t stream) {
  switch ((c.rows + 15) / 16) {
    case 1: return launch_mb1(c, grouped, p, grid, device, stream);
    case 2: return launch_mb2(c, grouped, p, grid, device, stream);
    case 3: return launch_mb3(c, grouped, p, grid, device, stream);
    default: return launch_mb4(c, grouped, p, grid, device, stream);
  }
}

bool has_wgmma(int device) {
#ifdef MARLIN_SM90A
  return compute_capability(device) == 90 && max_smem(device) >= kSm90Smem;
#else
  (void)device;
  return false;
#endif
}

// The tallest chunk (<= what m needs) and widest strip (dividing n) that fit the shared memory. Two blocks per SM
// (chunks of <= 32 rows) measured best with 4 stages each, one block with 8 (perf-log v3). Chunks of <= 16 rows
// whose blocks take short runs (at most 32 tiles each over the device's `slots` block slots) measured faster with 3
// stages, long runs with 4 (perf-log f2).
bool choose(int m, int n, int k, int slots, int smem_cap, Choice* out) {
  constexpr int kRows[] = {8, 16, 32, 48, 64};
  constexpr int kDepth = 16 * CfgFor<16, 2, 4>::KT;  // k per tile of chunks <= 32 rows
  int want = 0;
  while (want < 4 && kRows[want] < m) ++want;
  for (int h = want; h >= 0; --h) {
    const int rows = kRows[h];
    for (int ns = rows <= 32 ? 2 : 4; ns >= 1; ns /= 2) {
      if (n % (64 * ns)) continue;
      const bool short_runs = static_cast<int64_t>(n / (64 * ns)) * (k / kDepth) <= 32LL * slots;
      const Choice c{rows, ns, rows <= 16 && short_runs ? 3 : rows <= 32 ? 4 : 8};
      const int smem = smem_of(c);  // -1: not compiled (MARLIN_CONFIGS)
      if (smem > 0 && smem <= smem_cap) {
        *out = c;
        return true;
      }
    }
  }
  return false;
}

}  // namespace detail

cudaError_t gemm(const GemmArgs& g, cudaStream_t stream) {
  using namespace detail;
  int lg_group = 0;
  if (const cudaError_t err = check_args(g, 64, 16, &lg_group); err != cudaSuccess) return err;
  const bool grouped = g.groups > 1;

  const void* a = g.a;
  if (g.perm != nullptr) {
    const int64_t groups8 = static_cast<int64_t>(g.m) * (g.k / 8);
    const int threads = 256;
    gather_columns<<<static_cast<unsigned>((groups8 + threads - 1) / threads), threads, 0, stream>>>(
        static_cast<const __half*>(g.a), g.perm, static_cast<__half*>(g.a_perm), g.m, g.k);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
    a = g.a_perm;
  }

  // An sm_90a build on a Hopper GPU: the wgmma kernel with the tile sm90_tile() picks; otherwise (or where no wgmma
  // tile fits) the sm_80 kernel with the tile choose() picks.
  const int slots = g.sms * kMaxBlocksPerSm;
  const Sm90Tile tile = sm90_tile(g.m, g.n, g.k, slots, grouped && g.k / g.groups < Sm90Cfg<16>::DEPTH);
  const bool sm90 = tile.cols > 0 && has_wgmma(g.device);
  Choice choice{};
  if (!sm90 && !choose(g.m, g.n, g.k, slots, max_smem(g.device), &choice)) {
    return cudaErrorInvalidConfiguration;
  }
  const int rows = sm90 ? tile.rows : choice.rows;
  const int blocks_per_sm = sm90 ? sm90_blocks_per_sm(sm90_ws(tile.rows), tile.rows, tile.cols, g.sms, g.n, g.k)
                           : choice.rows <= 32 ? kMaxBlocksPerSm : 1;
  const int n_cols = g.n / (sm90 ? tile.cols : 64 * choice.ns);

  Params p;
  return run_chunk_groups(p, g, a, lg_group, rows, [&](int par) {
    const int grid = size_grid(p, par,
                               sm90 ? sm90_blocks_per_chunk(g.sms, par, n_cols, g.k / Sm90Cfg<64>::DEPTH, tile.rows,
                                                            blocks_per_sm)
                                    : g.sms * blocks_per_sm / par,
                               g.sms * blocks_per_sm);
    return sm90 ? launch_sm90(tile, blocks_per_sm, grouped, p, grid, g.device, stream)
                : launch_choice(choice, grouped, p, grid, g.device, stream);
  });
}

}  // namespace marlin_cli
