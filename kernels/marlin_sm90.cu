// FP16 x INT4 GEMM on the MARLIN dense layout with Hopper's warpgroup MMA (wgmma), for m > 8 on sm_90a.
//
// mma.sync runs at about half of the H200's tensor rate, which caps the sm_80 kernel (marlin_kernel.cuh) below
// cuBLAS from m = 64 on. Here the roles are transposed: C^T (n, m) = dequant(B)^T (n, k) @ A^T (k, m), so the
// dequantized weights are wgmma's register operand (m64 = 64 output columns per instruction) and the activations
// its shared-memory operand (n = 64 rows of A, the 128-byte-swizzled tile the stage loader already writes).
//
// The layout makes this free: a lane's packed word j of a 64-column strip dequantizes to the B fragments of the
// strip's n8 sub-tiles 2j and 2j + 1 (DESIGN.md 3.1), which are exactly the rows g and g + 8 of an m16k16 register
// fragment. With 64-row chunks (64 x 256 tiles) warp w of the warpgroup reads its own 16 bytes of strip w (as in the
// sm_80 kernel) and feeds word j to the j-th wgmma, whose 64 rows are therefore columns {strip w, sub-tiles 2j,
// 2j + 1} for w = 0..3: four m64n64k16 per k16 tile cover the block's 256 columns. With 128-column tiles warps 2s
// and 2s + 1 share strip s, each taking 8 of its lane's 16 bytes (words 2(w % 2) + j), and two wgmma per k16 tile
// cover the 128 columns: with 128-row chunks (128 x 128 tiles, m > 64) two m64n128k16, the same accumulators and
// half the dequantization per product; with 64-row chunks on layers too narrow for 256-column tiles to fill the
// GPU (64 x 128 tiles) two m64n64k16. In all the accumulators map back to columns when C is written.
//
// With 16-row chunks (m = 9-16: m64n16k16, 8 accumulators per wgmma) the weights enter wgmma still offset, as the
// mma.sync kernel's 8-row chunks do: no subtract and no fp16 scaling per weight (5 instead of 13 instructions per
// packed word), one more wgmma of a constant tile per k16 tile for the offsets' product, and each stage's fp32 sums
// corrected and scaled once (compute_offset). Their stages are 128 deep, the A tile two 64-deep swizzle panels.
//
// With 128-row chunks a stage's A tile (128 rows x 64 k, 16 KB) comes by one tensor copy (TMA) that thread 0
// issues, landing in the 128-byte swizzle wgmma reads and counted on the ring slot's mbarrier; rows past m arrive
// as zeros. Copied by cp.async, 16 bytes per thread and instruction, it took a third of the run to issue (3-6%
// faster this way; the 8 KB tiles of 64-row chunks measured 2-5% slower with it: perf-log w5).
// The striped partition, the StageLoader (weights and scales) and chunks side by side for larger m are the sm_80
// kernel's; parts of split column strips are saved straight from the registers and added after the launch by
// add_parts_kernel (wgmma.cuh).
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c kernels/marlin_sm90.cu
// (for other targets the kernel body is empty and the host never launches it).
#include "wgmma.cuh"

#include <cuda.h>
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

