// The tensor-rate ceiling of the wgmma kernel's issue pattern (kernels/marlin_sm90.cu), without its data movement:
// one warpgroup per block issues groups of J register-operand wgmma (m64nNk16, fp16 in, fp32 out) on one
// shared-memory tile, keeps WAIT groups in flight, and optionally ends every 4 groups like a pipeline stage
// (wait for all, fence.proxy.async, block barrier) and builds each fragment through a short f16x2 chain.
// SPARSE issues the 2:4 kernels' wgmma.sp (m64nNk32, twice the k of a dense instruction on the same shared-memory
// bytes per output) instead. perf-log (w1, s17) compares the kernels' measured rates with these figures. The second part (`staircase`) adds the
// kernel's own pieces one at a time on its 64 x 256 and 128 x 128 tiles and on 128 x 256 tiles of two warpgroups:
// the weight words and scales read from the stage in shared memory, the real dequantize-and-scale, and the stage
// copies (cp.async from an L2-resident source into the ring, waited for as the kernel does), so the step that
// costs the rate shows (perf-log w4). The part run first (`traffic`) puts the 2:4 pattern on the warp-specialized 2:4
// kernel's shape and adds its waits, copies and shared loads (perf-log s19).
//
// The part `rates` gives what one tensor instruction costs an SM at the small n of the kernels' 8- to 32-row chunks:
// wgmma.sp m64nNk32 and wgmma m64n16k16 back to back in one warpgroup, mma.sp m16n8k32 and mma m16n8k16 in 4-warp
// blocks, 1-4 blocks per SM, as cycles per instruction per SM at the device's clock (perf-log tc1).
//
// Build and run on the H200 (no torch needed):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/bench_wgmma scripts/bench_wgmma_pattern.cu
//   /tmp/bench_wgmma [LAUNCHES] [traffic|rates]     (`traffic`, `rates`: that part only)
// LAUNCHES (default 1): timed launches of about 1 ms per staircase step, the median reported; 100 hold the GPU under
// sustained load as scripts/bench_kernel.py does, 1 (the perf-log w4 figures) catches it at a higher clock.
#include <cuda_runtime.h>

#include "../kernels/marlin24_kernel.cuh"
#include "../kernels/wgmma.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

