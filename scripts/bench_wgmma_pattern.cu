// The tensor-rate ceiling of the wgmma kernel's issue pattern (kernels/marlin_sm90.cu), without its data movement:
// one warpgroup per block issues groups of J register-operand wgmma (m64nNk16, fp16 in, fp32 out) on one
// shared-memory tile, keeps WAIT groups in flight, and optionally ends every 4 groups like a pipeline stage
// (wait for all, fence.proxy.async, block barrier) and builds each fragment through a short f16x2 chain.
// perf-log (w1) compares the kernel's measured rate with these figures. The second part (`staircase`) adds the
// kernel's own pieces one at a time on its 64 x 256 configuration: the weight words and scales read from the stage in
// shared memory, the real dequantize-and-scale, and the stage copies (cp.async from global memory into the 6-deep
// ring, waited for as the kernel does), so the step that costs the rate shows (perf-log w4).
//
// Build and run on the H200 (no torch needed):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/bench_wgmma scripts/bench_wgmma_pattern.cu
//   /tmp/bench_wgmma
#include <cuda_runtime.h>

#include "../kernels/wgmma.cuh"

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

// One warpgroup per block, two blocks per SM, the dense wgmma kernel's 64 x 256 stage loop: each stage waits for its
// copies (COPY) and the block barrier, then per k16 tile reads its packed words and scales from the stage (LDS, else
// register values), dequantizes and scales them (DEQ, else uses the words as fragments) and issues four m64n64k16 on
// the stage's A tile, one group in flight and all retired at the stage's end. With COPY every stage is copied from
// `src` (src_stages stages, read round-robin from a per-block start) into the slot STAGES - 1 ahead.
using StairCfg = marlin_cli::detail::Sm90Cfg<64>;
template <bool LDS, bool DEQ, bool COPY>
__global__ void __launch_bounds__(128, 2) staircase(const int4* src, int src_stages, float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace marlin_cli::detail;
  using C = StairCfg;
  extern __shared__ int4 ring_smem[];
  const uint32_t ring = (smem_addr(ring_smem) + 1023) & ~1023u;
  uint32_t* const ring_words = reinterpret_cast<uint32_t*>(ring_smem) + (ring - smem_addr(ring_smem)) / 4;
  for (int i = threadIdx.x; i < C::STAGES * C::STAGE * 4; i += blockDim.x) {  // fp16 values near 1, nibbles mixed
    ring_words[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  }
  __syncthreads();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint32_t b_off = (C::A_STAGE + warp * 32 + lane) * 16;
  const uint32_t s_off = (C::A_STAGE + C::B_STAGE + warp * 8 + lane / 4) * 16;
  int next = blockIdx.x * 7 % src_stages;  // the next source stage to copy
  auto copy = [&](uint32_t st) {
    const int4* from = src + static_cast<int64_t>(next) * C::STAGE;
#pragma unroll
    for (int i = 0; i < (C::STAGE + 127) / 128; ++i) {
      const int e = tid + 128 * i;
      if (e < C::STAGE) cp_async16(st + e * 16, from + e);
    }
    next = next + 1 == src_stages ? 0 : next + 1;
  };
  constexpr uint32_t kStageBytes = C::STAGE * 16;
  if (COPY) {
    for (int s = 0; s < C::STAGES - 1; ++s) {
      copy(ring + s * kStageBytes);
      cp_async_commit();
    }
  }
  float acc[4][32] = {};
  const uint32_t w0 = 0x9e3779b9u * (tid + 1);
  uint32_t slot = ring, slot_next = ring + (C::STAGES - 1) * kStageBytes;
  for (int it = 0; it < iters; ++it) {
    if (COPY) cp_async_wait<C::STAGES - 2>();
    fence_proxy_async();
    __syncthreads();
    if (COPY) {
      copy(slot_next);
      cp_async_commit();
    }
    const uint64_t desc = a_desc(slot);
#pragma unroll
    for (int q = 0; q < C::KT; ++q) {
      uint32_t bw[4], sw[4];
      if (LDS) {
        const int4 b = lds128(slot + b_off + q * C::NS * 32 * 16), s = lds128(slot + s_off);
        bw[0] = b.x, bw[1] = b.y, bw[2] = b.z, bw[3] = b.w, sw[0] = s.x, sw[1] = s.y, sw[2] = s.z, sw[3] = s.w;
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) bw[j] = w0 * (q + 3 + j) + it, sw[j] = 0x3c003c00u;
      }
      uint32_t a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (DEQ) {
          uint32_t f0[2], f1[2];
          dequant_scaled<true>(bw[j], sw[j], f0, f1);
          a[j][0] = f0[0], a[j][1] = f1[0], a[j][2] = f0[1], a[j][3] = f1[1];
        } else {
          a[j][0] = bw[j], a[j][1] = bw[j] ^ 0x100u, a[j][2] = bw[j] ^ 0x200u, a[j][3] = bw[j] ^ 0x300u;
        }
      }
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) wgmma_m64k16<64>(acc[j], a[j], desc + 2 * q);
      wgmma_commit();
      if (q + 1 < C::KT) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
    }
    slot = slot + kStageBytes == ring + C::STAGES * kStageBytes ? ring : slot + kStageBytes;
    slot_next = slot_next + kStageBytes == ring + C::STAGES * kStageBytes ? ring : slot_next + kStageBytes;
  }
  if (COPY) cp_async_wait<0>();
  float sum = 0.f;
  for (int j = 0; j < 4; ++j)
    for (int e = 0; e < 32; ++e) sum += acc[j][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
#endif
}

