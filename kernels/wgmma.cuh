// Hopper warpgroup MMA (wgmma) pieces shared by the dense and the 2:4 wgmma kernels (marlin_sm90.cu,
// marlin24_sm90.cu): PTX wrappers, and their common main loop and end (wgmma_run): the split-k finish of a
// tile held in a warpgroup's registers, the parts added after the run, the C stores.
// Only compiled into code for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); for other targets this header adds nothing.
#pragma once

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
// An mbarrier that completes when `bytes` have landed through the bulk copies charged to it (one arrival).
__device__ __forceinline__ void mbar_init(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Returns once the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred done;\n"
      "wait:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The box of the 2-d tensor map at (x, y) (x: innermost) into shared memory at dst, charged to bar. Out-of-bounds
// elements land as zeros (and count as copied).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define MARLIN_WGMMA_D32_OF(X)                                                                                      \
  "+f"(X[0]), "+f"(X[1]), "+f"(X[2]), "+f"(X[3]), "+f"(X[4]), "+f"(X[5]), "+f"(X[6]), "+f"(X[7]), "+f"(X[8]),       \
      "+f"(X[9]), "+f"(X[10]), "+f"(X[11]), "+f"(X[12]), "+f"(X[13]), "+f"(X[14]), "+f"(X[15]), "+f"(X[16]),        \
      "+f"(X[17]), "+f"(X[18]), "+f"(X[19]), "+f"(X[20]), "+f"(X[21]), "+f"(X[22]), "+f"(X[23]), "+f"(X[24]),       \
      "+f"(X[25]), "+f"(X[26]), "+f"(X[27]), "+f"(X[28]), "+f"(X[29]), "+f"(X[30]), "+f"(X[31])
#define MARLIN_WGMMA_D32_LIST                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MARLIN_WGMMA_D64_LIST                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

// d (64 x N, fp32) += a (64 x 16 from registers) @ tile (16 x N from shared memory, K-major), N = 64 or 128.
template <int N>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (N == 64) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MARLIN_WGMMA_D32_LIST
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  } else {
    static_assert(N == 128, "n64 or n128");
    float* const lo = d;
    float* const hi = d + 32;
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MARLIN_WGMMA_D64_LIST
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(lo), MARLIN_WGMMA_D32_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  }
}

