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

// A column strip whose parts a block adds up after its run (finish_registers, add_deferred); a run has at most two
// partial strips, its first and its last.
struct Deferred {
  int col, bid_lo, bid_hi;
};

// The end of a run inside column strip `col` for a tile in registers, acc[j] being the j-th wgmma's 64-column tile
// (ACC floats per thread): the whole strip goes straight to C through store_c(col, -1); a part is saved to its
// workspace slot in register order (float4 v of tile j at (j * ACC / 4 + v) * THREADS + tid). The block that
// completes a strip's count (finish_strip) does not add the parts here, inside the main loop, but records the strip
// in `deferred` (thread 0; n_deferred counts in every thread) for add_deferred after the loop, where registers are
// free to keep many parts' loads in flight.
template <int THREADS, int J, int ACC, class StoreC>
__device__ __forceinline__ void finish_registers(const Params& p, const Run& run, int& s_last, Deferred* deferred,
                                                 int& n_deferred, int col, int seg_begin, int seg_end,
                                                 float (&acc)[J][ACC], StoreC&& store_c) {
  const int tid = threadIdx.x;
  wgmma_wait<0>();
  auto save = [&](float* mine) {
    float4* dst = reinterpret_cast<float4*>(mine);
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < ACC / 4; ++v) {
        dst[(j * ACC / 4 + v) * THREADS + tid] =
            make_float4(acc[j][4 * v], acc[j][4 * v + 1], acc[j][4 * v + 2], acc[j][4 * v + 3]);
      }
  };
  auto defer = [&](auto&&, int bid_lo, int bid_hi) {
    if (tid == 0) deferred[n_deferred] = Deferred{col, bid_lo, bid_hi};
    ++n_deferred;
  };
  finish_strip(p.partials, kMaxTileElems, run.chunk * p.blocks_per_chunk, p.counters + run.chunk * run.n_cols + col,
               s_last, run.bid, run.iters, col * run.k_tiles, (col + 1) * run.k_tiles, seg_begin, seg_end,
               [&] { store_c(col, -1); }, save, defer);
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < ACC; ++e) acc[j][e] = 0.f;
}

// After the run: the strips finish_registers deferred, each part added in block order (as finish_strip requires)
// one wgmma tile at a time, with 128 floats per thread of parts' loads issued at once (they are L2 round trips:
// summing inside the loop with 8 loads in flight made the last block's sums as long as the rest of the run on short
// layers), each tile staged by store_c(col, j) in the now idle ring and the strip written out by copy_c(col)
// (perf-log).
template <int THREADS, int J, int ACC, class StoreC, class CopyC>
__device__ __forceinline__ void add_deferred(const Params& p, const Run& run, const Deferred* deferred, int n_deferred,
                                             float (&acc)[J][ACC], StoreC&& store_c, CopyC&& copy_c) {
  constexpr int kInFlight = 128 / ACC;
  if (n_deferred == 0) return;
  __syncthreads();  // thread 0's records are visible
  const int tid = threadIdx.x;
#pragma unroll 1
  for (int d = 0; d < n_deferred; ++d) {
    const Deferred r = deferred[d];
    auto part = [&](int b, int j) {
      return reinterpret_cast<const float4*>(part_slot(p.partials, kMaxTileElems, run.chunk * p.blocks_per_chunk,
                                                       run.iters, r.col * run.k_tiles, b)) +
             j * ACC / 4 * THREADS + tid;
    };
#pragma unroll
    for (int j = 0; j < J; ++j) {
#pragma unroll
      for (int e = 0; e < ACC; ++e) acc[j][e] = 0.f;
#pragma unroll 1
      for (int b = r.bid_lo; b <= r.bid_hi; b += kInFlight) {
        float4 x[kInFlight][ACC / 4];
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          if (b + i > r.bid_hi) continue;
          const float4* src = part(b + i, j);
#pragma unroll
          for (int v = 0; v < ACC / 4; ++v) x[i][v] = __ldcg(src + v * THREADS);
        }
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) {
          if (b + i > r.bid_hi) continue;
#pragma unroll
          for (int v = 0; v < ACC / 4; ++v) {
            acc[j][4 * v] += x[i][v].x, acc[j][4 * v + 1] += x[i][v].y;
            acc[j][4 * v + 2] += x[i][v].z, acc[j][4 * v + 3] += x[i][v].w;
          }
        }
      }
      store_c(r.col, j);
    }
    __syncthreads();  // the strip is staged
    copy_c(r.col);
    __syncthreads();  // ... and copied out before the next one is staged
  }
}

