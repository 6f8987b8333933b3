// Hopper warpgroup MMA (wgmma) pieces shared by the dense and the 2:4 wgmma kernels (marlin_sm90.cu,
// marlin24_sm90.cu): PTX wrappers, the end of a column strip (wgmma_finish: a whole strip to C, a part of one saved
// from the registers), the one-warpgroup kernels' main loop (wgmma_run), the warp-specialized kernels' ring and
// skeleton (ws_kernel) and RegisterParts, the parts' layout for add_parts_kernel.
// Only compiled into code for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); for other targets this header adds nothing.
#pragma once

#include <cuda.h>

#include "marlin_kernel.cuh"

namespace marlin_cli {
namespace detail {

// This launch's A (p.m rows left from p.a, k columns, fp16) as a tensor map of 64 x rows boxes in the 128-byte
// swizzle, the A tile of the warp-specialized kernels' stages; rows past p.m read as zeros (marlin_sm90.cu).
cudaError_t a_tensor_map(const Params& p, int rows, CUtensorMap* map);

// The part of a warpgroup's NS strips (the layout's 64-column dense ones, or 128-column 2:4 ones) that warp w takes:
// strip w NS / 4 and, of each of its lanes' 16-byte chunks, NS words from word0 (with four strips a warp takes a
// whole one; with fewer, 4 / NS warps share a strip). Warps 4-7 of a second warpgroup take the next NS strips.
template <int NS>
__device__ __forceinline__ int warp_strip(int w) { return w * NS / 4; }
template <int NS>
__device__ __forceinline__ int warp_word0(int w) { return w % (4 / NS) * NS; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor of the A tile for wgmma: K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart.
// Advancing along k by 16 elements adds 32 bytes, i.e. 2 to the descriptor.
__device__ __forceinline__ uint64_t a_desc(uint32_t addr) {
  constexpr uint64_t kSbo = 1024 >> 4, kLbo = 1, kSwizzle128 = 1;
  return ((addr & 0x3ffff) >> 4) | (kLbo << 16) | (kSbo << 32) | (kSwizzle128 << 62);
}

// The A operand at k16 tile q of a stage whose A tile is 64-deep swizzle panels of `rows` rows (a_panel_chunk):
// 32 bytes per k16 tile into panel q / 4.
__device__ __forceinline__ uint64_t a_panel_desc(uint32_t st, int rows, int q) {
  return a_desc(st) + (q / 4) * (rows * 128 >> 4) + 2 * (q % 4);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// After the group of k16 (2:4: k32) tile q of a stage of KT: wait until the last L groups only are in flight (L = 1:
// the previous tile's fragment registers are reused next); after the stage's last, for all of them (DRAIN: ptxas may
// move accumulators at a ring loop's back edge), or leave the last L + 1 in flight.
template <int KT, bool DRAIN = true, int L = 1>
__device__ __forceinline__ void wgmma_wait_tile(int q) {
  if (q + 1 < KT) {
    wgmma_wait<L>();
  } else if (DRAIN) {
    wgmma_wait<0>();
  }
}
// An mbarrier whose phase completes after `count` arrivals and, with mbar_expect, once the bytes it expects have landed
// through the bulk copies charged to it.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// An arrival on bar once every cp.async this thread has issued so far has landed (counted in mbar_init's count).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
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

// This warpgroup's registers per thread from here on (warp-specialized kernels: the copying warpgroup gives registers
// back, the computing ones take them).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// `bytes` (a multiple of 16) from global src to shared dst, charged to bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// x, which is the same in all lanes of the warp, as ptxas can tell: read from lane 0. Offsets of a warpgroup's
// wgmma operands computed from the thread index otherwise stay in ordinary registers and are copied into uniform ones
// at every wgmma (R2UR; perf-log o5).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// Barrier of the 128 threads of computing warpgroup wg (named barriers 1 and 2; 0 is __syncthreads). A register id
// (ptxas then reserves all 16 of the block's barriers): a branch between immediate ids in a strip's end made ptxas
// keep the stage loop's wgmma operand offsets out of the uniform registers (perf-log o5).
__device__ __forceinline__ void warpgroup_sync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define MARLIN_WGMMA_D8_OF(X) \
  "+f"(X[0]), "+f"(X[1]), "+f"(X[2]), "+f"(X[3]), "+f"(X[4]), "+f"(X[5]), "+f"(X[6]), "+f"(X[7])
#define MARLIN_WGMMA_D16_OF(X)                                                                                      \
  "+f"(X[0]), "+f"(X[1]), "+f"(X[2]), "+f"(X[3]), "+f"(X[4]), "+f"(X[5]), "+f"(X[6]), "+f"(X[7]), "+f"(X[8]),       \
      "+f"(X[9]), "+f"(X[10]), "+f"(X[11]), "+f"(X[12]), "+f"(X[13]), "+f"(X[14]), "+f"(X[15])
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

#define MARLIN_WGMMA_D24_LIST \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}"

#define MARLIN_WGMMA_D48_LIST \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47}"

#define MARLIN_WGMMA_D128_LIST \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, " \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
  "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, " \
  "%100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, " \
  "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"

// d (64 x N, fp32) = a (64 x 16 from registers) @ tile (16 x N from shared memory, K-major) + d (ADD) or + 0,
// N = 16, 32, 64, 96, 128 or 256.
template <int N, bool ADD = true>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (N == 16) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, %13, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D8_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  } else if constexpr (N == 32) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
                 "%11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, %21, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D16_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  } else if constexpr (N == 64) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MARLIN_WGMMA_D32_LIST
                 ", {%32, %33, %34, %35}, %36, %37, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  } else if constexpr (N == 96) {
    float* const lo = d;
    float* const hi = d + 32;
    asm volatile("wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 " MARLIN_WGMMA_D48_LIST
                 ", {%48, %49, %50, %51}, %52, %53, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(lo), MARLIN_WGMMA_D16_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  } else if constexpr (N == 256) {
    float* const q0 = d;
    float* const q1 = d + 32;
    float* const q2 = d + 64;
    float* const q3 = d + 96;
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " MARLIN_WGMMA_D128_LIST
                 ", {%128, %129, %130, %131}, %132, %133, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(q0), MARLIN_WGMMA_D32_OF(q1), MARLIN_WGMMA_D32_OF(q2), MARLIN_WGMMA_D32_OF(q3)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  } else {
    static_assert(N == 128, "n16, n32, n64, n96, n128 or n256");
    float* const lo = d;
    float* const hi = d + 32;
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MARLIN_WGMMA_D64_LIST
                 ", {%64, %65, %66, %67}, %68, %69, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(lo), MARLIN_WGMMA_D32_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(ADD ? 1 : 0));
  }
}

// d (64 x N, fp32) += a (64 x 32, 2:4 sparse: 64 x 16 kept values from registers + one metadata word) @ tile
// (32 x N from shared memory, K-major), N = 16, 32, 48, 64, 96 or 128. SEL: which two threads of each group of four
// supply the metadata (as in mma.sp m16n8k32, per warp of the warpgroup).
template <int N, int SEL>
__device__ __forceinline__ void wgmma_sp_m64k32(float (&d)[N / 2], const uint32_t (&a)[4], uint32_t meta,
                                                uint64_t desc) {
  if constexpr (N == 8) {
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n8k32.f32.f16.f16 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, %8, %9, %10, 1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else if constexpr (N == 16) {
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n16k32.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, %13, %14, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D8_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else if constexpr (N == 32) {
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n32k32.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, "
                 "%10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, %21, %22, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D16_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else if constexpr (N == 48) {
    float* const hi = d + 16;
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n48k32.f32.f16.f16 " MARLIN_WGMMA_D24_LIST
                 ", {%24, %25, %26, %27}, %28, %29, %30, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D16_OF(d), MARLIN_WGMMA_D8_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else if constexpr (N == 64) {
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n64k32.f32.f16.f16 " MARLIN_WGMMA_D32_LIST
                 ", {%32, %33, %34, %35}, %36, %37, %38, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else if constexpr (N == 96) {
    float* const hi = d + 32;
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n96k32.f32.f16.f16 " MARLIN_WGMMA_D48_LIST
                 ", {%48, %49, %50, %51}, %52, %53, %54, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(d), MARLIN_WGMMA_D16_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  } else {
    static_assert(N == 128, "n16, n32, n48, n64, n96 or n128");
    float* const lo = d;
    float* const hi = d + 32;
    asm volatile("wgmma.mma_async.sp.sync.aligned.m64n128k32.f32.f16.f16 " MARLIN_WGMMA_D64_LIST
                 ", {%64, %65, %66, %67}, %68, %69, %70, 1, 1, 1, 0;\n"
                 : MARLIN_WGMMA_D32_OF(lo), MARLIN_WGMMA_D32_OF(hi)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(meta), "n"(SEL));
  }
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

#undef MARLIN_WGMMA_D8_OF
#undef MARLIN_WGMMA_D16_OF
#undef MARLIN_WGMMA_D32_OF
#undef MARLIN_WGMMA_D24_LIST
#undef MARLIN_WGMMA_D48_LIST
#undef MARLIN_WGMMA_D64_LIST
#undef MARLIN_WGMMA_D32_LIST
#undef MARLIN_WGMMA_D128_LIST

// The ring's first byte: the dynamic shared memory rounded up to a 1024-byte swizzle atom, where stages start (every
// configuration's SMEM holds the room for it).
__device__ __forceinline__ uint32_t ring_start(const int4* smem) { return (smem_addr(smem) + 1023) & ~1023u; }

// Scales sc[j][h] = scale_of(j, h) of a thread's columns of tile j, read once before its rows are stored.
template <int J, class ScaleOf>
__device__ __forceinline__ void column_scales(float (&sc)[J][2], ScaleOf&& scale_of) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[j][h] = scale_of(j, h);
}

// An R x (64 J) tile in registers as fp16 into C at c (the tile's first column of this thread's; rows n halves
// apart): element 4i + e of tile j (this thread) is row 8i + 2(lane % 4) + e % 2 and column Cols::of(j, e / 2) from
// c, times scale_of(j, e / 2) (1 for grouped scales); rows from `rows` on are skipped. 2-byte stores, one row
// pointer at a time and the thread's columns at offsets that unrolling makes immediates.
template <class Cols, int R, int J, int ACC, class ScaleOf>
__device__ __forceinline__ void store_registers(__half* c, int n, int rows, const float (&acc)[J][ACC],
                                                ScaleOf&& scale_of) {
  const int c2 = 2 * (threadIdx.x % 4);
  float sc[J][2];
  column_scales(sc, scale_of);
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

// The barrier of a warp-specialized block's computing threads (named barrier 3).
template <int THREADS>
__device__ __forceinline__ void computing_sync() {
  asm volatile("bar.sync 3, %0;\n" ::"n"(THREADS) : "memory");
}

// As store_registers, through shared memory (configurations with C::C_ROWS, warp-specialized, whose computing
// threads all finish a strip together): in rounds of C_ROWS rows of the R x W tile at c (its first row and column),
// each thread puts its values of the round's rows into the staging area after the ring (x: its first column in the
// tile; rb: its row block of N rows), its two rows of a column (accumulators e = 0, 1: rows 2q and 2q + 1 of the
// round) as one word, at word Cols::staged(q, column) (W words a pair-row q, swizzled for the column map so that a
// warp's stores hit 32 banks; it must keep 4 aligned columns in one aligned 4-word group, their order XOR the first's
// word & 3); after a barrier each thread copies 8 columns of pair-rows out: two 16-byte shared loads, a 16-byte global
// store to each row.
// `rows` as in store_registers.
template <class C, class Cols, int N, int J, class ScaleOf>
__device__ __forceinline__ void store_staged(__half* c, int n, int rows, int x, int rb, const float (&acc)[J][C::ACC],
                                             ScaleOf&& scale_of) {
  extern __shared__ int4 smem[];
  const uint32_t staging = ring_start(smem + C::STAGES * C::STAGE);  // stages are whole 1024-byte atoms
  const int tid = threadIdx.x, c2 = 2 * (tid % 4);
  constexpr int L = C::W / 8, ITEMS = C::C_ROWS / 2 * L;  // 8-column pieces of a row, and of a round's pair-rows
  static_assert(ITEMS % C::THREADS == 0, "whole passes");
  float sc[J][2];
  column_scales(sc, scale_of);
#pragma unroll 1
  for (int r0 = 0; r0 < C::R && r0 < rows; r0 += C::C_ROWS) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {
      const int r = rb * N + 8 * i + c2 - r0;  // the pair's first row in the round
      if (r < 0 || r >= C::C_ROWS) continue;
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const __half2 v = __floats2half2_rn(acc[j][4 * i + 2 * h] * sc[j][h], acc[j][4 * i + 2 * h + 1] * sc[j][h]);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(staging + Cols::staged(r / 2, x + Cols::of(j, h)) * 4),
                       "r"(*reinterpret_cast<const uint32_t*>(&v))
                       : "memory");
        }
    }
    computing_sync<C::THREADS>();
    const int round_rows = min(C::C_ROWS, rows - r0);
    // not unrolled: unrolled, ptxas's registers in the 64 x 256 per-channel kernel's stage loop came out with a
    // metadata register rewritten 63 instructions after its wgmma.sp (check_meta_hazards; perf-log cs1)
#pragma unroll 1
    for (int it = 0; it < ITEMS / C::THREADS; ++it) {
      const int item = tid + it * C::THREADS, q = item / L, o = item % L;
      if (2 * q >= round_rows) break;
      const int at_lo = Cols::staged(q, 8 * o), at_hi = Cols::staged(q, 8 * o + 4);
      const int4 lo = lds128(staging + (at_lo & ~3) * 4), hi = lds128(staging + (at_hi & ~3) * 4);
      uint32_t w[8] = {uint32_t(lo.x), uint32_t(lo.y), uint32_t(lo.z), uint32_t(lo.w),
                       uint32_t(hi.x), uint32_t(hi.y), uint32_t(hi.z), uint32_t(hi.w)};
      // word p of a loaded group holds its column p ^ (at_lo & 3): the pairs' order in the byte permutes' selectors
      if (at_lo & 2) {
#pragma unroll
        for (int p : {0, 1, 4, 5}) {
          const uint32_t t = w[p];
          w[p] = w[p + 2], w[p + 2] = t;
        }
      }
      const uint32_t even = at_lo & 1 ? 0x1054 : 0x5410, odd = at_lo & 1 ? 0x3276 : 0x7632;  // rows 2q, 2q + 1
      __half* const row = c + static_cast<int64_t>(r0 + 2 * q) * n + 8 * o;
      *reinterpret_cast<uint4*>(row) = make_uint4(__byte_perm(w[0], w[1], even), __byte_perm(w[2], w[3], even),
                                                  __byte_perm(w[4], w[5], even), __byte_perm(w[6], w[7], even));
      if (2 * q + 1 < round_rows) {
        *reinterpret_cast<uint4*>(row + n) = make_uint4(__byte_perm(w[0], w[1], odd), __byte_perm(w[2], w[3], odd),
                                                        __byte_perm(w[4], w[5], odd), __byte_perm(w[6], w[7], odd));
      }
    }
    computing_sync<C::THREADS>();
  }
}

// A later part of a strip (OWN, below) is counted on `flag` once warpgroup tid / 128 has saved it (the barrier orders
// the warpgroup's stores before one thread's fence, which makes them visible device-wide before the count); the
// block holding the strip's first part waits for `parts` counts on its flag and returns it to zero.
__device__ __forceinline__ void count_part(int* flag, int tid) {
  warpgroup_sync(tid / 128);
  if (tid % 128 == 0) {
    __threadfence();
    atomicAdd(flag, 1);
  }
}
__device__ __forceinline__ void await_parts(int* flag, int parts, int tid) {
  if (tid % 128 == 0) {
    while (ld_acquire(flag) < parts) {
    }
    *flag = 0;  // for the next launch
  }
  warpgroup_sync(tid / 128);
}

// The end of the part of a run inside column strip col (tiles [seg_begin, seg_end)), once the strip's wgmma are done: a
// whole strip goes straight to C (columns by Cols), a part of one is saved to its workspace slot in register order
// (RegisterParts; rows past m skipped: add_parts_kernel reads none) for add_parts_kernel, which the host launches after
// the kernel when strips are split. Thread tid of the C::THREADS computing ones; the accumulators are zeroed for the
// next strip. A thread holds 2 C::ACC of the tile's C::R rows: all of them, or (RB = 2: the 2:4 kernel's 128 x 128
// tiles) those of its warpgroup's row block. OWN (warp-specialized kernels) with p.flags set: the blocks add the parts
// themselves. A strip's later parts are saved and counted on the flag of the block holding its first part (per
// warpgroup: thread tid's values are the same elements in every part); that block waits for the count, adds them to its
// registers in block order (the sums add_parts_kernel makes) and writes the strip to C.
template <class C, class Cols, bool GROUPED, int J, bool OWN = false>
__device__ __forceinline__ void wgmma_finish(const Params& p, const Run& run, int tid, float (&acc)[J][C::ACC], int col,
                                             int seg_begin, int seg_end) {
  constexpr int N = 2 * C::ACC, RB = C::R / N, TP = C::THREADS / RB;  // rows, row blocks, threads per row block
  const int rb = RB > 1 ? warp_uniform(tid / TP) : 0, t = RB > 1 ? tid % TP : tid;
  __half* const c_g = reinterpret_cast<__half*>(p.c) + (static_cast<int64_t>(run.chunk) * C::R + rb * N) * p.n;
  float* part = segment_part(p, run, C::R * C::W, col, seg_begin, seg_end);
  auto at = [&](int j, int v) { return (j * C::R / 8 + rb * N / 8 + v) * TP + t; };  // quad of a part
  const int wg = tid / 128, first_block = run.chunk * p.blocks_per_chunk, strip_begin = col * run.k_tiles;
  using Quad = PartQuad<kHalfParts<C>>;
  // quads of a part loaded before they are added
  constexpr int kBatch = C::ACC % 16 == 0 ? 4 : C::ACC % 8 == 0 ? 2 : 1;
  static_assert(!OWN || C::ACC % (4 * kBatch) == 0, "parts are added in whole batches");
  const bool own = OWN && part != nullptr && p.flags != nullptr;
  if (own && seg_begin == strip_begin) {
    const int bid_hi = (strip_begin + run.k_tiles - 1) / run.iters;
    await_parts(p.flags + kFlagsPerBlock * (first_block + run.bid) + wg, bid_hi - run.bid, tid);
    for (int b = run.bid + 1; b <= bid_hi; ++b) {
      const Quad* src = reinterpret_cast<const Quad*>(
          part_slot(p.partials, C::R * C::W, first_block, run.iters, strip_begin, b));
#pragma unroll
      for (int j = 0; j < J; ++j)
#pragma unroll
        for (int v0 = 0; v0 < C::ACC / 4; v0 += kBatch) {
          Quad x[kBatch];
#pragma unroll
          for (int v = 0; v < kBatch; ++v) x[v] = __ldcg(src + at(j, v0 + v));
#pragma unroll
          for (int v = 0; v < kBatch; ++v) add_quad(&acc[j][4 * (v0 + v)], x[v]);
        }
    }
    part = nullptr;
  }
  if (part == nullptr) {
    const int x0 = Cols::x0(col, t);
    auto scale_of = [&](int j, int h) {
      return GROUPED ? 1.f : __half2float(reinterpret_cast<const __half*>(p.s)[Cols::scale(x0 + Cols::of(j, h))]);
    };
    if constexpr (C::C_ROWS > 0) {
      __half* const tile = reinterpret_cast<__half*>(p.c) + static_cast<int64_t>(run.chunk) * C::R * p.n + col * C::W;
      store_staged<C, Cols, N>(tile, p.n, run.m_rows, x0 - col * C::W, rb, acc, scale_of);
    } else {
      store_registers<Cols, N>(c_g + x0, p.n, run.m_rows - rb * N, acc, scale_of);
    }
  } else {
    // quad v of a tile holds rows row0 + 8v and row0 + 8v + 1; those past m are not saved (the sums of the block
    // adding a strip's parts itself take whatever the slot holds there, and never store those rows)
    const int row0 = rb * N + 2 * (t % 4);
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int v = 0; v < C::ACC / 4; ++v) {
        if (row0 + 8 * v >= run.m_rows) continue;
        const float* a = &acc[j][4 * v];
        reinterpret_cast<Quad*>(part)[at(j, v)] = make_quad<Quad>(a[0], a[1], a[2], a[3]);
      }
    if (own) count_part(p.flags + kFlagsPerBlock * (first_block + strip_begin / run.iters) + wg, tid);
  }
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;
}

// The main loop and end of the wgmma kernels with one warpgroup per block for config C: the ring loop over the run's
// tiles (pipeline(): the loader copies stages, ready() makes this thread's view of one visible to wgmma, compute(st)
// consumes it) and wgmma_finish at the end of each column strip the run reaches.
template <class C, class Cols, bool GROUPED, int J, class Loader, class Ready, class Compute>
__device__ __forceinline__ void wgmma_run(const Params& p, const Run& run, int4* smem, float (&acc)[J][C::ACC],
                                          Loader& loader, Ready&& ready, Compute&& compute) {
  const uint32_t ring = ring_start(smem);
  auto finish = [&](int col, int seg_begin, int seg_end) {
    wgmma_wait<0>();
    wgmma_finish<C, Cols, GROUPED>(p, run, threadIdx.x, acc, col, seg_begin, seg_end);
  };
  pipeline<C::STAGES, C::STAGE * 16>(run, ring, p.early_dependents, loader_load(loader), ready, compute, finish);
}

// The warp-specialized kernels' ring (C: THREADS computing threads, then one copying warpgroup; C::STAGES slots of
// C::STAGE int4 from 1024-byte-aligned `ring`). Slot i has two mbarriers: full[i] completes when the slot's stage
// has landed (`full_count` arrivals, and the bytes that bulk and tensor copies charge to it), empty[i] when all
// computing threads are done with it (their wgmma retired). The copying side waits on empty before it refills a
// slot, the computing side on full before it reads one; after the barriers' set-up no block barrier.
struct WsRing {
  uint32_t ring, full0, empty0;
};

// A ring position: the slot and the parity of its barriers' current phase (it flips each time round the ring).
template <int STAGES>
struct RingPos {
  int slot = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void next() {
    if (++slot == STAGES) {
      slot = 0;
      phase ^= 1;
    }
  }
};

// A warp-specialized kernel for config C with J wgmma tiles of accumulators per computing thread. copy(run, ring)
// runs on every thread of the copying warpgroup, after it has given registers back, and waits for the previous kernel
// (grid_dependency_wait) before it copies anything that kernel may write; on the computing threads
// compute_for(tid) makes the per-stage function compute(st, acc), which retires all but at most its last wgmma group.
// Per tile of the run they wait for its stage, compute it, release the previous one's slot, and wgmma_finish at the
// end of each column strip the run reaches, adding split strips' parts there when the host set p.flags (own_parts();
// perf-log f3, s22; on the dense 128-row tiles since o6, whose stage loop the earlier form of warpgroup_sync, a branch
// between named barriers, had filled with R2UR, o5).
template <class C, class Cols, bool GROUPED, int J, class Copy, class ComputeFor>
__device__ __forceinline__ void ws_kernel(const Params& p, uint32_t full_count, Copy&& copy, ComputeFor&& compute_for) {
  extern __shared__ int4 smem[];
  __shared__ alignas(8) uint64_t full[C::STAGES], empty[C::STAGES];
  Run run;
  if (!plan_run(p.m, p.n, p.k, C::R, C::W, C::DEPTH, p.blocks_per_chunk, run)) return;
  const int tid = threadIdx.x;
  WsRing r;
  r.ring = ring_start(smem);
  r.full0 = smem_addr(full);
  r.empty0 = smem_addr(empty);
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < C::STAGES; ++s) {
      mbar_init(r.full0 + 8 * s, full_count);
      mbar_init(r.empty0 + 8 * s, C::THREADS);
    }
    mbar_init_fence();
  }
  __syncthreads();
  // as pipeline() does: let the next kernel start now if this grid takes every SM, then wait for the previous one;
  // copy waits itself, so that it may issue weights first (the 2:4 kernel's first stage, perf-log pw3; a whole
  // ring's ahead was level or slower, pw1, pw3)
  if (p.early_dependents) allow_dependents();
  if (tid >= C::THREADS) {
    setmaxnreg_dec<C::COPY_REGS>();
    copy(run, r);
    return;
  }
  grid_dependency_wait();

  setmaxnreg_inc<C::COMPUTE_REGS>();
  const auto compute = compute_for(tid);
  float acc[J][C::ACC];
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < C::ACC; ++e) acc[j][e] = 0.f;
  // compute(st, acc) may leave its stage's last wgmma group in flight: a slot is released after the next stage's
  // compute, whose first wait retires it, and only the strip's finish, after the stage loop, drains (inside the loop
  // ptxas would drain at every back edge instead: C7517, perf-log w9).
  RingPos<C::STAGES> at;
  const int t_end = run.t_begin + run.n_iter;
