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
#include "marlin_kernel.cuh"

namespace marlin_cli {
namespace detail {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor of the A tile for wgmma: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart.
// Advancing along k by 16 elements adds 32 bytes, i.e. 2 to the descriptor.
__device__ __forceinline__ uint64_t a_desc(uint32_t addr) {
  constexpr uint64_t kSbo = 1024 >> 4, kLbo = 1, kSwizzle128 = 1;
  return ((addr & 0x3ffff) >> 4) | (kLbo << 16) | (kSbo << 32) | (kSwizzle128 << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d (64 x 64, fp32) += a (64 x 16 from registers) @ tile (16 x 64 from shared memory, K-major).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

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
  __shared__ int s_last;

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp = tid / 32;  // = the 64-column strip this warp's weights come from

  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, 16 * C::KT, p.blocks_per_chunk, run)) return;
  const int chunk = run.chunk, m_rows = run.m_rows, k_tiles = run.k_tiles;

  const int4* a_g = p.a + static_cast<int64_t>(chunk) * C::R * (p.k / 8);
  __half* c_g = reinterpret_cast<__half*>(p.c) + static_cast<int64_t>(chunk) * C::R * p.n;
  StageLoader<C, GROUPED> loader(p, a_g, m_rows, run.t_begin, k_tiles);

  const uint32_t b_off = (C::A_STAGE + warp * 32 + lane) * 16;
  const uint32_t s_off = (C::A_STAGE + C::B_STAGE + warp * 8 + lane / 4) * 16;

  // acc[j]: the j-th wgmma's 64 x 64 tile. Its element 4i + e of this thread is output column
  // 64 * warp + 16j + 8(e / 2) + lane / 4 of the strip, row 8i + 2(lane % 4) + e % 2 of the chunk.
  float acc[4][C::ACC];
  auto zero_acc = [&] {
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;
  };
  zero_acc();

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

  // C from the accumulators (scaled per channel when there is one group): 2-byte stores, one row pointer at a time
  // and the thread's 8 columns at immediate offsets from it.
  auto store_c = [&](int col) {
    const int g = lane / 4, c2 = 2 * (lane % 4);
    const int x0 = col * C::W + warp * 64 + g;  // + 16j + 8h
    float sc[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc[j][h] = GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[scale_pos(x0 + 16 * j + 8 * h)]);
      }
#pragma unroll
    for (int i = 0; i < C::R / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 8 * i + c2 + e;
        if (r >= m_rows) continue;
        __half* row = c_g + static_cast<int64_t>(r) * p.n + x0;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) row[16 * j + 8 * h] = __float2half_rn(acc[j][4 * i + 2 * h + e] * sc[j][h]);
      }
  };
  // Partials in register order: float4 v of wgmma j is at (j * ACC / 4 + v) * THREADS + tid.
  auto save = [&](float* mine) {
    float4* dst = reinterpret_cast<float4*>(mine);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int v = 0; v < C::ACC / 4; ++v) {
        dst[(j * C::ACC / 4 + v) * C::THREADS + tid] =
            make_float4(acc[j][4 * v], acc[j][4 * v + 1], acc[j][4 * v + 2], acc[j][4 * v + 3]);
      }
  };
  auto finish = [&](int col, int seg_begin, int seg_end) {
    wgmma_wait<0>();
    auto reduce = [&](auto&& slot, int bid_lo, int bid_hi) {
      zero_acc();
      // one wgmma tile at a time, so that only its 8 loads per part are in flight (registers are scarce here)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll 1
        for (int b = bid_lo; b <= bid_hi; ++b) {
          const float4* src = reinterpret_cast<const float4*>(slot(b)) + j * C::ACC / 4 * C::THREADS + tid;
#pragma unroll
          for (int v = 0; v < C::ACC / 4; ++v) {
            const float4 x = __ldcg(src + v * C::THREADS);
            acc[j][4 * v] += x.x, acc[j][4 * v + 1] += x.y, acc[j][4 * v + 2] += x.z, acc[j][4 * v + 3] += x.w;
          }
        }
      }
      store_c(col);
    };
    finish_strip(p.partials, kMaxTileElems, chunk * p.blocks_per_chunk, p.counters + chunk * run.n_cols + col,
                 s_last, run.bid, run.iters, col * k_tiles, (col + 1) * k_tiles, seg_begin, seg_end,
                 [&] { store_c(col); }, save, reduce);
    zero_acc();
  };

  // --- main loop: the sm_80 kernel's, with the landed stage made visible to wgmma ----------------------------
  pipeline<C::STAGES, C::STAGE * 16>(
      run, (smem_addr(smem) + 1023) & ~1023u, p.early_dependents, [&](uint32_t st) { loader.load(st); },
      fence_proxy_async, compute_stage, finish);
  wgmma_wait<0>();
#endif
}

cudaError_t launch_sm90(bool grouped, const Params& p, int grid, int device, cudaStream_t stream) {
  static bool ready[2][kMaxDevices] = {};  // the opt-in shared-memory size is set once per kernel and device
  auto kernel = grouped ? gemm_sm90_kernel<true> : gemm_sm90_kernel<false>;
  if (!ready[grouped][device]) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Sm90Cfg::SMEM);
    if (err != cudaSuccess) return err;
    ready[grouped][device] = true;
  }
  return launch_kernel(kernel, grid, Sm90Cfg::THREADS, Sm90Cfg::SMEM, device, stream, p);
}

}  // namespace detail
}  // namespace marlin_cli
