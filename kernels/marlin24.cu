// FP16 x INT4 GEMM on the Sparse-MARLIN 2:4 layout: host side (tile choice, chunking of m, launches).
// The kernel is in marlin24_kernel.cuh. Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80
//   -gencode=arch=compute_90,code=sm_90 -c kernels/marlin24.cu
#include "marlin24_kernel.cuh"

namespace marlin_cli {
namespace sparse24 {

using detail::kMaxDevices;
using detail::max_smem;
constexpr int kMinTiles = 4;  // perf-log s3

// Launch one configuration over `par` chunks side by side: every block the GPU holds at once, shared evenly by the
// chunks (and capped so that two partial tiles per block fit the workspace).
template <class C, bool GROUPED>
cudaError_t launch(Params p, int par, int sms, int device, cudaStream_t stream) {
  static int occupancy[kMaxDevices] = {};  // resident blocks per SM, measured once per device
  auto kernel = gemm24_kernel<C, GROUPED>;
  if (occupancy[device] == 0) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
    if (err != cudaSuccess) return err;
    int blocks = 0;
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, C::THREADS, C::SMEM);
    if (err != cudaSuccess) return err;
    if (blocks < 1) return cudaErrorInvalidConfiguration;
    occupancy[device] = blocks;
  }
  const int64_t slots = static_cast<int64_t>(sms) * kMaxBlocksPerSm * 2 * kMaxTileElems / (2 * C::R * C::W);
  int64_t blocks = static_cast<int64_t>(sms) * occupancy[device];
  if (blocks > slots) blocks = slots;
  // At least kMinTiles tiles per block: on short layers fewer, longer runs leave fewer split-k parts to add up.
  const int64_t tiles = static_cast<int64_t>(p.n / C::W) * (p.k / C::DEPTH);
  if (blocks * kMinTiles > tiles * par) blocks = (tiles * par + kMinTiles - 1) / kMinTiles;
  if (blocks < par) blocks = par;
  const int grid = detail::size_grid(p, par, static_cast<int>(blocks / par), sms * occupancy[device]);
  return detail::launch_with_parts<detail::RowParts<C, false>>(GROUPED, p, grid, device, stream, [&](const Params& q) {
    return detail::launch_kernel(kernel, grid, C::THREADS, C::SMEM, device, stream, q);
  });
}

struct Choice {
  int tt, ns, kq, stages;
};

// Every compiled configuration (TT, NS, KQ, STAGES): the ones `choose` can pick.
#define MARLIN24_CONFIGS(X)                                                                     \
  X(1, 1, 2, 4) X(1, 1, 1, 4)                                                                    \
  X(2, 1, 2, 4) X(2, 1, 1, 4)                                                                    \
  X(4, 2, 2, 8) X(4, 2, 1, 8) X(4, 1, 2, 8) X(4, 1, 1, 8)                                        \
  X(4, 2, 2, 4) X(4, 2, 1, 4) X(4, 1, 2, 4) X(4, 1, 1, 4)

int smem_of(const Choice& c) {
#define MARLIN24_SMEM(TT, NS, KQ, ST) \
  if (c.tt == TT && c.ns == NS && c.kq == KQ && c.stages == ST) return Cfg<TT, NS, KQ, ST>::SMEM;
  MARLIN24_CONFIGS(MARLIN24_SMEM)
#undef MARLIN24_SMEM
  return -1;
}

cudaError_t launch_choice(const Choice& c, bool grouped, const Params& p, int par, int sms, int device,
                          cudaStream_t stream) {
#define MARLIN24_LAUNCH(TT, NS, KQ, ST)                                                           \
  if (c.tt == TT && c.ns == NS && c.kq == KQ && c.stages == ST) {                                 \
    return grouped ? launch<Cfg<TT, NS, KQ, ST>, true>(p, par, sms, device, stream)              \
                   : launch<Cfg<TT, NS, KQ, ST>, false>(p, par, sms, device, stream);            \
  }
  MARLIN24_CONFIGS(MARLIN24_LAUNCH)
#undef MARLIN24_LAUNCH
  return cudaErrorInvalidConfiguration;
}