constexpr int kTileBytes = 16384;  // the shared-memory operand: up to 128 rows x 64 fp16, 128-byte swizzle
constexpr int kSmem = kTileBytes + 1024;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// K-major, 128-byte swizzle, 8-row atoms 1024 bytes apart (as in marlin_sm90.cu).
__device__ __forceinline__ uint64_t tile_desc(uint32_t addr) {
  return ((addr & 0x3ffff) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

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

template <int N, int J, int WAIT, bool STAGE, bool DEQUANT, bool SPARSE>
__global__ void __launch_bounds__(128, 2) pattern(float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem[];
  const uint32_t tile = marlin_cli::detail::ring_start(reinterpret_cast<const int4*>(smem));
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
      for (int j = 0; j < J; ++j) {
        if constexpr (SPARSE) {  // metadata: kept pairs (0, 1) and (2, 3) alternating, k32 tile q % 2
          marlin_cli::detail::wgmma_sp_m64k32<N, 0>(acc[j], a[j], 0x4e4e4e4eu, tile_desc(tile) + 4 * (q % 2));
        } else {
          marlin_cli::detail::wgmma_m64k16<N>(acc[j], a[j], tile_desc(tile) + 2 * q);
        }
      }
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

// Milliseconds that `launch` (one kernel launch) takes, timed by CUDA events around it.
template <class Launch>
float time_once(Launch&& launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  launch();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

template <int N, int J, int WAIT, bool STAGE, bool DEQUANT, bool SPARSE = false>
void run(const char* name, float* out, int blocks) {
  auto kernel = pattern<N, J, WAIT, STAGE, DEQUANT, SPARSE>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  constexpr int kIters = 2000;
  kernel<<<blocks, 128, kSmem>>>(out, 10);  // warm-up
  const float ms = time_once([&] { kernel<<<blocks, 128, kSmem>>>(out, kIters); });
  const double flop = 2.0 * 64 * N * (SPARSE ? 32 : 16) * J * 4.0 * kIters * blocks;  // 2:4: the dense-equivalent
  printf("%-46s %3d blocks  %7.1f TFLOP/s  (%s)\n", name, blocks, flop / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
}

// The 2:4 pattern above on the warp-specialized 2:4 kernel's shape, with its copies and other shared-memory traffic:
// WGS computing warpgroups per block (2 / WGS blocks per SM), each issuing two m64n128k32 per group (one in flight) on
// one tile, and a copying warp that lands, per group of the block, NEAR bytes from an L2-resident source and FAR bytes
// from a source too large for L2 by bulk copies into a ring of kBufs slots of PER groups, each PER groups waiting for
// their slot's bytes (`full`) and releasing it (`empty`) as the kernel's stages do (PER 4: a stage of four k32 rows);
// LDS conflict-free 4-byte shared loads per thread and group folded into the fragments. The kernel (WGS 2, PER 4,
// 128 x 256 tiles, after s19) copies per k32 row 8 KB of activations from L2 and 3 KB of codes, metadata and scales
// from DRAM, and loads about 3 words per thread, for the 32 KB that its four wgmma.sp read (perf-log s19).
constexpr int kBufs = 4, kMaxSlot = 45056;
constexpr int kTrafficSmem = kTileBytes + kBufs * kMaxSlot + 16 * kBufs + 1024;

template <int WGS, int PER, int NEAR, int FAR, int LDS, bool KMETA = false>
__global__ void __launch_bounds__(128 * WGS + 32, 2 / WGS)
    traffic(const int4* src, int src_bytes, const int4* far, int64_t far_bytes, float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace marlin_cli::detail;
  constexpr int kNear = PER * NEAR, kFar = PER * FAR, kSlot = kNear + kFar;
  static_assert(NEAR % 16 == 0 && FAR % 16 == 0 && kSlot <= kMaxSlot && 4 % PER == 0, "whole 16-byte units");
  extern __shared__ unsigned char smem[];
  const uint32_t shift = ring_start(reinterpret_cast<const int4*>(smem)) - smem_addr(smem);
  const uint32_t tile = smem_addr(smem) + shift, bufs = tile + kTileBytes;
  const uint32_t full = bufs + kBufs * kMaxSlot, empty = full + 8 * kBufs;
  for (int i = threadIdx.x; i < kTileBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem + shift)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);
  }
  if (threadIdx.x == 0) {
    for (int b = 0; b < kBufs; ++b) mbar_init(full + 8 * b), mbar_init(empty + 8 * b, WGS);
    mbar_init_fence();
  }
  __syncthreads();
  const int slots = 4 * iters / PER;
  if (threadIdx.x >= 128 * WGS) {  // the copying warp
    if (threadIdx.x == 128 * WGS) {
      const char* from = reinterpret_cast<const char*>(src);
      for (int u = 0; u < slots; ++u) {
        const int b = u % kBufs;
        if (u >= kBufs) mbar_wait(empty + 8 * b, (u / kBufs - 1) & 1);
        mbar_expect(full + 8 * b, kSlot);
        const int64_t off = (int64_t{blockIdx.x} * 65536 + int64_t{u} * kNear) % (src_bytes - kNear) / 16 * 16;
        bulk_copy(bufs + b * kMaxSlot, from + off, kNear, full + 8 * b);
        if constexpr (FAR > 0) {  // each block its own stream through the far source
          const int64_t per_block = far_bytes / gridDim.x / kFar * kFar;
          const int64_t at = blockIdx.x * per_block + int64_t{u} * kFar % per_block;
          bulk_copy(bufs + b * kMaxSlot + kNear, reinterpret_cast<const char*>(far) + at, kFar, full + 8 * b);
        }
      }
    }
    return;
  }
  float acc[2][64] = {};
  const uint32_t w = 0x9e3779b9u * (threadIdx.x + 1);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int g = 4 * it + q, u = g / PER, b = u % kBufs;
      if (q % PER == 0) mbar_wait(full + 8 * b, (u / kBufs) & 1);
      uint32_t x = w + g;
#pragma unroll
      for (int i = 0; i < LDS; ++i) x ^= lds32(tile + ((g * LDS + i) * 512 + threadIdx.x % 128 * 4) % kTileBytes);
      uint32_t a[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) a[j][0] = x, a[j][1] = x ^ 0x100u, a[j][2] = x ^ 0x200u, a[j][3] = x ^ 0x300u;
      wgmma_fence();
      if constexpr (KMETA) {  // the kernel's metadata: a word per group, kept pairs (0, 1) or (2, 3) by its bits, one
                              // register for both instructions through the two sparsity selectors
        const uint32_t meta = ((x & 0x11111111u) * 0xau) ^ 0x44444444u;
        wgmma_sp_m64k32<128, 0>(acc[0], a[0], meta, tile_desc(tile) + 4 * (q % 2));
        wgmma_sp_m64k32<128, 1>(acc[1], a[1], meta, tile_desc(tile) + 4 * (q % 2));
      } else {
#pragma unroll
        for (int j = 0; j < 2; ++j) wgmma_sp_m64k32<128, 0>(acc[j], a[j], 0x4e4e4e4eu, tile_desc(tile) + 4 * (q % 2));
      }
      wgmma_commit();
      wait_groups<1>();
      // nothing reads the slot: released once its last group has issued
      if (q % PER == PER - 1 && threadIdx.x % 128 == 0) mbar_arrive(empty + 8 * b);
    }
  }
  wait_groups<0>();
  float sum = 0.f;
  for (int j = 0; j < 2; ++j)
    for (int e = 0; e < 64; ++e) sum += acc[j][e];
  out[blockIdx.x * 128 * WGS + threadIdx.x] = sum;  // `out` holds 2 x SMs x 128
#endif
}

template <int WGS, int PER, int NEAR, int FAR, int LDS, bool KMETA = false>
void run_traffic(const char* name, const int4* src, int src_bytes, const int4* far, int64_t far_bytes, float* out,
                 int sms) {
  auto kernel = traffic<WGS, PER, NEAR, FAR, LDS, KMETA>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTrafficSmem);
  constexpr int kIters = 2000, kThreads = 128 * WGS + 32;
  const int blocks = sms * 2 / WGS;
  kernel<<<blocks, kThreads, kTrafficSmem>>>(src, src_bytes, far, far_bytes, out, 10);  // warm-up
  const float ms =
      time_once([&] { kernel<<<blocks, kThreads, kTrafficSmem>>>(src, src_bytes, far, far_bytes, out, kIters); });
  const double groups = 4.0 * kIters * blocks * WGS, flop = 2.0 * 64 * 128 * 32 * 2 * groups;
  printf("%d WG x %d blocks, a wait per %d: %-46s %7.1f TFLOP/s  %5.2f TB/s copied  (%s)\n", WGS, 2 / WGS, PER, name,
         flop / ms / 1e9, (NEAR + FAR) * groups / WGS / ms / 1e9, cudaGetErrorString(cudaGetLastError()));
}