template <class C, bool GROUPED>
__global__ void __launch_bounds__(C::THREADS, 2)
    gemm_sm90_kernel(const Params p, const __grid_constant__ CUtensorMap a_map) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int J = C::NS;  // wgmma per k16 tile, and packed words per lane per k16 tile
  extern __shared__ int4 smem[];

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;
  // this warp's weights: words [word0, word0 + J) of its lanes' 16 bytes of 64-column strip `strip`
  const int strip = warp_strip<C::NS>(warp), word0 = warp_word0<C::NS>(warp);

  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;

  const int4* a_g = p.a + static_cast<int64_t>(run.chunk) * C::R * (p.k / 8);
  StageLoader<C, GROUPED, !C::A_TMA> loader(p, a_g, run.m_rows, run.t_begin, run.k_tiles);

  // A_TMA: one mbarrier per ring slot, its A tile has landed. Slots are loaded and consumed in ring order, so a
  // stage's slot is a counter, and its barrier's phase flips each time round the ring.
  __shared__ alignas(8) uint64_t a_full[C::A_TMA ? C::STAGES : 1];
  const uint32_t bars = smem_addr(a_full);
  if (C::A_TMA) {
    if (tid == 0) {
#pragma unroll
      for (int s = 0; s < C::STAGES; ++s) mbar_init(bars + 8 * s);
      mbar_init_fence();
    }
    __syncthreads();
  }
  int ld_slot = 0, rd_slot = 0;
  uint32_t rd_phase = 0;
  auto load = [&](uint32_t st) {
    if (C::A_TMA) {
      if (tid == 0) {
        const uint32_t bar = bars + 8 * ld_slot;
        mbar_expect(bar, C::A_STAGE * 16);
        tma_load_2d(st, &a_map, loader.ld_kt * C::DEPTH, run.chunk * C::R, bar);
      }
      ld_slot = ld_slot + 1 == C::STAGES ? 0 : ld_slot + 1;
    }
    loader.load(st);
  };
  auto ready = [&] {
    if (C::A_TMA) {
      mbar_wait(bars + 8 * rd_slot, rd_phase);
      if (++rd_slot == C::STAGES) {
        rd_slot = 0;
        rd_phase ^= 1;
      }
    }
    fence_proxy_async();  // what came through cp.async is visible to wgmma
  };

  const uint32_t b_off = (C::A_STAGE + strip * 32 + lane) * 16 + 4 * word0;
  const uint32_t s_off = (C::A_STAGE + C::B_STAGE + strip * 8 + lane / 4) * 16 + 4 * word0;

  // acc[j]: the j-th wgmma's 64 x R tile (its columns: DenseCols). Element 4i + e of this thread is row
  // 8i + 2(lane % 4) + e % 2 of the chunk.
  float acc[J][C::ACC];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;

  // The packed words (and scales) of k16 tile q of the stage at st: each tile's are loaded before the wait for the
  // previous tile's wgmma, so the shared-memory latency hides behind it.
  auto lds_tile_words = [&](uint32_t st, int q, uint32_t (&bw)[J]) { lds_words(st + b_off + q * C::NS * 32 * 16, bw); };
  auto lds_tile = [&](uint32_t st, int q, uint32_t (&bw)[J], uint32_t (&sw)[J]) {
    lds_tile_words(st, q, bw);
    if (GROUPED) lds_words(st + s_off + ((q >> p.lg_group) * C::NS * 8 * 16), sw);
  };
  // Within a stage, wait for the previous k16 tile's wgmma only (their fragment registers are reused next). At the
  // end of a stage, wait for all: ptxas may move accumulators at the loop's back edge.
  auto wait_tile = [](int q) {
    if (q + 1 < C::KT) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
  };
  auto compute_scaled = [&](uint32_t st) {
    uint32_t bw[J], sw[J] = {};
    lds_tile(st, 0, bw, sw);
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
      if (q + 1 < C::KT) lds_tile(st, q + 1, bw, sw);
      wait_tile(q);
    }
  };
  // OFFSET: the weights enter wgmma as 1024 + q (k rows 0-7 of a k16 tile) and 64 + q (rows 8-15: nibbles<0x5400>),
  // so `raw` sums the stage's products with those offsets. One more wgmma per k16 tile, of a constant tile (-1032 on
  // rows 0-7, -72 on rows 8-15), sums the offsets' products, the same for every column (`base`). At the stage's
  // end each column's sums are corrected and scaled in fp32: acc += s (raw + base). The fp16 products are exact;
  // the fp32 sums are up to ~1000 times the result over the stage's 128 k, which costs ~10 of fp32's 24 bits (the
  // 8-row mma.sync chunks do the same over 16-32 k).
  auto compute_offset = [&](uint32_t st) {
    constexpr uint32_t kOffset[4] = {0xe408e408, 0xe408e408, 0xd480d480, 0xd480d480};  // -1032, -72
    uint32_t bw[J], sw[J] = {};
    lds_tile_words(st, 0, bw);
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
      if (q + 1 < C::KT) lds_tile_words(st, q + 1, bw);
      // a stage is one group of 128 or part of a longer one (smaller groups take the mma.sync kernel: sm90_tile)
      if (GROUPED && q + 1 == C::KT) lds_words(st + s_off, sw);
      wait_tile(q);
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
      float2 sv = make_float2(1.f, 1.f);  // the scales of rows g and g + 8 (columns of sub-tiles 2j, 2j + 1)
      if (GROUPED) sv = __half22float2(*reinterpret_cast<const __half2*>(&sw[j]));
#pragma unroll
      for (int e = 0; e < C::ACC; ++e) acc[j][e] += (e % 4 < 2 ? sv.x : sv.y) * (raw[j][e] + base[e]);
    }
  };
  auto compute_stage = [&](uint32_t st) {
    if constexpr (C::OFFSET) {
      compute_offset(st);
    } else {
      compute_scaled(st);
    }
  };

  wgmma_run<C, DenseCols<C>, GROUPED>(p, run, smem, acc, load, ready, compute_stage);
#endif
}

// This launch's A (p.m rows left from p.a, k columns, fp16) as a tensor map of 64 x rows boxes in the 128-byte
// swizzle; rows past p.m read as zeros. The driver's encoder is found once through the runtime (no link to the
// driver library).
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
  static_assert(!C::A_TMA || C::A_STAGE * 16 == 64 * 2 * C::R, "a stage's A tile is one 64 x R box");
  static bool ready[2][kMaxDevices] = {};
  CUtensorMap map = {};
  if (C::A_TMA) {
    if (const cudaError_t err = a_tensor_map(p, C::R, &map); err != cudaSuccess) return err;
  }
  using Parts = RegisterParts<C, DenseCols<C>, C::NS>;
  return launch_with_parts<Parts>(grouped, p, grid, device, stream, [&](const Params& q) {
    return launch_opt_in(grouped ? gemm_sm90_kernel<C, true> : gemm_sm90_kernel<C, false>, ready[grouped][device],
                         grid, C::THREADS, C::SMEM, device, stream, q, map);
  });
}

cudaError_t launch_sm90(const Sm90Tile& tile, bool grouped, const Params& p, int grid, int device,
                        cudaStream_t stream) {
  if (tile.rows == 16) {
    return tile.cols == 256 ? launch_rows<Sm90Cfg<16>>(grouped, p, grid, device, stream)
                            : launch_rows<Sm90Cfg<16, 128>>(grouped, p, grid, device, stream);
  }
  if (tile.rows == 128) return launch_rows<Sm90Cfg<128>>(grouped, p, grid, device, stream);
  return tile.cols == 256 ? launch_rows<Sm90Cfg<64>>(grouped, p, grid, device, stream)
                          : launch_rows<Sm90Cfg<64, 128>>(grouped, p, grid, device, stream);
}

}  // namespace detail
}  // namespace marlin_cli
