// FP16 x INT4 GEMM on the MARLIN dense layout with Hopper's warpgroup MMA (wgmma), for m > 8 on sm_90a.
//
// mma.sync runs at about half of the H200's tensor rate, which caps the sm_80 kernel (marlin_kernel.cuh) below
// cuBLAS from m = 64 on. Here the roles are transposed: C^T (n, m) = dequant(B)^T (n, k) @ A^T (k, m), so the
// dequantized weights are wgmma's register operand (m64 = 64 output columns per instruction) and the activations
// its shared-memory operand (n = the chunk's rows of A, the 128-byte-swizzled tile of the stage).
//
// The layout makes this free: a lane's packed word j of a 64-column strip dequantizes to the B fragments of the
// strip's n8 sub-tiles 2j and 2j + 1 (DESIGN.md 3.1), which are exactly the rows g and g + 8 of an m16k16 register
// fragment, and a wgmma's 64 rows may be any columns. Warp w of a warpgroup with NS strips takes strip w NS / 4 and
// NS of its lanes' 4 words (warp_strip, warp_word0) and feeds word j to the j-th wgmma, whose 64 rows are then
// columns {sub-tiles 2j, 2j + 1 of each warp's strip and words}:
// - 32 x 256 tiles (m = 17-32): warp w reads its own 16 bytes of strip w, four m64n32k16 per k16 tile;
// - 32 x 128 (m = 17-32 on layers too narrow for 256 columns to fill the GPU): warps 2s and 2s + 1 share strip s,
//   each taking 8 of its lanes' 16 bytes, two m64n32k16;
// - m > 32, the warp-specialized kernel: two warpgroups, each on half of the tile's strips as above: 64 x 512 tiles
//   four m64n64k16 per warpgroup and k16 tile, 64 x 256 two, 64 x 128 one, 128 x 256 two m64n128k16, 128 x 128 one,
//   256 x 128 (m > 128) one m64n256k16. Each dequantized weight serves 64, 128 or 256 rows (perf-log w4, w8, w10).
// In all the accumulators map back to columns when C is written.
//
// In the one-warpgroup kernel's 16- and 32-row chunks (m = 9-32: m64n16k16 / m64n32k16, 8 / 16 accumulators per
// wgmma) the weights enter wgmma still offset, as the mma.sync kernel's 8-row chunks do: no subtract and no fp16
// scaling per weight (5 instead of 13 instructions per packed word), one more wgmma of a constant tile per k16 tile
// for the offsets' product, and each stage's fp32 sums corrected and scaled once (compute_offset). Their stages are
// 128 deep, the A tile two 64-deep swizzle panels. The warp-specialized kernel scales each weight in fp16
// (compute_scaled).
//
// Up to m = 32 a block is one warpgroup that copies its stages itself (StageLoader, 16-byte cp.async) around a block
// barrier per stage, the sm_80 kernel's ring loop; two blocks share an SM. Above, a block is two computing
// warpgroups and one thread that only copies: per stage one tensor copy (TMA) of the A tile, landing in the 128-byte
// swizzle wgmma reads with rows past m as zeros, and one bulk copy per k16 row of weights and per scale row, all
// counted on the ring slot's mbarrier; the computing threads release a slot on a second mbarrier. Copied by cp.async
// from every thread, the 128-row A tile alone took a third of the run to issue (perf-log w5), and the block barrier
// over eight warps gave back more than a 256 x 128 tile's halved dequantization saved (w7).
// The striped partition and chunks side by side for larger m are the sm_80 kernel's; parts of split column strips
// are saved straight from the registers and added after the launch by add_parts_kernel (wgmma.cuh).
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c kernels/marlin_sm90.cu
// (for other targets the kernel bodies are empty and the host never launches them).
#include "wgmma.cuh"

#include <cudaTypedefs.h>

