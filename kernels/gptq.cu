// The GPTQ column loop of one block of columns on the GPU (marlin_cli/algo/gptq.py is the definition; its torch loop
// launches about eight small kernels per column, which bounds the solve by launch latency).
//
// Rows are independent inside the loop. Each row belongs to T threads of one warp (T = 1 when rows are many, as in
// --clip's search, which runs this loop on every candidate scale of a group; up to 8 when a plain solve's few
// thousand rows would leave most SMs with one warp). A block's rows sit in shared memory column by column, kPitch
// words apart: a warp's accesses of one step hit 32 banks. Per column every thread of a row rounds the weight to the
// grid and divides the error by U's diagonal (the same operations on the same values, so the T copies agree); the
// column's owner (thread t % T) keeps code and error in shared memory (the error where the weight was), and each
// thread updates its share of the later columns (c % T == its lane in the row) with one fma each. U's rows come
// through shared memory too, kURows at a time in a ring of three, copied two chunks ahead: read through L1, which
// the blocks' shared memory leaves too small for a 128 x 128 block of U, every column waited for L2 (ncu: ~13
// long-scoreboard stalls per issued instruction). The arithmetic is the torch loop's, step for step, in fp32 with
// explicit rounding (w / s, round half to even, clamp; (w - q * s) / U_jj; w - err * U_jc as one fma, as torch's
// outer-product update compiles), so both paths agree to the last bit except where ptxas or torch round
// differently, and every T gives the same bits.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -c kernels/gptq.cu
#include "gptq.h"

namespace marlin_cli {
namespace {

constexpr int kThreads = 64;          // per block
constexpr int kMaxRowThreads = 8;     // T at most: 8 rows of a warp's 4 words per step
constexpr int kFillThreads = 65536;   // T doubles while rows x T stays within this (~16 warps per SM on 132 SMs)
constexpr int kURows = 4;             // U's rows per chunk: one 2:4 decision's four columns
constexpr int kUSlots = 3;            // chunks in the ring: t's, the next, and the one being copied

// Copies rows [c0 + t0, c0 + t0 + kURows) of U (those below c2: a 2:4 decision at the run's last columns reads the
// diagonal past c1), columns t .. width of row t, into ring slot `dst`, as one cp.async group.
__device__ void copy_u_chunk(const GptqBlockArgs& p, int t0, float (*dst)[kGptqMaxCols]) {
  const int width = p.c2 - p.c0;
  for (int r = 0; r < kURows && t0 + r < width; ++r) {
    const float* src = p.u + static_cast<int64_t>(p.c0 + t0 + r) * p.k + p.c0;
    for (int c = t0 + r + threadIdx.x; c < width; c += kThreads) {
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(&dst[r][c]));
      asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(to), "l"(src + c));
    }
  }
  asm volatile("cp.async.commit_group;");
}

template <int T>
__global__ void __launch_bounds__(kThreads) gptq_block_kernel(const GptqBlockArgs p) {
  constexpr int kRows = kThreads / T;
  // T = 1: rows kPitch apart in a column, an odd number, so the coalesced copies (a row's columns in order) meet
  // 32 banks too; T > 1: a step's words sit at lane * kPitch + row of the warp's 32 / T rows, 3 x 32 / T spreads them
  constexpr int kPitch = T == 1 ? kRows + 1 : 96 / T;
  __shared__ float x[kGptqMaxCols * kPitch];           // column c of block row i at x[c * kPitch + i]
  __shared__ uint8_t codes[kGptqMaxCols * kRows];      // column c of block row i at codes[c * kRows + i]
  __shared__ float us[kUSlots][kURows][kGptqMaxCols];  // U's row c0 + t at us[t / kURows % kUSlots][t % kURows]
  const int row0 = blockIdx.x * kRows;
  const int rows = min(kRows, p.n - row0);
  const int width = p.c2 - p.c0, cols = p.c1 - p.c0;
  for (int e = threadIdx.x; e < kRows * width; e += kThreads) {  // coalesced: a row's columns in order
    const int i = e / width, c = e % width;
    x[c * kPitch + i] = i < rows ? p.w[static_cast<int64_t>(row0 + i) * p.k + p.c0 + c] : 0.f;
  }
  copy_u_chunk(p, 0, us[0]);
  copy_u_chunk(p, kURows, us[1]);

  // Every thread runs the loop, so the barriers see all of the block's threads; rows past n compute on zeros, read row
  // n - 1's scales and mask, and are never written out.
  const int i = threadIdx.x / T, part = threadIdx.x % T;
  const int64_t r = min(row0 + i, p.n - 1);
  const float* s = p.s + r * p.s_row;
  unsigned dropped = 0;  // bit b: column t + b of the current 4-column decision is pruned
  for (int t = 0; t < cols; ++t) {
    const int j = p.c0 + t;
    float(*chunk)[kGptqMaxCols] = us[t / kURows % kUSlots];
    if (t % kURows == 0) {
      // t's chunk has landed (only the next one may be in flight) and every thread is done with the previous one,
      // whose slot takes the chunk after the next
      asm volatile("cp.async.wait_group 1;");
      __syncthreads();
      copy_u_chunk(p, t + 2 * kURows, us[(t / kURows + 2) % kUSlots]);
    }
    const float* u = chunk[t % kURows];  // row j of U, from column c0
    if (p.prune == kPruneSaliency && t % 4 == 0) {
      // the two of columns t .. t + 3 with the smallest w^2 / d^2 are dropped (ties: lower column first), as
      // torch.topk(..., 2, largest=False) picks them
      float cost[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const float v = t + b < width ? x[(t + b) * kPitch + i] : 0.f;
        const float d = t + b < width ? chunk[b][t + b] : 1.f;  // U's diagonal at column j + b
        cost[b] = t + b < width ? __fdiv_rn(__fmul_rn(v, v), __fmul_rn(d, d)) : 0.f;
      }
      dropped = 0;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        int rank = 0;
#pragma unroll
        for (int o = 0; o < 4; ++o) rank += cost[o] < cost[b] || (cost[o] == cost[b] && o < b);
        dropped |= static_cast<unsigned>(rank < 2) << b;
      }
    }
    float* xt = x + t * kPitch + i;
    const float v = *xt, sc = s[j * p.s_col];
    float q = fminf(fmaxf(rintf(__fdiv_rn(v, sc)), -8.f), 7.f);
    if ((p.prune == kPruneSaliency && (dropped >> (t % 4) & 1)) ||
        (p.prune == kPruneMask && !p.keep[r * p.k + j])) {
      q = 0.f;
    }
    const float err = __fdiv_rn(__fsub_rn(v, __fmul_rn(q, sc)), u[t]);
    if (T > 1) __syncwarp();  // every thread of the row has read column t before its owner overwrites it
    if (part == t % T) {
      codes[t * kRows + i] = static_cast<uint8_t>(static_cast<int>(q) + 8);
      *xt = err;  // the weight is done with: its slot keeps the error
    }
#pragma unroll 16
    for (int c = t + 1 + ((part - t - 1) & (T - 1)); c < width; c += T) {
      x[c * kPitch + i] = fmaf(-err, u[c], x[c * kPitch + i]);
    }
    if (T > 1) __syncwarp();  // column t + 1 is updated before the row's threads read it
  }
  __syncthreads();

  for (int e = threadIdx.x; e < rows * width; e += kThreads) {  // codes and errors of [c0, c1), weights after
    const int ri = e / width, c = e % width;
    const int64_t ro = row0 + ri;
    if (c < cols) {
      p.codes[ro * p.k + p.c0 + c] = codes[c * kRows + ri];
      p.errors[ro * p.e_row + p.c0 + c - p.e0] = x[c * kPitch + ri];
    } else {
      p.w[ro * p.k + p.c0 + c] = x[c * kPitch + ri];
    }
  }
}

