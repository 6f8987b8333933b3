// The GPTQ column loop of one block of columns on the GPU (marlin_cli/algo/gptq.py is the definition; its torch loop
// launches about eight small kernels per column, which bounds the solve by launch latency).
//
// Rows are independent inside the loop: each warp takes one row and holds its columns [c0, c2) in registers, four
// per lane (column c0 + t on lane t % 32, register t / 32). Per column, the owning lane rounds the weight to the
// grid, divides the error by U's diagonal and stores code and error; one shuffle hands the error to the warp, and
// every lane updates its later columns with one fma each. The arithmetic is the torch loop's, step for step, in
// fp32 with explicit rounding (w / s, round half to even, clamp; (w - q * s) / U_jj; w - err * U_jc as one fma, as
// torch's outer-product update compiles), so both paths agree to the last bit except where ptxas or torch round
// differently. With 2:4 pruning the four columns a decision covers sit on four neighbouring lanes (c0 and the
// decision's column are multiples of 4), which trade their saliencies by shuffles.
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_80,code=sm_80 -c kernels/gptq.cu
#include "gptq.h"

namespace marlin_cli {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kSlots = kGptqMaxCols / 32;

__global__ void __launch_bounds__(kWarpsPerBlock * 32) gptq_block_kernel(const GptqBlockArgs p) {
  const int lane = threadIdx.x % 32;
  const int r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= p.n) return;  // whole warps: r is uniform within a warp
  const int width = p.c2 - p.c0, cols = p.c1 - p.c0;
  float* w = p.w + static_cast<int64_t>(r) * p.k + p.c0;
  float x[kSlots];
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int t = lane + 32 * i;
    x[i] = t < width ? w[t] : 0.f;
  }
  const float* s = p.s + r * p.s_row;
  bool dropped = false;  // this lane's column in the current 4-column decision is pruned (kPruneSaliency)
#pragma unroll
  for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll 1
    for (int owner = 0; owner < 32; ++owner) {
      const int t = 32 * slot + owner;
      if (t >= cols) break;
      const int j = p.c0 + t;
      const float* u = p.u + static_cast<int64_t>(j) * p.k + p.c0;  // row j of U, from column c0
      if (p.prune == kPruneSaliency && t % 4 == 0) {
        // lanes owner .. owner + 3 hold columns t .. t + 3: each ranks its w^2 / d^2 among the four (ties: lower
        // column first) and the two smallest are dropped, as torch.topk(..., 2, largest=False) picks them
        float cost = 0.f;
        if ((lane & ~3) == owner && t + (lane & 3) < width) {
          const float d = __ldg(u + t + (lane & 3) * (p.k + 1));  // U's diagonal at column j + lane % 4
          cost = __fdiv_rn(__fmul_rn(x[slot], x[slot]), __fmul_rn(d, d));
        }
        int rank = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float other = __shfl_sync(0xffffffffu, cost, (lane & ~3) | i);
          rank += other < cost || (other == cost && i < (lane & 3));
        }
        dropped = rank < 2;
      }
      float err = 0.f;
      if (lane == owner) {
        const float v = x[slot], sc = s[j * p.s_col];
        float q = fminf(fmaxf(rintf(__fdiv_rn(v, sc)), -8.f), 7.f);
        if ((p.prune == kPruneSaliency && dropped) ||
            (p.prune == kPruneMask && !p.keep[static_cast<int64_t>(r) * p.k + j])) {
          q = 0.f;
        }
        err = __fdiv_rn(__fsub_rn(v, __fmul_rn(q, sc)), u[t]);
        p.codes[static_cast<int64_t>(r) * p.k + j] = static_cast<uint8_t>(static_cast<int>(q) + 8);
        p.errors[r * p.e_row + j - p.e0] = err;
      }
      err = __shfl_sync(0xffffffffu, err, owner);
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int c = lane + 32 * i;
        if (c > t && c < width) x[i] = fmaf(-err, __ldg(u + c), x[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int t = lane + 32 * i;
    if (t >= cols && t < width) w[t] = x[i];
  }
}

}  // namespace

cudaError_t gptq_block(const GptqBlockArgs& p, cudaStream_t stream) {
  if (p.n < 1 || p.k < 1 || p.c0 < 0 || p.c0 >= p.c1 || p.c1 > p.c2 || p.c2 > p.k || p.c2 - p.c0 > kGptqMaxCols ||
      (p.prune != kPruneNone && (p.c0 % 4 || (p.prune == kPruneMask && p.keep == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  const int blocks = (p.n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  gptq_block_kernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace marlin_cli