#pragma unroll 1
  for (int seg_begin = run.t_begin; seg_begin < t_end;) {
    const int col = seg_begin / run.k_tiles;
    const int seg_end = min(t_end, (col + 1) * run.k_tiles);
    int held = -1;  // the slot of the previous stage, whose last group may still run
#pragma unroll 1
    for (int t = seg_begin; t < seg_end; ++t) {
      mbar_wait(r.full0 + 8 * at.slot, at.phase);
      compute(r.ring + at.slot * C::STAGE * 16, acc);
      if (held >= 0) mbar_arrive(r.empty0 + 8 * held);
      held = at.slot;
      at.next();
    }
    wgmma_wait<0>();
    mbar_arrive(r.empty0 + 8 * held);
    wgmma_finish<C, Cols, GROUPED, J, true>(p, run, tid, acc, col, seg_begin, seg_end);
    seg_begin = seg_end;
  }
}

#endif

// How the wgmma kernels save a part (wgmma_finish): in register order, quad (Quad: 4 floats, or 4 halves where
// kHalfParts) band (of the tile's R / 8) of wgmma tile j of thread t of a row block at (j * R / 8 + band) * TP + t, TP
// = THREADS / RB threads per row block. For add_parts_kernel (8-row bands: quad `band` of each tile) thread t = j * TP
// + t' takes tile j of those threads' t': element e is row 2 (t' % 4) + e % 2 of the band, column of(j, e / 2) from the
// thread's first (Cols, the kernel's column map). T: wgmma tiles per thread. Bands of more than 256 such threads of 8-
// and 16-row tiles may be split over SPLIT = MAX_SPLIT blocks (launch_gemm), block h taking threads t' in [h TP /
// SPLIT, (h + 1) TP / SPLIT) of every tile: whole warps, whose columns (both column maps go warp by warp) are the
// strip's h-th W / SPLIT. On the 2:4 32 x 256 tiles the split was slower (+1-4% a layer at M = 32, perf-log pk1), so
// taller tiles keep
// whole bands.
template <class C, class Cols, int T>
struct RegisterParts {
  static constexpr int TP = C::THREADS / (C::R / (2 * C::ACC));
  static constexpr int MAX_SPLIT = C::R <= 16 && TP * T > 256 ? TP * T / 256 : 1;
  static constexpr int R = C::R, W = C::W, DEPTH = C::DEPTH, THREADS = TP * T;
  static constexpr bool STAGED = true;
  using Quad = PartQuad<kHalfParts<C>>;
  static_assert(TP % (32 * MAX_SPLIT) == 0, "whole warps per block");
  static __device__ __forceinline__ int thread(int s, int h, int split) {
    return s / (TP / split) * TP + h * (TP / split) + s % (TP / split);
  }
  static __device__ __forceinline__ int64_t at(int band, int t) { return (t / TP * R / 8 + band) * TP + t % TP; }
  static __device__ __forceinline__ int row(int t, int e) { return 2 * (t % 4) + e % 2; }
  static __device__ __forceinline__ int col(int t, int e) { return Cols::x0(0, t % TP) + Cols::of(t / TP, e / 2); }
  static __device__ __forceinline__ int scale(int x) { return Cols::scale(x); }
};

}  // namespace detail
}  // namespace marlin_cli
