// FP16 x INT4 GEMM on the MARLIN dense layout with Hopper's warpgroup MMA (wgmma), for m > 32 on sm_90a.
//
// mma.sync runs at about half of the H200's tensor rate, which caps the sm_80 kernel (marlin_kernel.cuh) below
// cuBLAS from m = 64 on. Here the roles are transposed: C^T (n, m) = dequant(B)^T (n, k) @ A^T (k, m), so the
// dequantized weights are wgmma's register operand (m64 = 64 output columns per instruction) and the activations
// its shared-memory operand (n = 64 rows of A, the 128-byte-swizzled tile the stage loader already writes).
//
// The layout makes this free: a lane's packed word j of a 64-column strip dequantizes to the B fragments of the
// strip's n8 sub-tiles 2j and 2j + 1 (DESIGN.md 3.1), which are exactly the rows g and g + 8 of an m16k16 register
// fragment. Warp w of the warpgroup reads its own 16 bytes of strip w (as in the sm_80 kernel) and feeds word j to
// the j-th wgmma, whose 64 rows are therefore columns {strip w, sub-tiles 2j, 2j + 1} for w = 0..3: four wgmma per
// k16 tile cover the block's 256 columns, and the accumulators map back to columns when C is written.
//
// Everything else is the sm_80 kernel's: the striped partition, the StageLoader, the split-k protocol
// (finish_strip; partials are saved straight from the registers), chunks of 64 rows side by side for larger m.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c kernels/marlin_sm90.cu
// (for other targets the kernel body is empty and the host never launches it).
#include "wgmma.cuh"

namespace marlin_cli {
namespace detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Position of output column x in a per-channel scale row (3.1 step 4: within 32 columns, column 8q + 2i + b sits
// at 8i + 2q + b).
__device__ __forceinline__ int scale_pos(int x) {
  const int r = x & 31;
  return (x & ~31) + 8 * ((r & 7) >> 1) + 2 * (r >> 3) + (r & 1);
}

#endif

template <bool GROUPED>
__global__ void __launch_bounds__(Sm90Cfg::THREADS, 2) gemm_sm90_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Sm90Cfg;
  extern __shared__ int4 smem[];

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;  // = the 64-column strip this warp's weights come from

  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, 16 * C::KT, p.blocks_per_chunk, run)) return;

  const int4* a_g = p.a + static_cast<int64_t>(run.chunk) * C::R * (p.k / 8);
  StageLoader<C, GROUPED> loader(p, a_g, run.m_rows, run.t_begin, run.k_tiles);

  const uint32_t b_off = (C::A_STAGE + warp * 32 + lane) * 16;
  const uint32_t s_off = (C::A_STAGE + C::B_STAGE + warp * 8 + lane / 4) * 16;

  // acc[j]: the j-th wgmma's 64 x 64 tile. Its element 4i + e of this thread is output column
  // 64 * warp + 16j + 8(e / 2) + lane / 4 of the strip, row 8i + 2(lane % 4) + e % 2 of the chunk.
  float acc[4][C::ACC];
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;

  auto compute_stage = [&](uint32_t st) {
    const uint64_t desc = a_desc(st);
#pragma unroll
    for (int q = 0; q < C::KT; ++q) {
      const int4 bq = lds128(st + b_off + q * C::NS * 32 * 16);
      const uint32_t bw[4] = {static_cast<uint32_t>(bq.x), static_cast<uint32_t>(bq.y),
                              static_cast<uint32_t>(bq.z), static_cast<uint32_t>(bq.w)};
      int4 sc = make_int4(0, 0, 0, 0);
      if (GROUPED) sc = lds128(st + s_off + ((q >> p.lg_group) * C::NS * 8 * 16));
      const uint32_t sw[4] = {static_cast<uint32_t>(sc.x), static_cast<uint32_t>(sc.y),
                              static_cast<uint32_t>(sc.z), static_cast<uint32_t>(sc.w)};
      uint32_t a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t f0[2], f1[2];
        dequant_scaled<GROUPED>(bw[j], sw[j], f0, f1);
        a[j][0] = f0[0];  // rows g: sub-tile 2j, k 2c..2c+1
        a[j][1] = f1[0];  // rows g + 8: sub-tile 2j + 1
        a[j][2] = f0[1];  // k + 8
        a[j][3] = f1[1];
      }
      wgmma_fence();  // the fragments (and, after a finish, the zeroed accumulators) are written
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64n64k16(acc[j], a[j], desc + 2 * q);
      wgmma_commit();
      // Within a stage, wait for the previous k16 tile's wgmma only (their fragment registers are reused next).
      // At the end of a stage, wait for all: ptxas may move accumulators at the loop's back edge.
      if (q + 1 < C::KT) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
    }
  };

  // output columns: 64 warp + 16j + 8h + lane / 4 of the strip; per-channel scales permuted (scale_pos)
  wgmma_run<C, GROUPED>(
      p, run, smem, acc, [&](uint32_t st) { loader.load(st); }, compute_stage,
      [&](int col) { return col * C::W + warp * 64 + lane / 4; }, [](int j, int h) { return 16 * j + 8 * h; },
      scale_pos);
#endif
}

cudaError_t launch_sm90(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  static bool ready[2][kMaxDevices] = {};
  return launch_opt_in(grouped ? gemm_sm90_kernel<true> : gemm_sm90_kernel<false>, ready[grouped][device], grid,
                       Sm90Cfg::THREADS, Sm90Cfg::SMEM, device, stream, p);
}

}  // namespace detail
}  // namespace marlin_cli