// The dense wgmma kernel's stage loop for R-row chunks (wgmma's n) with WGS warpgroups per block sharing each stage's
// A tile, each warpgroup on its own R x (16384 / R) tile (128 accumulators per thread), 2 / WGS blocks per SM: each
// stage waits for its copies (COPY) and the block barrier, then per k16 tile reads its packed words and scales from
// the stage (LDS, else register values), dequantizes and scales them (DEQ, else uses the words as fragments) and
// issues its wgmma on the stage's A tile, one group in flight and all retired at the stage's end. WGS = 1 is the
// kernel's own shape (Sm90Cfg<R>). With COPY every stage is copied into the slot STAGES - 1 ahead, from:
//   SOURCE 0: whole stages from an L2-resident `src` (src_stages stages, round-robin from a per-block start);
//   SOURCE 1: A as in 0, the weights and scales from the block's own contiguous region of `far` (far_stages stages
//             per block, too many for L2);
//   SOURCE 2: the kernel's addresses for the 8192 x 57344 layer at 128 rows: each block its own run of tiles (from
//             its start again when it ends), A rows 16 KB apart in `src`, a stage's weights in four 1 KB (64 x 256:
//             2 KB) rows 448 KB apart in `far`, its scale row;
//   SOURCE 3: the kernel's A rows, the weights as in 1;  SOURCE 4: A as in 0, the kernel's weights;
//   SOURCE 5: the kernel's A rows and runs of tiles, each tile's weights and scale row stored contiguously, tile
//             after tile down each column strip (a repacked order: every block's run one stream);
//   SOURCE 6: the kernel's own StageLoader on the layer of SOURCE 2 (64-row chunks: it no longer copies 128-row ones).
// Random-looking bits whose fp16 halves are at most 2 in magnitude: the tensor cores' power, and so the clock they
// run at, depends on the data.
__device__ __forceinline__ uint32_t random_word(uint32_t i) {
  uint32_t x = i * 2654435761u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return x & 0xbbffbbffu;
}