// An R x (64 J) tile in registers as fp16, wgmma tile `tile` of it or all (-1; a constant after inlining), into rows
// `stride` halves apart from dst (C, or a staging tile in shared memory): element 4i + e of tile j (this thread) is
// row 8i + 2(lane % 4) + e % 2 and column col_of(j, e / 2) from dst, times scale_of(j, e / 2) (1 for grouped
// scales); rows from `rows` on are skipped. 2-byte stores, one row pointer at a time and the thread's columns at
// offsets that unrolling makes immediates.
template <int R, int J, int ACC, class ColOf, class ScaleOf>
__device__ __forceinline__ void store_registers(__half* dst, int stride, int rows, int tile, const float (&acc)[J][ACC],
                                                ColOf&& col_of, ScaleOf&& scale_of) {
  const int c2 = 2 * (threadIdx.x % 4);
  float sc[J][2];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[j][h] = tile < 0 || j == tile ? scale_of(j, h) : 0.f;
#pragma unroll
  for (int i = 0; i < R / 8; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * i + c2 + e;
      if (r >= rows) continue;
      __half* row = dst + static_cast<int64_t>(r) * stride;
#pragma unroll
      for (int j = 0; j < J; ++j) {
        if (tile >= 0 && j != tile) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) row[col_of(j, h)] = __float2half_rn(acc[j][4 * i + 2 * h + e] * sc[j][h]);
      }
    }
}

// The first `rows` rows of a staged R x W fp16 tile (kStageStride halves per row) to C at c (rows n halves apart),
// in 16-byte stores: each warp writes whole rows, where the register layout's stores scatter over 8 to 32 sectors.
constexpr int kStageStride = 256 + 8;  // the pad spreads the rows' 2-byte stores over the banks
template <int THREADS, int R, int W>
__device__ __forceinline__ void copy_staged(const __half* stage, __half* c, int n, int rows) {
  constexpr int kChunks = W / 8;  // 16-byte chunks per row
  static_assert(W <= 256, "the staging stride holds 256 columns");
#pragma unroll 4
  for (int e = threadIdx.x; e < R * kChunks; e += THREADS) {
    const int r = e / kChunks, q = e % kChunks;
    if (r >= rows) break;  // e grows with r
    *reinterpret_cast<int4*>(c + static_cast<int64_t>(r) * n + 8 * q) =
        *reinterpret_cast<const int4*>(stage + r * kStageStride + 8 * q);
  }
}

// The main loop and end of both wgmma kernels for config C: the ring loop over the run's tiles (load(st) copies a
// stage, ready() makes this thread's view of it visible to wgmma, compute(st) consumes it), the split-k finish of
// each column strip the run ends (finish_registers) and, after the loop, the strips it completes (add_deferred),
// staged in the idle ring. The accumulators go to C with the kernel's column map: this thread's columns of strip
// col are x0_of(col) + col_of(j, h) (tile j, accumulator half h), and with one group their scale is
// p.s[scale_index(column)].
template <class C, bool GROUPED, int J, class Load, class Ready, class Compute, class X0, class ColOf,
          class ScaleIndex>
__device__ __forceinline__ void wgmma_run(const Params& p, const Run& run, int4* smem, float (&acc)[J][C::ACC],
                                          Load&& load, Ready&& ready, Compute&& compute, X0&& x0_of, ColOf&& col_of,
                                          ScaleIndex&& scale_index) {
  __shared__ int s_last;
  __shared__ Deferred s_deferred[2];
  int n_deferred = 0;
  const uint32_t ring = (smem_addr(smem) + 1023) & ~1023u;  // stages start on 1024-byte swizzle atoms
  __half* const stage = reinterpret_cast<__half*>(smem) + (ring - smem_addr(smem)) / 2;
  static_assert(C::R * kStageStride * 2 <= C::STAGES * C::STAGE * 16, "the staging tile fits in the ring");
  __half* const c_g = reinterpret_cast<__half*>(p.c) + static_cast<int64_t>(run.chunk) * C::R * p.n;

  // straight to C (a whole strip inside the run) or into the staging tile (after the run)
  auto store_c = [&](int col, int tile, bool staged) {
    const int x0 = x0_of(col);
    store_registers<C::R>(
        staged ? stage + (x0 - col * C::W) : c_g + x0, staged ? kStageStride : p.n, staged ? C::R : run.m_rows, tile,
        acc, col_of, [&](int j, int h) {
          return GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[scale_index(x0 + col_of(j, h))]);
        });
  };
  auto finish = [&](int col, int seg_begin, int seg_end) {
    finish_registers<C::THREADS>(p, run, s_last, s_deferred, n_deferred, col, seg_begin, seg_end, acc,
                                 [&](int c, int tile) { store_c(c, tile, false); });
  };
  pipeline<C::STAGES, C::STAGE * 16>(run, ring, p.early_dependents, load, ready, compute, finish);
  wgmma_wait<0>();
  add_deferred<C::THREADS>(
      p, run, s_deferred, n_deferred, acc, [&](int col, int j) { store_c(col, j, true); },
      [&](int col) { copy_staged<C::THREADS, C::R, C::W>(stage, c_g + col * C::W, p.n, run.m_rows); });
}

#endif

}  // namespace detail
}  // namespace marlin_cli
