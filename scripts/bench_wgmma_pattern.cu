// The tensor-rate ceiling of the wgmma kernel's issue pattern (kernels/marlin_sm90.cu), without its data movement:
// one warpgroup per block issues groups of J register-operand wgmma (m64nNk16, fp16 in, fp32 out) on one
// shared-memory tile, keeps WAIT groups in flight, and optionally ends every 4 groups like a pipeline stage
// (wait for all, fence.proxy.async, block barrier) and builds each fragment through a short f16x2 chain.
// perf-log (w1) compares the kernel's measured rate with these figures.
//
// Build and run on the H200 (no torch needed):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/bench_wgmma scripts/bench_wgmma_pattern.cu
//   /tmp/bench_wgmma
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace {

constexpr int kTileBytes = 16384;  // the shared-memory operand: up to 128 rows x 64 fp16, 128-byte swizzle
constexpr int kSmem = kTileBytes + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart (as in marlin_sm90.cu).
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  return ((addr & 0x3ffff) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

#define ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wgmma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
      : ACC8(0), ACC8(8), ACC8(16), ACC8(24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, "
      "%33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, "
      "%54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
      : ACC8(0), ACC8(8), ACC8(16), ACC8(24), ACC8(32), ACC8(40), ACC8(48), ACC8(56)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
#undef ACC8

template <int N>
__device__ __forceinline__ void wait_groups() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// One word -> one f16x2 fragment register through a short dependent chain (mask, subtract, multiply): lighter than
// the kernel's dequantize + scale (about 7 instructions per packed word plus 4 scale multiplies).
__device__ __forceinline__ uint32_t fake_dequant(uint32_t x) {
  x = (x & 0x000f000fu) | 0x64006400u;
  asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(x) : "r"(0x64086408u));
  asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(x) : "r"(0x2c002c00u));
  return x;
}
#endif

template <int N, int J, int WAIT, bool STAGE, bool DEQUANT>
__global__ void __launch_bounds__(128, 2) pattern(float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem[];
  const uint32_t tile = (static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + 1023) & ~1023u;
  for (int i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) {  // small random-looking fp16 values
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  }
  __syncthreads();
  float acc[J][N / 2] = {};
  const uint32_t w = 0x9e3779b9u * (threadIdx.x + 1);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t a[J][4];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const uint32_t x = DEQUANT ? fake_dequant(w * (q + 3 + j) + it) : w;
        a[j][0] = x, a[j][1] = x ^ 0x100u, a[j][2] = x ^ 0x200u, a[j][3] = x ^ 0x300u;
      }
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int j = 0; j < J; ++j) wgmma(acc[j], a[j], tile_desc(tile) + 2 * q);
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      if (STAGE && q == 3) {
        wait_groups<0>();
      } else {
        wait_groups<WAIT>();
      }
    }
    if (STAGE) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncthreads();
    }
  }
  wait_groups<0>();
  float sum = 0.f;
  for (int j = 0; j < J; ++j)
    for (int e = 0; e < N / 2; ++e) sum += acc[j][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;  // keeps the work alive
#endif
}

template <int N, int J, int WAIT, bool STAGE, bool DEQUANT>
void run(const char* name, float* out, int blocks) {
  auto kernel = pattern<N, J, WAIT, STAGE, DEQUANT>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  constexpr int kIters = 2000;
  kernel<<<blocks, 128, kSmem>>>(out, 10);  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  kernel<<<blocks, 128, kSmem>>>(out, kIters);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  const double flop = 2.0 * 64 * N * 16 * J * 4.0 * kIters * blocks;
  printf("%-46s %3d blocks  %7.1f TFLOP/s  (%s)\n", name, blocks, flop / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out = nullptr;
  cudaMalloc(&out, 2 * sms * 128 * sizeof(float));
  for (int blocks : {sms, 2 * sms}) {  // one and two warpgroups per SM
    run<64, 4, 1, false, false>("n64 x4 per group, 1 in flight", out, blocks);
    run<64, 4, 0, false, false>("n64 x4 per group, none in flight", out, blocks);
    run<64, 4, 1, true, false>("n64 x4, stage every 4 groups", out, blocks);
    run<64, 4, 1, true, true>("n64 x4, stage, f16x2 chain per fragment", out, blocks);
    run<128, 2, 1, false, false>("n128 x2 per group, 1 in flight", out, blocks);
    run<128, 2, 1, true, true>("n128 x2, stage, f16x2 chain per fragment", out, blocks);
    run<64, 2, 1, false, false>("n64 x2 per group, 1 in flight", out, blocks);
  }
  cudaFree(out);
  return 0;
}
