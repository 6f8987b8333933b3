// The bandwidth ceiling of the dense kernel's weight stream at small m, without its math: blocks walk the same
// striped runs of 8 KB tiles (a 128-column strip x 128 rows of K: 8 packed rows of 1 KB, 8n bytes apart) through a
// ring of shared-memory stages, and consume each stage trivially (every thread reads its 16 bytes). Two ways to copy
// a stage: 16-byte cp.async by every thread (the kernels' StageLoader), or one thread issuing eight 1 KB bulk copies
// (cp.async.bulk, completing on an mbarrier). A read-only grid-stride loop over the same bytes gives the reference.
// perf-log compares the kernel's steady state with these figures.
//
// `floor`: what any kernel that reads a layer's weights once pays on the bench's terms. The read-only loop over each
// bench layer's bytes in both formats (dense: 4-bit codes and group-128 scales; 2:4: 3 bits a weight and the same
// scales), in a CUDA graph of back-to-back launches as scripts/bench_kernel.py times them, three ways: plain launches;
// programmatic dependent launch with every read after the wait for the previous launch (as activations must be); and
// with every read before that wait (weights that no kernel writes, prefetched without limit). Per layer set it prints
// the sums and the dense / 2:4 ratio each way (perf-log pd2), then the ring streamer with some of its copies ahead of
// that wait (ring_ahead, perf-log ra1).
//
// Build and run on the H200 (no torch needed):
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/bench_stream scripts/bench_stream_pattern.cu
//   /tmp/bench_stream [floor]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int kThreads = 256;
constexpr int kRowBytes = 1024;  // one packed k16 row of a 128-column strip
constexpr int kRows = 8;         // packed rows per tile (128 rows of K)
constexpr int kTile = kRows * kRowBytes;

struct Shape {
  int64_t row_stride;  // bytes between packed rows: 8n
  int strips, k_tiles;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// The run of tiles of block `bid` of `blocks`, as the kernels' plan_run numbers them (k fastest).
__device__ __forceinline__ void run_of(const Shape& s, int bid, int blocks, int& t0, int& n) {
  const int total = s.strips * s.k_tiles;
  const int iters = (total + blocks - 1) / blocks;
  t0 = bid * iters;
  n = max(0, min(total, t0 + iters) - t0);
}

__device__ __forceinline__ const char* tile_src(const char* b, const Shape& s, int t) {
  const int col = t / s.k_tiles, kt = t % s.k_tiles;
  return b + static_cast<int64_t>(kt) * kRows * s.row_stride + static_cast<int64_t>(col) * kRowBytes;
}

__device__ __forceinline__ uint32_t consume(uint32_t slot) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(slot + threadIdx.x * 16));
  return v.x ^ v.y ^ v.z ^ v.w;
}

// Every thread copies 16-byte chunks threadIdx.x and threadIdx.x + 256 of each stage (rows r, r + 4).
template <int STAGES>
__global__ void __launch_bounds__(kThreads) stream_cp_async(const char* b, Shape s, uint32_t* sink) {
  extern __shared__ __align__(1024) char smem[];
  int t0, n;
  run_of(s, blockIdx.x, gridDim.x, t0, n);
  const int tid = threadIdx.x;
  const int64_t off0 = (tid / 64) * s.row_stride + (tid % 64) * 16, off1 = off0 + 4 * s.row_stride;
  const uint32_t ring = smem_u32(smem);
  auto load = [&](int i) {
    const char* src = tile_src(b, s, t0 + i);
    const uint32_t dst = ring + (i % STAGES) * kTile + tid * 16;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src + off0) : "memory");
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + 4096), "l"(src + off1) : "memory");
  };
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < n) load(i);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  uint32_t x = 0;
  for (int i = 0; i < n; ++i) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    if (i + STAGES - 1 < n) load(i + STAGES - 1);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    x ^= consume(ring + (i % STAGES) * kTile);
  }
  if (x == 0x12345678) sink[0] = x;
}