template <bool LDS, bool DEQ, bool COPY>
void run_stair(const char* name, const int4* src, int src_stages, float* out, int blocks) {
  auto kernel = staircase<LDS, DEQ, COPY>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, StairCfg::SMEM);
  constexpr int kIters = 1000;
  kernel<<<blocks, 128, StairCfg::SMEM>>>(src, src_stages, out, 10);  // warm-up
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  kernel<<<blocks, 128, StairCfg::SMEM>>>(src, src_stages, out, kIters);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  const double flop = 2.0 * 64 * 256 * 64 * kIters * blocks;  // a 64 x 256 x 64 stage per iteration
  const double bytes = COPY ? 16.0 * StairCfg::STAGE * kIters * blocks : 0.0;
  printf("%-52s %3d blocks  %7.1f TFLOP/s  %5.2f TB/s copied  (%s)\n", name, blocks, flop / ms / 1e9,
         bytes / ms / 1e9, cudaGetErrorString(cudaGetLastError()));
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
  // the staircase, two blocks per SM; sources of 4 MB (served from L2) and 1 GB (from DRAM)
  const int l2_stages = (4 << 20) / (StairCfg::STAGE * 16), dram_stages = (1 << 30) / (StairCfg::STAGE * 16);
  int4* src = nullptr;
  cudaMalloc(&src, static_cast<size_t>(dram_stages) * StairCfg::STAGE * 16);
  cudaMemset(src, 0x3c, static_cast<size_t>(dram_stages) * StairCfg::STAGE * 16);
  const int blocks = 2 * sms;
  run_stair<false, false, false>("stage loop, register fragments", src, l2_stages, out, blocks);
  run_stair<true, false, false>("+ words and scales from the stage (lds)", src, l2_stages, out, blocks);
  run_stair<true, true, false>("+ dequantize and scale", src, l2_stages, out, blocks);
  run_stair<false, false, true>("stage loop + copies (L2 source), register fragments", src, l2_stages, out, blocks);
  run_stair<true, true, true>("lds + dequantize + copies (L2 source)", src, l2_stages, out, blocks);
  run_stair<true, true, true>("lds + dequantize + copies (DRAM source)", src, dram_stages, out, blocks);
  cudaFree(src);
  cudaFree(out);
  return 0;
}