// d (64 x 64, fp32) += a (64 x 32, 2:4 sparse: 64 x 16 kept values from registers + one metadata word) @ tile
// (32 x 64 from shared memory, K-major). SEL: which two threads of each group of four supply the metadata (as in
// mma.sp m16n8k32, per warp of the warpgroup).
template <int SEL>
__device__ __forceinline__ void wgmma_sp_m64n64k32(float (&d)[32], const uint32_t (&a)[4], uint32_t meta,
                                                   uint64_t desc) {
  asm volatile("wgmma.mma_async.sp.sync.aligned.m64n64k32.f32.f16.f16 " MARLIN_WGMMA_D32_LIST
               ", {%32, %33, %34, %35}, %36, %37, %38, 1, 1, 1, 0;\n"
               : MARLIN_WGMMA_D32_OF(d)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
}

// J consecutive packed words from shared memory (one 16-, 8- or 4-byte load).
template <int J>
__device__ __forceinline__ void lds_words(uint32_t addr, uint32_t (&w)[J]) {
  if constexpr (J == 4) {
    const int4 v = lds128(addr);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (J == 2) {
    const uint2 v = lds64(addr);
    w[0] = v.x, w[1] = v.y;
  } else {
    w[0] = lds32(addr);
  }
}

// An empty asm that "changes" every accumulator: placed around a stage's wgmma it stops NVVM from copying
// accumulators between the instructions of a group, which makes ptxas serialize them (C7511).
template <int J, int ACC>
__device__ __forceinline__ void pin(float (&acc)[J][ACC]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < ACC; ++e) asm volatile("" : "+f"(acc[j][e])::"memory");
}

#undef MARLIN_WGMMA_D32_OF
#undef MARLIN_WGMMA_D64_LIST
#undef MARLIN_WGMMA_D32_LIST

// An R x (64 J) tile in registers as fp16 into C at c (the tile's first column of this thread's; rows n halves
// apart): element 4i + e of tile j (this thread) is row 8i + 2(lane % 4) + e % 2 and column Cols::of(j, e / 2) from
// c, times scale_of(j, e / 2) (1 for grouped scales); rows from `rows` on are skipped. 2-byte stores, one row
// pointer at a time and the thread's columns at offsets that unrolling makes immediates.
template <class Cols, int R, int J, int ACC, class ScaleOf>
__device__ __forceinline__ void store_registers(__half* c, int n, int rows, const float (&acc)[J][ACC],
                                                ScaleOf&& scale_of) {
  const int c2 = 2 * (threadIdx.x % 4);
  float sc[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[j][h] = scale_of(j, h);
#pragma unroll
  for (int i = 0; i < R / 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * i + c2 + e;
      if (r >= rows) continue;
      __half* row = c + static_cast<int64_t>(r) * n;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) row[Cols::of(j, h)] = __float2half_rn(acc[j][4 * i + 2 * h + e] * sc[j][h]);
    }
}

// The main loop and end of both wgmma kernels for config C: the ring loop over the run's tiles (load(st) copies a
// stage, ready() makes this thread's view of it visible to wgmma, compute(st) consumes it) and the end of each
// column strip the run reaches: a whole strip goes straight to C (columns by Cols), a part of one is saved to its
// workspace slot in register order (float4 v of tile j at (j * ACC / 4 + v) * THREADS + tid) for add_parts_kernel,
// which the host launches after this kernel when strips are split.
template <class C, class Cols, bool GROUPED, int J, class Load, class Ready, class Compute>
__device__ __forceinline__ void wgmma_run(const Params& p, const Run& run, int4* smem, float (&acc)[J][C::ACC],
                                          Load&& load, Ready&& ready, Compute&& compute) {
  const uint32_t ring = (smem_addr(smem) + 1023) & ~1023u;  // stages start on 1024-byte swizzle atoms
  __half* const c_g = reinterpret_cast<__half*>(p.c) + static_cast<int64_t>(run.chunk) * C::R * p.n;
  const int tid = threadIdx.x;
  auto finish = [&](int col, int seg_begin, int seg_end) {
    wgmma_wait<0>();
    const int strip_begin = col * run.k_tiles;
    if (seg_begin == strip_begin && seg_end == strip_begin + run.k_tiles) {
      const int x0 = Cols::x0(col, tid);
      store_registers<Cols, C::R>(c_g + x0, p.n, run.m_rows, acc, [&](int j, int h) {
        return GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[Cols::scale(x0 + Cols::of(j, h))]);
      });
    } else {
      float4* dst = reinterpret_cast<float4*>(part_slot(p.partials, kMaxTileElems, run.chunk * p.blocks_per_chunk,
                                                        run.iters, strip_begin, run.bid));
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int v = 0; v < C::ACC / 4; ++v) {
          dst[(j * C::ACC / 4 + v) * C::THREADS + tid] =
              make_float4(acc[j][4 * v], acc[j][4 * v + 1], acc[j][4 * v + 2], acc[j][4 * v + 3]);
        }
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;
  };
  pipeline<C::STAGES, C::STAGE * 16>(run, ring, p.early_dependents, load, ready, compute, finish);
}

#endif

// Whether a wgmma launch leaves column strips in parts: blocks take runs of `iters` of the n_cols * k_tiles tiles
// (plan_run), and a run boundary inside a strip splits it.
inline bool splits_strips(const Params& p, int n_cols, int k_tiles) {
  const int total = n_cols * k_tiles;
  const int iters = tiles_per_run(total, p.blocks_per_chunk);
  return iters < total && iters % k_tiles != 0;
}