namespace marlin_cli {
namespace detail {

// Where thread tid's accumulators land (wgmma_run, add_parts_kernel): element 4i + e of the j-th wgmma's tile is
// output column x0(col, tid) + of(j, e / 2) of column strip col, i.e. 16 (NS warp + j) + 8(e / 2) + lane / 4 of the
// block's tile; per-channel scales are permuted (permuted_scale).
template <class C>
struct DenseCols {
  static __device__ __forceinline__ int x0(int col, int tid) {
    return col * C::W + 16 * C::NS * (tid / 32) + tid % 32 / 4;
  }
  static __device__ __forceinline__ int of(int j, int h) { return 16 * j + 8 * h; }
  static __device__ __forceinline__ int scale(int x) { return permuted_scale(x); }
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Thread `tid`'s weights in a stage of config C (C::STRIPS 64-column strips): words [word0, word0 + NS) of its lanes'
// 16 bytes of strip `strip`, and the matching scale words; byte offsets from the stage's address.
template <class C>
struct WarpWords {
  uint32_t b_off, s_off;
  __device__ __forceinline__ explicit WarpWords(int tid) {
    const int lane = tid % 32, warp = tid / 32;
    const int strip = warp_strip<C::NS>(warp), word0 = warp_word0<C::NS>(warp);
    b_off = (C::A_STAGE + strip * 32 + lane) * 16 + 4 * word0;
    s_off = (C::A_STAGE + C::B_STAGE + strip * 8 + lane / 4) * 16 + 4 * word0;
  }
};

// One stage at st with scaled weights (dequant_scaled) into acc: per k16 tile q, the NS words (and scales) of this
// warp dequantized into NS register fragments and NS wgmma of 64 x R. Each tile's words are read before the wait for
// the previous tile's wgmma, so the shared-memory latency hides behind it; within the stage only the previous tile's
// wgmma is waited for (their fragment registers are reused next). At its end the last tile's group stays in flight
// for ws_kernel to retire (perf-log w9).
template <class C, bool GROUPED, int J>
__device__ __forceinline__ void compute_scaled(uint32_t st, const WarpWords<C>& w, int lg_group,
                                               float (&acc)[J][C::ACC]) {
  auto lds_tile = [&](int q, uint32_t (&bw)[J], uint32_t (&sw)[J]) {
    lds_words(st + w.b_off + q * C::STRIPS * 32 * 16, bw);
    if (GROUPED) lds_words(st + w.s_off + ((q >> lg_group) * C::STRIPS * 8 * 16), sw);
  };
  uint32_t bw[J], sw[J] = {};
  lds_tile(0, bw, sw);
#pragma unroll
  for (int q = 0; q < C::KT; ++q) {
    uint32_t a[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j) {
      uint32_t f0[2], f1[2];
      dequant_scaled<GROUPED>(bw[j], sw[j], f0, f1);
      a[j][0] = f0[0];  // rows g: sub-tile 2j, k 2c..2c+1
      a[j][1] = f1[0];  // rows g + 8: sub-tile 2j + 1
      a[j][2] = f0[1];  // k + 8
      a[j][3] = f1[1];
    }
    wgmma_fence();  // the fragments (and, after a finish, the zeroed accumulators) are written
#pragma unroll
    for (int j = 0; j < J; ++j) wgmma_m64k16<C::R>(acc[j], a[j], a_panel_desc(st, C::R, q));
    wgmma_commit();
    if (q + 1 < C::KT) lds_tile(q + 1, bw, sw);
    wgmma_wait_tile<C::KT, false>(q);
  }
}
#endif

template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::THREADS, C::BLOCKS) gemm_sm90_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(C::OFFSET, "16- and 32-row chunks; from 64 rows the warp-specialized kernel");
  constexpr int J = C::NS;  // wgmma per k16 tile, and packed words per lane per k16 tile
  extern __shared__ int4 smem[];

  const int tid = threadIdx.x;
  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;

  const int4* a_g = p.a + static_cast<int64_t>(run.chunk) * C::R * (p.k / 8);
  StageLoader<C, GROUPED> loader(p, a_g, run.m_rows, run.t_begin, run.k_tiles);
  auto ready = [] { fence_proxy_async(); };  // what came through cp.async is visible to wgmma
  const WarpWords<C> w(tid);

  // acc[j]: the j-th wgmma's 64 x R tile (its columns: DenseCols). Element 4i + e of this thread is row
  // 8i + 2(lane % 4) + e % 2 of the chunk.
  float acc[J][C::ACC];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;