template <int R, int WGS>
struct Stair {
  static constexpr int THREADS = 128 * WGS;
  static constexpr int J = 256 / R;          // wgmma (and packed words per lane) per warp and k16 tile
  static constexpr int NS = WGS * J;         // 64-column strips of the block tile
  static constexpr int KT = 4;               // k16 tiles per stage
  static constexpr int A_STAGE = R * 8;      // int4
  static constexpr int B_STAGE = KT * NS * 32;
  static constexpr int S_STAGE = 2 * NS * 8;
  static constexpr int STAGE = (A_STAGE + B_STAGE + S_STAGE + 63) / 64 * 64;
  static constexpr int BLOCKS_PER_SM = 2 / WGS;
  static constexpr int FIT = 220 * 1024 / BLOCKS_PER_SM / (STAGE * 16);  // stages that fit the shared memory
  static constexpr int STAGES = FIT < 8 ? FIT : 8;
  static constexpr int SMEM = STAGES * STAGE * 16 + 1024;
  static constexpr double FLOP = 2.0 * R * 64 * NS * 64;  // per stage
};

template <int R, int WGS, bool LDS, bool DEQ, bool COPY, int SOURCE>
__global__ void __launch_bounds__(128 * WGS, 2 / WGS)
    staircase(const int4* src, int src_stages, const int4* far, int far_stages, float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace marlin_cli::detail;
  using C = Stair<R, WGS>;
  constexpr int J = C::J;
  extern __shared__ int4 ring_smem[];
  const uint32_t ring = ring_start(ring_smem);
  uint32_t* const ring_words = reinterpret_cast<uint32_t*>(ring_smem) + (ring - smem_addr(ring_smem)) / 4;
  for (int i = threadIdx.x; i < C::STAGES * C::STAGE * 4; i += blockDim.x) ring_words[i] = random_word(i);
  __syncthreads();
  const int tid = threadIdx.x, lane = tid % 32, warp = tid % 128 / 32, wg = tid / 128;
  const int strip = wg * J + warp * J / 4, word0 = warp % (4 / J) * J;  // as in the kernel, per warpgroup
  const uint32_t b_off = (C::A_STAGE + strip * 32 + lane) * 16 + 4 * word0;
  const uint32_t s_off = (C::A_STAGE + C::B_STAGE + strip * 8 + lane / 4) * 16 + 4 * word0;
  int next = blockIdx.x * 7 % src_stages, next_far = 0;  // the next source stages to copy
  const int4* const far_block = far + static_cast<int64_t>(blockIdx.x) * far_stages * C::STAGE;
  // SOURCE 6: the kernel's StageLoader on the same layer and runs (restarted at the run's start when it ends)
  constexpr int kK6 = 8192, kN6 = 57344;
  const int run6 = kN6 / (64 * C::NS) * (kK6 / 64) / gridDim.x;
  Params p6{};
  p6.b = far;
  p6.s = far + int64_t{kK6 / 16} * (kN6 / 2);
  p6.n = kN6;
  p6.k = kK6;
  p6.m = R;
  p6.lg_group = 3;  // group size 128
  auto new_loader = [&] {
    if constexpr (SOURCE == 6 && R == 64) {
      return StageLoader<Sm90Cfg<R>, true>(p6, src, R, blockIdx.x * run6, kK6 / 64);
    } else {
      return 0;
    }
  };
  auto loader = new_loader();
  int loaded = 0;
  auto copy = [&](uint32_t st) {
    if constexpr (SOURCE == 6 && R == 64) {
      loader.load(st);
      if (++loaded == run6) loader = new_loader(), loaded = 0;
      return;
    }
    const int4* from = src + static_cast<int64_t>(next) * C::STAGE;
    const int4* from_far = far_block + static_cast<int64_t>(next_far) * C::STAGE;
#pragma unroll
    for (int i = 0; i < (C::STAGE + C::THREADS - 1) / C::THREADS; ++i) {
      const int e = tid + C::THREADS * i;
      if (SOURCE == 3 && e >= C::A_STAGE) {  // the kernel's A rows, the weights of SOURCE 1
        if (e < C::STAGE) cp_async16(st + e * 16, from_far + e);
      } else if (SOURCE == 4 && e < C::A_STAGE) {  // the A tile of SOURCE 0, the kernel's weights
        cp_async16(st + e * 16, from + e);
      } else if (SOURCE >= 2) {
        constexpr int kK = 8192, kN = 57344, kTiles = kN / (64 * C::NS) * (kK / 64);
        const int run = kTiles / gridDim.x;  // each block its own run of tiles, as in the kernel
        const int t = blockIdx.x * run + next_far % run, col = t / (kK / 64), kt = t % (kK / 64);
        const int b = e - C::A_STAGE, sc = b - C::B_STAGE;
        constexpr int kTile = C::B_STAGE + C::S_STAGE / 2;  // SOURCE 5: a tile's weights and scale row
        const int64_t row = b / (C::NS * 32), in_row = b % (C::NS * 32);
        const int64_t off = e < C::A_STAGE ? (e / 8) * (kK / 8) + kt * 8 + e % 8
                            : SOURCE == 5  ? int64_t{t} * kTile + b
                            : b < C::B_STAGE ? (kt * 4 + row) * (kN / 2) + col * C::NS * 32 + in_row
                                             : int64_t{kK / 16} * (kN / 2) + (kt / 2) * (kN / 8) + col * C::NS * 8 + sc;
        if (sc < C::S_STAGE / 2) cp_async16(st + e * 16, (e < C::A_STAGE ? src : far) + off);
      } else if (e < C::STAGE) {
        cp_async16(st + e * 16, (SOURCE == 1 && e >= C::A_STAGE ? from_far : from) + e);
      }
    }
    next = next + 1 == src_stages ? 0 : next + 1;
    next_far = next_far + 1 == far_stages ? 0 : next_far + 1;
  };
  constexpr uint32_t kStageBytes = C::STAGE * 16;
  if (COPY) {
    for (int s = 0; s < C::STAGES - 1; ++s) {
      copy(ring + s * kStageBytes);
      cp_async_commit();
    }
  }
  float acc[J][R / 2] = {};
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
      uint32_t bw[J], sw[J];
      if (LDS) {
        lds_words(slot + b_off + q * C::NS * 32 * 16, bw);
        lds_words(slot + s_off, sw);
      } else {
#pragma unroll
        for (int j = 0; j < J; ++j) bw[j] = w0 * (q + 3 + j) + it, sw[j] = 0x3c003c00u;
      }
      uint32_t a[J][4];
#pragma unroll
      for (int j = 0; j < J; ++j) {
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
      for (int j = 0; j < J; ++j) wgmma_m64k16<R>(acc[j], a[j], desc + 2 * q);
      wgmma_commit();
      wgmma_wait_tile<C::KT>(q);
    }
    slot = slot + kStageBytes == ring + C::STAGES * kStageBytes ? ring : slot + kStageBytes;
    slot_next = slot_next + kStageBytes == ring + C::STAGES * kStageBytes ? ring : slot_next + kStageBytes;
  }
  if (COPY) cp_async_wait<0>();
  float sum = 0.f;
  for (int j = 0; j < J; ++j)
    for (int e = 0; e < R / 2; ++e) sum += acc[j][e];
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
#endif
}