// The split strips of a wgmma launch, added up after it on the same stream (it waits for the launch to complete).
// The parts of a strip are all there by then, so this spreads the sums over the whole GPU, where the block that
// completed a strip's count used to add them alone at one SM's L2 read rate (perf-log a1). Block (chunk, col, i)
// takes rows 8i .. 8i + 7 of strip col: its thread (j, t) adds float4 i of tile j of the GEMM's thread t over the
// strip's parts in block order (so results do not depend on timing), the sums meet as fp16 in shared memory and go
// to C in 16-byte row chunks. T: the GEMM's wgmma tiles per thread.
template <class C, class Cols, int T, bool GROUPED>
__global__ void __launch_bounds__(C::THREADS* T) add_parts_kernel(const Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kPad = 8;  // halves: spreads the rows' 2-byte stores over the banks
  __shared__ alignas(16) __half rows8[8][C::W + kPad];
  grid_dependency_wait();
  allow_dependents();  // the GEMM is done: the next kernel may take the SMs it left
  const int n_cols = p.n / C::W;
  const int i = blockIdx.x % (C::R / 8);
  const int col = blockIdx.x / (C::R / 8) % n_cols;
  const int chunk = blockIdx.x / (C::R / 8) / n_cols;
  const int rows = min(C::R, p.m - chunk * C::R) - 8 * i;  // rows of this band that exist
  const int k_tiles = p.k / C::DEPTH;
  const int iters = tiles_per_run(n_cols * k_tiles, p.blocks_per_chunk);
  const int strip_begin = col * k_tiles;
  const int bid_lo = strip_begin / iters, bid_hi = (strip_begin + k_tiles - 1) / iters;
  if (rows <= 0 || bid_lo == bid_hi) return;  // no rows, or the run that held the whole strip wrote it

  const int t = threadIdx.x % C::THREADS, j = threadIdx.x / C::THREADS;
  const int64_t at = (j * C::ACC / 4 + i) * C::THREADS + t;
  const int first_block = chunk * p.blocks_per_chunk;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr int kInFlight = 8;
  for (int b0 = bid_lo; b0 <= bid_hi; b0 += kInFlight) {
    float4 x[kInFlight];
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (b0 + q <= bid_hi) {
        x[q] = __ldcg(reinterpret_cast<const float4*>(
                          part_slot(p.partials, kMaxTileElems, first_block, iters, strip_begin, b0 + q)) +
                      at);
      }
    }
#pragma unroll
    for (int q = 0; q < kInFlight; ++q) {
      if (b0 + q <= bid_hi) v[0] += x[q].x, v[1] += x[q].y, v[2] += x[q].z, v[3] += x[q].w;
    }
  }
  // element e: row 2(t % 4) + e % 2 of the band, column Cols::of(j, e / 2) from the thread's first
  const int x0 = Cols::x0(col, t);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int x = x0 + Cols::of(j, e / 2);
    const float s = GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[Cols::scale(x)]);
    rows8[2 * (t % 4) + e % 2][x - col * C::W] = __float2half_rn(v[e] * s);
  }
  __syncthreads();
  __half* const c = reinterpret_cast<__half*>(p.c) + (static_cast<int64_t>(chunk) * C::R + 8 * i) * p.n + col * C::W;
  for (int e = threadIdx.x; e < 8 * (C::W / 8); e += C::THREADS * T) {
    const int r = e / (C::W / 8), q = e % (C::W / 8);
    if (r < rows) {
      *reinterpret_cast<int4*>(c + static_cast<int64_t>(r) * p.n + 8 * q) =
          *reinterpret_cast<const int4*>(&rows8[r][8 * q]);
    }
  }
#endif
}

// A wgmma GEMM of `grid` blocks for config C, started by launch(q), and add_parts_kernel after it when the launch
// leaves strips in parts; q is p (the kernel's Params, a 2:4 one included) with the early start of the next kernel
// on in that case, since add_parts_kernel's blocks may wait beside the GEMM's.
template <class C, class Cols, int T, class P, class Launch>
cudaError_t launch_with_parts(bool grouped, const P& p, int grid, int device, cudaStream_t stream, Launch&& launch) {
  const int n_cols = p.n / C::W;
  const bool split = splits_strips(p, n_cols, p.k / C::DEPTH);
  P q = p;
  q.early_dependents |= split;
  if (const cudaError_t err = launch(q); err != cudaSuccess || !split) return err;
  const int blocks = grid / p.blocks_per_chunk * n_cols * (C::R / 8);
  return launch_kernel(grouped ? add_parts_kernel<C, Cols, T, true> : add_parts_kernel<C, Cols, T, false>, blocks,
                       C::THREADS * T, 0, device, stream, static_cast<const Params&>(p));
}

}  // namespace detail
}  // namespace marlin_cli