  // OFFSET: the weights enter wgmma as 1024 + q (k rows 0-7 of a k16 tile) and 64 + q (rows 8-15: nibbles<0x5400>),
  // so `raw` sums the stage's products with those offsets. One more wgmma per k16 tile, of a constant tile (-1032 on
  // rows 0-7, -72 on rows 8-15), sums the offsets' products, the same for every column (`base`). At the stage's
  // end each column's sums are corrected and scaled in fp32: acc += s (raw + base). The fp16 products are exact;
  // the fp32 sums are up to ~1000 times the result over the stage's 128 k, which costs ~10 of fp32's 24 bits (the
  // 8-row mma.sync chunks do the same over 16-32 k).
  auto compute_offset = [&](uint32_t st) {
    constexpr uint32_t kOffset[4] = {0xe408e408, 0xe408e408, 0xd480d480, 0xd480d480};  // -1032, -72
    uint32_t bw[J], sw[J] = {};
    lds_words(st + w.b_off, bw);
    float raw[J][C::ACC], base[C::ACC];
#pragma unroll
    for (int q = 0; q < C::KT; ++q) {
      uint32_t a[J][4];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const Nibbles v = nibbles<0x54005400>(bw[j]);
        a[j][0] = v.lo0;  // rows g: sub-tile 2j, k 2c..2c+1
        a[j][1] = v.lo1;  // rows g + 8: sub-tile 2j + 1
        a[j][2] = v.hi0;  // k + 8
        a[j][3] = v.hi1;
      }
      wgmma_fence();
      if (q == 0) {  // the stage's first products start the sums
        wgmma_m64k16<C::R, false>(base, kOffset, a_panel_desc(st, C::R, q));
#pragma unroll
        for (int j = 0; j < J; ++j) wgmma_m64k16<C::R, false>(raw[j], a[j], a_panel_desc(st, C::R, q));
      } else {
        wgmma_m64k16<C::R>(base, kOffset, a_panel_desc(st, C::R, q));
#pragma unroll
        for (int j = 0; j < J; ++j) wgmma_m64k16<C::R>(raw[j], a[j], a_panel_desc(st, C::R, q));
      }
      wgmma_commit();
      if (q + 1 < C::KT) lds_words(st + w.b_off + (q + 1) * C::STRIPS * 32 * 16, bw);
      // a stage is one group of 128 or part of a longer one (smaller groups take the mma.sync kernel: sm90_tile)
      if (GROUPED && q + 1 == C::KT) lds_words(st + w.s_off, sw);
      wgmma_wait_tile<C::KT>(q);
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      float2 sv = make_float2(1.f, 1.f);  // the scales of rows g and g + 8 (columns of sub-tiles 2j, 2j + 1)
      if (GROUPED) sv = __half22float2(*reinterpret_cast<const __half2*>(&sw[j]));
#pragma unroll
      for (int e = 0; e < C::ACC; ++e) acc[j][e] += (e % 4 < 2 ? sv.x : sv.y) * (raw[j][e] + base[e]);
    }
  };
  wgmma_run<C, DenseCols<C>, GROUPED>(p, run, smem, acc, loader, ready, compute_offset);
#endif
}

// The warp-specialized kernel (Sm90WsCfg, m > 64): threads 0-255 compute (two warpgroups, each on its half of the
// tile's strips), thread 256 of the third warpgroup copies (ws_kernel): per stage one arrival on the slot's full
// barrier with the stage's byte count, then the tensor copy of A and one bulk copy per k16 row of weights and per
// scale row, charged to it.
template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::BLOCK_THREADS, 1)
    gemm_sm90_ws_kernel(const Params p, const __grid_constant__ CUtensorMap a_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  auto copy = [&](const Run& run, const WsRing& ring) {
    if (threadIdx.x != C::THREADS) return;
    grid_dependency_wait();
    const int s_rows = max(1, C::KT >> p.lg_group);
    const uint32_t bytes = (C::A_STAGE + C::B_STAGE) * 16 + (GROUPED ? s_rows * C::STRIPS * 128 : 0);
    const int b_row = p.n / 2, s_row = p.n / 8;  // int4 per k16 row of weights, per scale row
    TilePos at(run.t_begin, run.k_tiles);
    RingPos<C::STAGES> slot;
#pragma unroll 1
    for (int it = 0; it < run.n_iter; ++it, at.next(run.k_tiles)) {
      mbar_wait(ring.empty0 + 8 * slot.slot, slot.phase ^ 1);  // the slot's last stage is done with (at once at first)
      const uint32_t st = ring.ring + slot.slot * C::STAGE * 16, bar = ring.full0 + 8 * slot.slot;
      mbar_expect(bar, bytes);
      tma_load_2d(st, &a_map, at.kt * C::DEPTH, run.chunk * C::R, bar);
      const int4* b = p.b + static_cast<int64_t>(at.kt * C::KT) * b_row + at.col * C::STRIPS * 32;
#pragma unroll
      for (int q = 0; q < C::KT; ++q) {
        bulk_copy(st + (C::A_STAGE + q * C::STRIPS * 32) * 16, b + q * static_cast<int64_t>(b_row), C::STRIPS * 512,
                  bar);
      }
      if (GROUPED) {
        const int4* s = p.s + static_cast<int64_t>((at.kt * C::KT) >> p.lg_group) * s_row + at.col * C::STRIPS * 8;
        for (int r = 0; r < s_rows; ++r) {
          bulk_copy(st + (C::A_STAGE + C::B_STAGE + r * C::STRIPS * 8) * 16, s + r * s_row, C::STRIPS * 128, bar);
        }
      }
      slot.next();
    }
  };
  ws_kernel<C, DenseCols<C>, GROUPED, C::NS>(p, 1, copy, [&](int tid) {
    const WarpWords<C> w(tid);
    return [&p, w](uint32_t st, float (&acc)[C::NS][C::ACC]) {
      compute_scaled<C, GROUPED>(st, w, p.lg_group, acc);
    };
  });
#endif
}