__global__ void fill_random(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = random_word(static_cast<uint32_t>(i));
  }
}

// What every staircase run takes: the two sources, the output, the SM count and the timed launches.
struct StairArgs {
  const int4* src;
  const int4* far;
  size_t far_bytes;
  float* out;
  int sms, launches;
};

template <int R, int WGS, bool LDS, bool DEQ, bool COPY, int SOURCE = 0>
void run_stair(const char* name, const StairArgs& g) {
  const int4 *src = g.src, *far = g.far;
  float* out = g.out;
  const int launches = g.launches;
  using C = Stair<R, WGS>;
  auto kernel = staircase<R, WGS, LDS, DEQ, COPY, SOURCE>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  const int src_stages = (4 << 20) / (C::STAGE * 16);  // a 4 MB source: served from L2
  const int blocks = g.sms * C::BLOCKS_PER_SM;
  const int far_stages = static_cast<int>(g.far_bytes / blocks / (C::STAGE * 16));
  constexpr int kIters = 1000;
  kernel<<<blocks, C::THREADS, C::SMEM>>>(src, src_stages, far, far_stages, out, 10);  // warm-up
  // `launches` timed launches back to back (about 1 ms each), the median reported: one launch catches the GPU at
  // its idle clock, a hundred hold it under sustained load as the kernel bench's graph replays do (perf-log w4).
  std::vector<cudaEvent_t> ev(launches + 1);
  for (cudaEvent_t& e : ev) cudaEventCreate(&e);
  cudaEventRecord(ev[0]);
  for (int l = 0; l < launches; ++l) {
    kernel<<<blocks, C::THREADS, C::SMEM>>>(src, src_stages, far, far_stages, out, kIters);
    cudaEventRecord(ev[l + 1]);
  }
  cudaEventSynchronize(ev[launches]);
  std::vector<float> times(launches);
  for (int l = 0; l < launches; ++l) cudaEventElapsedTime(&times[l], ev[l], ev[l + 1]);
  std::sort(times.begin(), times.end());
  const float ms = times[launches / 2];
  for (cudaEvent_t& e : ev) cudaEventDestroy(e);
  const double bytes = COPY ? 16.0 * C::STAGE * kIters * blocks : 0.0;
  printf("%3d x %3d, %d WG, %d stages: %-46s %7.1f TFLOP/s  %5.2f TB/s copied  (%s)\n", R, 64 * C::NS, WGS,
         C::STAGES, name, C::FLOP * kIters * blocks / ms / 1e9, bytes / ms / 1e9,
         cudaGetErrorString(cudaGetLastError()));
}