// The mma.sp kernel's tiles (every m where the wgmma.sp kernel cannot run: GPUs other than Hopper, builds without
// sm_90a): 8-row tiles of A by m (one 8-row tile at m <= 8: no work on rows that do not exist); 128-column blocks of
// 4 warps at m <= 16 (three blocks per SM at 16 rows: 7B M = 16 -7% against 256-column blocks of 8 warps, one per
// SM; perf-log s2, s4, q2), 256-column blocks of 8 warps above; two k32 rows per warp per stage where k allows; the
// deepest ring that fits the shared memory.
bool choose(int m, int n, int k, int smem_cap, Choice* out) {
  const int tt = m <= 8 ? 1 : m <= 16 ? 2 : 4;
  const int ns_want = tt == 4 ? 2 : 1;
  const int kq = k % 256 == 0 ? 2 : 1;
  for (int ns = n % (128 * ns_want) == 0 ? ns_want : 1; ns >= 1; --ns) {
    for (int stages : {8, 4}) {
      const Choice c{tt, ns, kq, stages};
      const int smem = smem_of(c);
      if (smem > 0 && smem <= smem_cap) {
        *out = c;
        return true;
      }
    }
  }
  return false;
}

}  // namespace sparse24

bool gemm24_kernel_order(int device) { return detail::has_wgmma(device); }

cudaError_t gemm24(const Gemm24Args& g, cudaStream_t stream) {
  using namespace sparse24;
  int lg_group = 0;
  if (const cudaError_t err = detail::check_args(g, 128, 32, &lg_group); err != cudaSuccess) return err;
  const bool grouped = g.groups > 1;

  Params p;
  p.meta = static_cast<const int4*>(g.meta);
  // On an sm_90a build and a Hopper GPU the wgmma.sp kernel, by 256 columns or, on layers too narrow for those to fill
  // the GPU, 128 (the dense kernel's rules, sm90_cols64 and for 128 rows sm90_cols128): 16-row chunks with 128-deep
  // stages for m <= 16 (faster than the mma.sp kernel's on every layer measured at m = 9-16: s10; at m = 1-8 7B -5%,
  // 70B level: s24), 8-row ones for m <= 8 on 256-column tiles and on 128-column ones at three or four blocks per SM
  // (half the A tile's copies and operand reads: 7B / 70B m = 1 -4% / -2%; 128-column tiles at two blocks per SM lost
  // up to 14%: perf-log r8; three or four by sm90_blocks_per_sm: s25, b4, b5), 32-row ones for m = 17-32 (half the
  // 64-row chunks' tensor work: 7B / 70B -29%, perf-log o7), 64-row ones for m = 33-64, 96-row ones for m = 65-96 (a
  // quarter less tensor and A-tile work than 128 rows, as the dense kernel's: perf-log s23) and 128-row ones above.
  // From 96 rows, and 64 rows by 256 columns, the warp-specialized kernel runs them, one block per SM (ws_tile;
  // perf-log w8, s12, w10; the 64-row chunks' width counts those slots, so n = 4096 takes 256 columns there); narrower
  // 64-row chunks on the one-warpgroup kernel, two blocks per SM. At m <= 16 it also runs 512- or 256-column tiles
  // where its runs are long (ws_small_cols; perf-log ws16).
  int rows = g.m > 96 ? 128 : g.m > 64 ? 96 : g.m > 32 ? 64 : g.m > 16 ? 32 : 16;
  const int ws_cols = rows == 16 ? ws_small_cols(g.m, g.n, g.k, g.sms) : 0;
  const int cols = ws_cols > 0      ? ws_cols
                   : rows == 128 ? detail::sm90_cols128(g.m, g.n, g.k, g.sms)
                                 : detail::sm90_cols64(g.n, rows == 64 ? g.sms : g.sms * kMaxBlocksPerSm);
  const int n_cols = cols > 0 ? g.n / cols : 0;
  const int k_tiles = g.k / Sm90Cfg<128>::DEPTH;
  if (cols > 0 && detail::has_wgmma(g.device)) {
    const bool ws = ws_cols > 0 || ws_tile(rows, cols);
    const int bps = detail::sm90_blocks_per_sm(ws, rows, cols, g.sms, g.n, g.k, g.m <= 8);
    if (g.m <= 8 && (cols >= 256 || bps > kMaxBlocksPerSm)) rows = 8;
    return detail::run_chunk_groups(p, g, g.a, lg_group, rows, [&](int par) {
      const int per_chunk = detail::sm90_blocks_per_chunk(g.sms, par, n_cols, k_tiles, rows, bps);
      const int grid = detail::size_grid(p, par, per_chunk, g.sms * bps);
      return launch_sm90(ws, rows, cols, bps, grouped, p, grid, g.device, stream);
    });
  }
  Choice choice;
  if (!choose(g.m, g.n, g.k, max_smem(g.device), &choice)) return cudaErrorInvalidConfiguration;
  return detail::run_chunk_groups(p, g, g.a, lg_group, 8 * choice.tt, [&](int par) {
    return launch_choice(choice, grouped, p, par, g.sms, g.device, stream);
  });
}

}  // namespace marlin_cli
