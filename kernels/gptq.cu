// The GPTQ column loop of one block of columns on the GPU (marlin_cli/algo/gptq.py is the definition; its torch loop
// launches about eight small kernels per column, which bounds the solve by launch latency).
//
// Rows are independent inside the loop: each thread takes one row. A block's rows sit in shared memory column by
// column (kRowsPerBlock + 1 words apart: a warp's 32 rows of one column hit 32 banks, and so do the block's
// coalesced copies in and out, which walk a row's columns). Per column a thread rounds its weight to the grid,
// divides the error by U's diagonal, keeps code and error in shared memory (the error where the weight was) and
// updates its later columns with one fma each, reading U's row once per warp (every lane reads the same word). The
// arithmetic is the torch loop's, step for step, in fp32 with explicit rounding (w / s, round half to even, clamp;
// (w - q * s) / U_jj; w - err * U_jc as one fma, as torch's outer-product update compiles), so both paths agree to
// the last bit except where ptxas or torch round differently. A warp per row (the first form of this kernel) spent
// its issue slots on the one lane that owned each column: --clip's search, which runs this loop on every candidate
// scale of a group, was issue-bound there (docs/gptq-log.md c3).
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -c kernels/gptq.cu
#include "gptq.h"

namespace marlin_cli {
namespace {

constexpr int kRowsPerBlock = 64;
constexpr int kPitch = kRowsPerBlock + 1;  // words between a block's columns in shared memory

__global__ void __launch_bounds__(kRowsPerBlock) gptq_block_kernel(const GptqBlockArgs p) {
  __shared__ float x[kGptqMaxCols * kPitch];            // column c of block row i at x[c * kPitch + i]
  __shared__ uint8_t codes[kGptqMaxCols * kRowsPerBlock];  // column c of block row i at codes[c * 64 + i]
  const int row0 = blockIdx.x * kRowsPerBlock;
  const int rows = min(kRowsPerBlock, p.n - row0);
  const int width = p.c2 - p.c0, cols = p.c1 - p.c0;
  for (int e = threadIdx.x; e < rows * width; e += kRowsPerBlock) {  // coalesced: a row's columns in order
    const int i = e / width, c = e % width;
    x[c * kPitch + i] = p.w[static_cast<int64_t>(row0 + i) * p.k + p.c0 + c];
  }
  __syncthreads();

  const int i = threadIdx.x;
  if (i < rows) {
    const int64_t r = row0 + i;
    const float* s = p.s + r * p.s_row;
    unsigned dropped = 0;  // bit b: column t + b of the current 4-column decision is pruned
    for (int t = 0; t < cols; ++t) {
      const int j = p.c0 + t;
      const float* u = p.u + static_cast<int64_t>(j) * p.k + p.c0;  // row j of U, from column c0
      if (p.prune == kPruneSaliency && t % 4 == 0) {
        // the two of columns t .. t + 3 with the smallest w^2 / d^2 are dropped (ties: lower column first), as
        // torch.topk(..., 2, largest=False) picks them
        float cost[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const float v = t + b < width ? x[(t + b) * kPitch + i] : 0.f;
          const float d = t + b < width ? __ldg(u + t + b * (p.k + 1)) : 1.f;  // U's diagonal at column j + b
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
      const float err = __fdiv_rn(__fsub_rn(v, __fmul_rn(q, sc)), __ldg(u + t));
      codes[t * kRowsPerBlock + i] = static_cast<uint8_t>(static_cast<int>(q) + 8);
      *xt = err;  // the weight is done with: its slot keeps the error
#pragma unroll 16
      for (int c = t + 1; c < width; ++c) x[c * kPitch + i] = fmaf(-err, __ldg(u + c), x[c * kPitch + i]);
    }
  }
  __syncthreads();

  for (int e = threadIdx.x; e < rows * width; e += kRowsPerBlock) {  // codes and errors of [c0, c1), weights after
    const int ri = e / width, c = e % width;
    const int64_t r = row0 + ri;
    if (c < cols) {
      p.codes[r * p.k + p.c0 + c] = codes[c * kRowsPerBlock + ri];
      p.errors[r * p.e_row + p.c0 + c - p.e0] = x[c * kPitch + ri];
    } else {
      p.w[r * p.k + p.c0 + c] = x[c * kPitch + ri];
    }
  }
}

}  // namespace

cudaError_t gptq_block(const GptqBlockArgs& p, cudaStream_t stream) {
  if (p.n < 1 || p.k < 1 || p.c0 < 0 || p.c0 >= p.c1 || p.c1 > p.c2 || p.c2 > p.k || p.c2 - p.c0 > kGptqMaxCols ||
      (p.prune != kPruneNone && (p.c0 % 4 || (p.prune == kPruneMask && p.keep == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  const int blocks = (p.n + kRowsPerBlock - 1) / kRowsPerBlock;
  gptq_block_kernel<<<blocks, kRowsPerBlock, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace marlin_cli