// Thread 0 issues a stage as kRows bulk copies of 1 KB onto the stage's mbarrier; every thread waits on it. With
// `ahead` >= 0 the launch is a programmatic dependent one, as the GEMMs' are: the next launch may start at once, and
// the copies of the first `ahead` prologue stages go before the wait for the previous launch, the rest after it. With
// `acts`, each stage also takes 256 bytes of it (an activation row 128 deep, as a GEMM's at m = 1) by 16 threads'
// cp.async after the wait, a group a stage, into shared memory after the ring, and waits for them too; with `spin`,
// every thread then spends that many clock cycles on the stage, as a GEMM's compute chain does.
template <int STAGES>
__global__ void __launch_bounds__(kThreads) stream_bulk(const char* b, Shape s, uint32_t* sink, int ahead = -1,
                                                        const int4* acts = nullptr, int spin = 0) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[STAGES];
  int t0, n;
  run_of(s, blockIdx.x, gridDim.x, t0, n);
  const uint32_t ring = smem_u32(smem);
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&full[i])));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  auto load = [&](int i) {
    const char* src = tile_src(b, s, t0 + i);
    const uint32_t bar = smem_u32(&full[i % STAGES]);
    const uint32_t dst = ring + (i % STAGES) * kTile;
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "n"(kTile) : "memory");
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
              dst + r * kRowBytes),
          "l"(src + r * s.row_stride), "n"(kRowBytes), "r"(bar)
          : "memory");
    }
  };
  auto load_acts = [&](int i) {  // without `acts` no cp.async group at all, as before `acts` existed
    if (acts == nullptr) return;
    if (threadIdx.x < 16 && i < n) {
      const uint32_t dst = ring + STAGES * kTile + ((i % STAGES) * 16 + threadIdx.x) * 16;
      const int4* src = acts + (t0 + i) % 64 * 16 + threadIdx.x;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  const int first = ahead < 0 ? STAGES - 1 : min(ahead, STAGES - 1);
  if (ahead >= 0) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (threadIdx.x == 0) {
    for (int i = 0; i < first && i < n; ++i) load(i);
  }
  if (ahead >= 0) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  for (int i = 0; i < STAGES - 1; ++i) load_acts(i);
  if (threadIdx.x == 0) {
    for (int i = first; i < STAGES - 1 && i < n; ++i) load(i);
  }
  uint32_t x = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t bar = smem_u32(&full[i % STAGES]);
    const uint32_t parity = (i / STAGES) & 1;
    asm volatile(
        "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n" ::"r"(
            bar),
        "r"(parity)
        : "memory");
    if (acts != nullptr) asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();  // every thread is done with stage i - 1, whose slot the next load takes
    if (threadIdx.x == 0 && i + STAGES - 1 < n) load(i + STAGES - 1);
    load_acts(i + STAGES - 1);
    x ^= consume(ring + (i % STAGES) * kTile);
    if (acts != nullptr && threadIdx.x < 16) x ^= consume(ring + STAGES * kTile + (i % STAGES) * 256);
    if (spin > 0) {
      for (const int64_t t = clock64(); clock64() - t < spin;) x += 1;
    }
  }
  if (x == 0x12345678) sink[0] = x;
}

// Read-only reference: every byte once, 16 bytes per thread per step, grid-stride. With programmatic dependent
// launch (any R but kPlain) the next launch may start at once, and this one waits for the previous before its reads
// (kAfterWait, as a GEMM's activations) or after them, before its only store (kBeforeWait).
enum class Reads { kPlain, kAfterWait, kBeforeWait };
template <Reads R>
__global__ void __launch_bounds__(kThreads) read_all(const int4* b, int64_t n16, uint32_t* sink) {
  if (R != Reads::kPlain) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if (R == Reads::kAfterWait) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  uint32_t x = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n16;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    int4 v;
    asm volatile("ld.global.nc.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(b + i));
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (R == Reads::kBeforeWait) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  if (x == 0x12345678) sink[0] = x;
}

// A stand-in for add_parts_kernel at m = 1 (ring_ahead): block b (one per 128-column strip) adds 2 KB of each of its
// strip's `n_parts` parts, which stay in L2 between launches, and writes 2 KB; the next launch may start at once, as
// after a GEMM whose grid takes every block slot.
__global__ void __launch_bounds__(128) add_like(const int4* parts, int4* out, int n_parts) {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  int4 sum = {0, 0, 0, 0};
  for (int q = 0; q < n_parts; ++q) {
    const int4 v = parts[(static_cast<int64_t>(q) * gridDim.x + blockIdx.x) * 128 + threadIdx.x];
    sum = {sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w};
  }
  out[blockIdx.x * 128 + threadIdx.x] = sum;
}

}  // namespace

// Launches kernel(args...) on `stream`, as a programmatic dependent launch when `pdl` is set.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), int blocks, int threads, int smem, cudaStream_t stream, bool pdl,
            Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// Microseconds per launch(i) on `stream`, i rotating over `copies`, after one warm-up launch of each.
template <class Launch>
float time_us(Launch&& launch, int copies, int reps, cudaStream_t stream = nullptr) {
  for (int i = 0; i < copies; ++i) launch(i);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < reps; ++i) launch(i % copies);
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms * 1000.f / reps;
}

template <int STAGES>
void set_smem() {
  cudaFuncSetAttribute(stream_cp_async<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGES * kTile);
  cudaFuncSetAttribute(stream_bulk<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, STAGES * kTile);
}