// A warp per group of a row: each lane sums its columns' weighted errors for every candidate (in registers), then
// the warp adds the lanes' sums and lane 0 keeps the first least. One read of the weights, where torch's search reads
// and writes them about a dozen times per candidate. Each element's error is torch's, rounding for rounding (w / s,
// round half to even, clamp; w - q * s; squared; times the cost); only the order of the sum over j differs.
constexpr int kClipWarps = 8;

__global__ void __launch_bounds__(kClipWarps * 32) clip_scales_kernel(const ClipScalesArgs p) {
  const int64_t groups = p.k / p.g, total = p.n * groups;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * kClipWarps + threadIdx.x / 32;
  if (id >= total) return;  // a whole warp leaves together
  const int lane = threadIdx.x % 32;
  const int64_t row = id / groups, col0 = id % groups * p.g;
  const float* w = p.w + row * p.k + col0;
  float scale[kClipMaxCandidates], sum[kClipMaxCandidates];
#pragma unroll
  for (int c = 0; c < kClipMaxCandidates; ++c) {
    scale[c] = c < p.count ? p.candidates[c * total + id] : 1.f;
    sum[c] = 0.f;
  }
  for (int j = lane; j < p.g; j += 32) {
    const float x = w[j], cost = p.costs ? p.costs[col0 + j] : 1.f;
#pragma unroll
    for (int c = 0; c < kClipMaxCandidates; ++c) {
      if (c < p.count) {
        const float q = fminf(fmaxf(rintf(__fdiv_rn(x, scale[c])), -8.f), 7.f);
        const float d = __fsub_rn(x, __fmul_rn(q, scale[c]));
        const float e = __fmul_rn(d, d);
        sum[c] = __fadd_rn(sum[c], p.costs ? __fmul_rn(e, cost) : e);
      }
    }
  }
  float best = scale[0], least = 0.f;
#pragma unroll
  for (int c = 0; c < kClipMaxCandidates; ++c) {
    if (c < p.count) {
      float v = sum[c];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (c == 0 || v < least) best = scale[c], least = v;
    }
  }
  if (lane == 0) p.scales[id] = best;
}

template <int T>
cudaError_t launch(const GptqBlockArgs& p, cudaStream_t stream) {
  constexpr int rows = kThreads / T;
  gptq_block_kernel<T><<<(p.n + rows - 1) / rows, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t gptq_block(const GptqBlockArgs& p, cudaStream_t stream) {
  if (p.n < 1 || p.k < 1 || p.c0 < 0 || p.c0 >= p.c1 || p.c1 > p.c2 || p.c2 > p.k || p.c2 - p.c0 > kGptqMaxCols ||
      (p.prune != kPruneNone && (p.c0 % 4 || (p.prune == kPruneMask && p.keep == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  int threads = 1;
  while (threads < kMaxRowThreads && static_cast<int64_t>(p.n) * threads * 2 <= kFillThreads) threads *= 2;
  switch (threads) {
    case 1: return launch<1>(p, stream);
    case 2: return launch<2>(p, stream);
    case 4: return launch<4>(p, stream);
    default: return launch<8>(p, stream);
  }
}

cudaError_t clip_scales(const ClipScalesArgs& p, cudaStream_t stream) {
  if (p.n < 1 || p.g < 1 || p.k < p.g || p.k % p.g || p.count < 1 || p.count > kClipMaxCandidates) {
    return cudaErrorInvalidValue;
  }
  const int64_t warps = p.n * (p.k / p.g);
  clip_scales_kernel<<<static_cast<unsigned>((warps + kClipWarps - 1) / kClipWarps), kClipWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace marlin_cli