template <int R, int WGS>
void staircase_of(const StairArgs& g) {
  run_stair<R, WGS, false, false, false>("stage loop, register fragments", g);
  run_stair<R, WGS, true, false, false>("+ words and scales from the stage (lds)", g);
  run_stair<R, WGS, true, true, false>("+ dequantize and scale", g);
  run_stair<R, WGS, false, false, true>("stage loop + copies (L2), register fragments", g);
  run_stair<R, WGS, true, true, true>("lds + dequantize + copies (L2)", g);
  run_stair<R, WGS, true, true, true, 1>("lds + dequantize + copies (weights from DRAM)", g);
  if constexpr (WGS == 1) {
    run_stair<R, WGS, true, true, true, 2>("lds + dequantize + the kernel's copies", g);
    run_stair<R, WGS, true, true, true, 3>("... only its A rows (weights from DRAM)", g);
    run_stair<R, WGS, true, true, true, 4>("... only its weights (A contiguous)", g);
    run_stair<R, WGS, true, true, true, 5>("... its A, its tiles stored one after another", g);
    // the StageLoader of 64-row chunks (128-row ones are copied by the warp-specialized kernel's own thread)
    if constexpr (R == 64) run_stair<R, WGS, true, true, true, 6>("lds + dequantize + the kernel's StageLoader", g);
  }
}