// Microseconds per launch of launch(i), i rotating over `copies`: a CUDA graph of 64 launches, replayed `reps` times.
template <class Launch>
float graph_us(Launch&& launch, int copies, int reps) {
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  constexpr int kLaunches = 64;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < kLaunches; ++i) launch(i % copies, st);
  cudaStreamEndCapture(st, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  const float us = time_us([&](int) { cudaGraphLaunch(exec, st); }, 2, reps, st) / kLaunches;
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(st);
  return us;
}

// Part of `floor` (perf-log ra1, ra2): the 4-stage bulk-copy ring streamer at two blocks per SM, launched back to back
// as programmatic dependent launches in a CUDA graph, with 0, 1 or 3 of its prologue stages' copies before the wait
// for the previous launch. Five columns of three: each block alone (32 KB of shared memory); padded to the 2:4 16 x 128
// GEMM block's 107520 bytes, so that a later launch's block fits on an SM only once one of this launch's has left it;
// padded with add_like after each launch, as add_parts_kernel follows a GEMM that splits strips; that with an
// activation row a stage copied after the wait (stream_bulk's `acts`); that with 600 cycles a stage standing for a
// GEMM's compute chain (`spin`). The 2:4 layers are streamed as dense ones of 3/4 the depth (their codes' and
// metadata's bytes, without scales; 11008 x 4096 rounded down to 64 tiles). Times are per streamer launch, with its
// add_like.
void ring_ahead(int sms, uint32_t* sink) {
  constexpr int kStages = 4, kGemmSmem = 107520, kVariants = 15;
  cudaFuncSetAttribute(stream_bulk<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemmSmem);
  const int aheads[] = {0, 1, 3};
  const int layers[][2] = {{4096, 12288}, {4096, 4096}, {4096, 22016}, {11008, 4096}, {8192, 10240}, {8192, 8192}};
  printf("\nring streamer, 2 blocks an SM, us: stages ahead of the wait 0 / 1 / 3 with blocks of 32 KB, 105 KB, "
         "105 KB and add_like after each, activations, a compute chain\n");
  printf("%-12s %-6s", "layer", "format");
  for (const char* v : {"32K", "105K", "+parts", "+acts", "+chain"}) printf(" %6s a0 %6s a1 %6s a3", v, v, v);
  printf("\n");
  int4 *parts = nullptr, *out = nullptr;
  cudaMalloc(&parts, 8 << 20);
  cudaMemset(parts, 0x11, 8 << 20);
  cudaMalloc(&out, 1 << 20);
  float sum[2][kVariants] = {};
  for (const auto& kn : layers) {
    const int strips = kn[1] / 128, n_parts = std::max(2, (2 * sms + strips - 1) / strips);
    for (int f = 0; f < 2; ++f) {
      const Shape s{8ll * kn[1], strips, (f == 0 ? kn[0] : kn[0] * 3 / 4) / 128};
      const int64_t bytes = static_cast<int64_t>(s.k_tiles) * kRows * s.row_stride;
      const int copies = static_cast<int>((512ll << 20) / bytes) + 1;  // > 512 MB: never from L2
      std::vector<char*> bufs(copies);
      for (auto& p : bufs) {
        cudaMalloc(&p, bytes);
        cudaMemset(p, 0x5a, bytes);
      }
      printf("%5dx%-6d %-6s", kn[0], kn[1], f == 0 ? "dense" : "2:4");
      for (int v = 0; v < kVariants; ++v) {
        const int smem = v < 3 ? kStages * kTile : kGemmSmem, ahead = aheads[v % 3];
        const float us = graph_us(
            [&](int i, cudaStream_t st) {
              launch(stream_bulk<kStages>, sms * 2, kThreads, smem, st, true, bufs[i], s, sink, ahead,
                     v >= 9 ? out : nullptr, v >= 12 ? 600 : 0);
              if (v >= 6) launch(add_like, strips, 128, 0, st, true, parts, out, n_parts);
            },
            copies, 20);
        if (kn[0] == 11008 || kn[0] == 4096) sum[f][v] += us;
        printf(" %9.2f", us);
      }
      printf("\n");
      for (auto p : bufs) cudaFree(p);
    }
  }
  for (int f = 0; f < 2; ++f) {
    printf("%-12s %-6s", "7b sum", f == 0 ? "dense" : "2:4");
    for (int v = 0; v < kVariants; ++v) printf(" %9.2f", sum[f][v]);
    printf("\n");
  }
  cudaFree(parts);
  cudaFree(out);
}