// The driver's encoder is found once through the runtime (no link to the driver library).
cudaError_t a_tensor_map(const Params& p, int rows, CUtensorMap* map) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return cudaErrorNotSupported;
    }
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(p.k), static_cast<cuuint64_t>(p.m)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(p.k) * 2};  // bytes from one row to the next
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(rows)};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<int4*>(p.a), dims, strides, box, unit,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <class C>
cudaError_t launch_rows(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  return launch_gemm<RegisterParts<C, DenseCols<C>, C::NS>, false, gemm_sm90_kernel<C, true>,
                     gemm_sm90_kernel<C, false>>(grouped, p, grid, C::THREADS, C::SMEM, device, stream);
}

template <class C>
cudaError_t launch_ws(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  CUtensorMap map = {};
  if (const cudaError_t err = a_tensor_map(p, C::R, &map); err != cudaSuccess) return err;
  return launch_gemm<RegisterParts<C, DenseCols<C>, C::NS>, true, gemm_sm90_ws_kernel<C, true>,
                     gemm_sm90_ws_kernel<C, false>>(grouped, p, grid, C::BLOCK_THREADS, C::SMEM, device, stream, map);
}

cudaError_t launch_sm90(const Sm90Tile& tile, int blocks_per_sm, bool grouped, const Params& p, int grid, int device,
                        cudaStream_t stream) {
  switch (tile.rows) {
    case 16:
      if (tile.cols == 256) return launch_rows<Sm90Cfg<16>>(grouped, p, grid, device, stream);
      return blocks_per_sm == 3 ? launch_rows<Sm90Cfg<16, 128, 3>>(grouped, p, grid, device, stream)
                                : launch_rows<Sm90Cfg<16, 128>>(grouped, p, grid, device, stream);
    case 32:
      return tile.cols == 256 ? launch_rows<Sm90Cfg<32>>(grouped, p, grid, device, stream)
                              : launch_rows<Sm90Cfg<32, 128>>(grouped, p, grid, device, stream);
    case 64:
      if (tile.cols == 512) return launch_ws<Sm90WsCfg<64, 512>>(grouped, p, grid, device, stream);
      return tile.cols == 256 ? launch_ws<Sm90WsCfg<64, 256>>(grouped, p, grid, device, stream)
                              : launch_ws<Sm90WsCfg<64, 128>>(grouped, p, grid, device, stream);
    case 96:
      return tile.cols == 256 ? launch_ws<Sm90WsCfg<96, 256>>(grouped, p, grid, device, stream)
                              : launch_ws<Sm90WsCfg<96, 128>>(grouped, p, grid, device, stream);
    case 128:
      return tile.cols == 256 ? launch_ws<Sm90WsCfg<128, 256>>(grouped, p, grid, device, stream)
                              : launch_ws<Sm90WsCfg<128, 128>>(grouped, p, grid, device, stream);
    default:
      return launch_ws<Sm90WsCfg<256, 128>>(grouped, p, grid, device, stream);
  }
}

}  // namespace detail
}  // namespace marlin_cli