// `rates`: U tensor instructions per iteration on 4 accumulator chains. The operands are read from `src`, so that ptxas
// keeps them in registers (immediate operands it rematerializes between the instructions, and waits for each wgmma).
constexpr int kRateU = 16;
template <int N, bool SPARSE>
__global__ void __launch_bounds__(128) wgmma_rate(const uint32_t* src, float* out, int iters) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem[];
  const uint32_t tile = marlin_cli::detail::ring_start(reinterpret_cast<const int4*>(smem));
  const int l = threadIdx.x % 32;
  const uint32_t a[4] = {src[l], src[l + 1], src[l + 2], src[l + 3]}, meta = src[64 + l];
  float acc[4][N / 2] = {};
  for (int it = 0; it < iters; ++it) {
    // the accumulators were the warps' after the last wait: fence before the next wgmma reads them (ptxas would
    // otherwise inject one, C7519)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int u = 0; u < kRateU; ++u) {
      if constexpr (SPARSE) {
        marlin_cli::detail::wgmma_sp_m64k32<N, 0>(acc[u % 4], a, meta, tile_desc(tile));
      } else {
        marlin_cli::detail::wgmma_m64k16<N>(acc[u % 4], a, tile_desc(tile));
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    wait_groups<0>();
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0][0] + acc[1][0] + acc[2][0] + acc[3][0];
#endif
}

template <bool SPARSE>
__global__ void __launch_bounds__(128) mma_rate(const uint32_t* src, float* out, int iters) {
  const int l = threadIdx.x % 32;
  const uint32_t a[4] = {src[l], src[l + 1], src[l + 2], src[l + 3]}, meta = src[64 + l];
  const uint32_t b[4] = {src[l + 4], src[l + 5], src[l + 6], src[l + 7]}, b2[2] = {b[0], b[1]};
  float acc[4][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int u = 0; u < kRateU; ++u) {
      if constexpr (SPARSE) {
        marlin_cli::sparse24::mma_sp_16832<0>(a, b, meta, acc[u % 4]);
      } else {
        marlin_cli::detail::mma_16816(a, b2, acc[u % 4]);
      }
    }
  }
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc[0][0] + acc[1][0] + acc[2][0] + acc[3][0];
}

// Cycles per instruction per SM of `kernel` at `per_sm` blocks per SM; `per_block`: its instructions per iteration
// that occupy the SM's tensor cores (a warpgroup's wgmma is one, each warp's mma one).
template <class Kernel>
void run_rate(const char* name, Kernel kernel, int per_block, int per_sm, int sms, const uint32_t* src, float* out) {
  constexpr int kIters = 2000;
  int khz = 0;
  cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  kernel<<<sms * per_sm, 128, kSmem>>>(src, out, 10);  // warm-up
  const float ms = time_once([&] { kernel<<<sms * per_sm, 128, kSmem>>>(src, out, kIters); });
  const double per_sm_instructions = static_cast<double>(per_sm) * kIters * kRateU * per_block;
  printf("%-22s %d blocks per SM  %6.2f cycles per instruction per SM  (%s)\n", name, per_sm,
         ms * khz / per_sm_instructions, cudaGetErrorString(cudaGetLastError()));
}

void rates(int sms, float* out) {
  uint32_t host[128];
  for (int i = 0; i < 128; ++i) host[i] = i >= 64 && i < 96 ? 0x44444444u : 0x3c003c00u ^ (i << 4);  // kept (0, 1)
  uint32_t* src = nullptr;
  cudaMalloc(&src, sizeof(host));
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  for (int b = 1; b <= 4; ++b) {
    run_rate("wgmma.sp m64n8k32", wgmma_rate<8, true>, 1, b, sms, src, out);
    run_rate("wgmma.sp m64n16k32", wgmma_rate<16, true>, 1, b, sms, src, out);
    run_rate("wgmma.sp m64n32k32", wgmma_rate<32, true>, 1, b, sms, src, out);
    run_rate("wgmma.sp m64n64k32", wgmma_rate<64, true>, 1, b, sms, src, out);
    run_rate("wgmma m64n16k16", wgmma_rate<16, false>, 1, b, sms, src, out);
    run_rate("mma.sp m16n8k32", mma_rate<true>, 4, b, sms, src, out);
    run_rate("mma m16n8k16", mma_rate<false>, 4, b, sms, src, out);
  }
  cudaFree(src);
}

}  // namespace