int floor_main(int sms) {
  uint32_t* sink = nullptr;
  cudaMalloc(&sink, 4);
  struct Set {
    const char* name;
    int shapes[4][2];
  };
  const Set sets[] = {{"7b", {{4096, 12288}, {4096, 4096}, {4096, 22016}, {11008, 4096}}},
                      {"70b", {{8192, 10240}, {8192, 8192}, {8192, 57344}, {28672, 8192}}}};
  const char* ways[] = {"plain", "pdl, reads after the wait", "pdl, reads before the wait"};
  printf("%-5s %-12s %-6s %9s %9s %9s\n", "set", "layer", "format", "plain", "after", "before");
  for (const Set& set : sets) {
    float sum[2][3] = {};
    for (const auto& kn : set.shapes) {
      const int64_t k = kn[0], n = kn[1], scales = k / 128 * n * 2;
      for (int f = 0; f < 2; ++f) {
        const int64_t bytes = (f == 0 ? k * n / 2 : k * n * 3 / 8) + scales;
        const int copies = static_cast<int>((512ll << 20) / bytes) + 1;  // > 512 MB: never from L2
        std::vector<int4*> bufs(copies);
        for (auto& p : bufs) {
          cudaMalloc(&p, bytes);
          cudaMemset(p, 0x5a, bytes);
        }
        float us[3];
        for (int w = 0; w < 3; ++w) {
          const auto kernel = w == 0 ? read_all<Reads::kPlain> : w == 1 ? read_all<Reads::kAfterWait>
                                                                        : read_all<Reads::kBeforeWait>;
          us[w] = graph_us(
              [&](int i, cudaStream_t st) {
                launch(kernel, sms * 8, kThreads, 0, st, w != 0, bufs[i], bytes / 16, sink);
              },
              copies, 20);
          sum[f][w] += us[w];
        }
        printf("%-5s %5lldx%-6lld %-6s %9.2f %9.2f %9.2f\n", set.name, static_cast<long long>(k),
               static_cast<long long>(n), f == 0 ? "dense" : "2:4", us[0], us[1], us[2]);
        for (auto p : bufs) cudaFree(p);
      }
    }
    for (int w = 0; w < 3; ++w) {
      printf("%-5s sum, %-27s dense %7.2f  2:4 %7.2f  ratio %.3f\n", set.name, ways[w], sum[0][w], sum[1][w],
             sum[0][w] / sum[1][w]);
    }
  }
  ring_ahead(sms, sink);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (argc > 1 && std::string(argv[1]) == "floor") return floor_main(sms);
  set_smem<4>();
  set_smem<8>();
  set_smem<12>();
  set_smem<16>();
  uint32_t* sink = nullptr;
  cudaMalloc(&sink, 4);
  const struct {
    int k, n;
  } layers[] = {{4096, 4096}, {11008, 4096}, {4096, 22016}, {8192, 57344}};
  printf("%-12s %-26s %9s %9s\n", "layer", "variant", "us", "TB/s");
  for (const auto& l : layers) {
    const int64_t bytes = static_cast<int64_t>(l.k) * l.n / 2;
    const int copies = static_cast<int>((512ll << 20) / bytes) + 1;  // rotate through > 512 MB: never from L2
    std::vector<char*> bufs(copies);
    for (auto& p : bufs) {
      cudaMalloc(&p, bytes);
      cudaMemset(p, 0x5a, bytes);
    }
    const Shape s{8ll * l.n, l.n / 128, l.k / 128};
    char name[32];
    snprintf(name, sizeof name, "%dx%d", l.k, l.n);
    auto report = [&](const char* variant, float us) {
      printf("%-12s %-26s %9.2f %9.2f\n", name, variant, us, bytes / us / 1e6);
    };
    const int reps = 200;
    report("read-only, grid-stride", time_us([&](int i) {
             read_all<Reads::kPlain><<<sms * 8, kThreads>>>(reinterpret_cast<const int4*>(bufs[i]), bytes / 16, sink);
           }, copies, reps));
#define CASE(KERNEL, STAGES, BPS)                                                                   \
  report(#KERNEL " " #STAGES " stages x " #BPS, time_us([&](int i) {                               \
           KERNEL<STAGES><<<sms * BPS, kThreads, STAGES * kTile>>>(bufs[i], s, sink);               \
         }, copies, reps));
    CASE(stream_cp_async, 4, 2)
    CASE(stream_cp_async, 8, 2)
    CASE(stream_cp_async, 12, 1)
    CASE(stream_bulk, 4, 2)
    CASE(stream_bulk, 8, 2)
    CASE(stream_bulk, 12, 2)
    CASE(stream_bulk, 16, 1)
#undef CASE
    for (auto p : bufs) cudaFree(p);
  }
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    printf("CUDA error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