int main(int argc, char** argv) {
  const int launches = argc > 1 ? std::atoi(argv[1]) : 1;  // timed launches per staircase step (median)
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out = nullptr;
  cudaMalloc(&out, 4 * sms * 128 * sizeof(float));
  if (argc > 2 && std::strcmp(argv[2], "rates") == 0) {
    rates(sms, out);
    return 0;
  }
  {  // the 2:4 pattern with the warp-specialized 2:4 kernel's other shared-memory traffic
    int4* src = nullptr;
    const int src_bytes = 4 << 20;  // L2-resident
    cudaMalloc(&src, src_bytes);
    cudaMemset(src, 0x11, src_bytes);
    int4* far = nullptr;
    const int64_t far_bytes = int64_t{2} << 30;
    cudaMalloc(&far, far_bytes);
    cudaMemset(far, 0x22, far_bytes);
    // (one shared load at least: without any, ptxas serializes the wgmma.sp of the four-group stages, C7512)
    run_traffic<2, 1, 16, 0, 1>("16 bytes copied, 1 shared load per group", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<2, 4, 16, 0, 1>("16 bytes copied, 1 shared load per group", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<1, 1, 16, 0, 1>("16 bytes copied, 1 shared load per group", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<1, 4, 16, 0, 1>("16 bytes copied, 1 shared load per group", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<2, 4, 16, 0, 3>("16 bytes copied, 3 shared loads", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<2, 4, 8192, 0, 3>("8 KB from L2 per group, 3 shared loads", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<2, 4, 8192, 3072, 3>("+ 3 KB from DRAM (the kernel's copies)", src, src_bytes, far, far_bytes, out,
                                     sms);
    run_traffic<2, 4, 8192, 3072, 3, true>("+ the kernel's metadata", src, src_bytes, far, far_bytes, out, sms);
    run_traffic<2, 4, 4096, 3072, 3>("half the L2 bytes (A shared by two blocks)", src, src_bytes, far, far_bytes,
                                     out, sms);
    cudaFree(far);
    cudaFree(src);
    if (argc > 2) return 0;  // `bench_wgmma N traffic`: this part only
  }
  for (int blocks : {sms, 2 * sms}) {  // one and two warpgroups per SM
    run<64, 4, 1, false, false>("n64 x4 per group, 1 in flight", out, blocks);
    run<64, 4, 0, false, false>("n64 x4 per group, none in flight", out, blocks);
    run<64, 4, 1, true, false>("n64 x4, stage every 4 groups", out, blocks);
    run<64, 4, 1, true, true>("n64 x4, stage, f16x2 chain per fragment", out, blocks);
    run<128, 2, 1, false, false>("n128 x2 per group, 1 in flight", out, blocks);
    run<128, 2, 1, true, true>("n128 x2, stage, f16x2 chain per fragment", out, blocks);
    run<64, 2, 1, false, false>("n64 x2 per group, 1 in flight", out, blocks);
    run<128, 2, 1, false, false, true>("2:4 n128 x2 per group, 1 in flight", out, blocks);
    run<128, 2, 0, false, false, true>("2:4 n128 x2 per group, none in flight", out, blocks);
    run<128, 2, 1, true, true, true>("2:4 n128 x2, stage, f16x2 chain per fragment", out, blocks);
    run<64, 4, 1, false, false, true>("2:4 n64 x4 per group, 1 in flight", out, blocks);
    run<16, 4, 1, false, false, true>("2:4 n16 x4 per group, 1 in flight", out, blocks);
    run<16, 4, 1, false, false>("n16 x4 per group, 1 in flight", out, blocks);
  }
  // the staircase: the kernel's 64 x 256 and 128 x 128 tiles, and 128 x 256 with two warpgroups sharing A
  int4 *src = nullptr, *far = nullptr;
  const size_t far_bytes = size_t{2} << 30;
  cudaMalloc(&src, 4 << 20);
  fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(src), (4 << 20) / 4);
  cudaMalloc(&far, far_bytes);
  fill_random<<<1024, 256>>>(reinterpret_cast<uint32_t*>(far), far_bytes / 4);
  const StairArgs g{src, far, far_bytes, out, sms, launches};
  staircase_of<64, 1>(g);
  staircase_of<128, 1>(g);
  staircase_of<128, 2>(g);
  cudaFree(far);
  cudaFree(src);
  cudaFree(out);
  return 0;
}
