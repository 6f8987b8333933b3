// The GPTQ column loop of one block of columns (marlin_cli/algo/gptq.py), as one launch: the launcher the torch
// binding calls. Plain CUDA C++: no PyTorch headers, so `nvcc -c kernels/gptq.cu` compiles on its own.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace marlin_cli {

constexpr int kGptqMaxCols = 128;  // columns [c0, c2) one launch holds per row

struct GptqBlockArgs {
  float* w;            // (n, k) row-major: columns [c0, c2) are read, columns [c1, c2) written back updated
  const float* u;      // (k, k) row-major: the upper Cholesky factor of H^-1
  const float* s;      // scale of row r for column j at s[r * s_row + j * s_col] (s_col = 0: one per row)
  int64_t s_row, s_col;
  uint8_t* codes;      // (n, k) row-major: columns [c0, c1) written (code = step + 8)
  float* errors;       // column j of [c0, c1) of row r at errors[r * e_row + j - e0]
  int64_t e_row;
  int e0;
  int n, k, c0, c1, c2;
  // 2:4 pruning (c0 a multiple of 4): kPruneSaliency drops, at every 4th column, the 2 of the next 4 weights of a row
  // with the smallest w^2 / U_jj^2 (SparseGPT); kPruneMask drops those where keep (n, k) is 0. Dropped: step 0.
  int prune;
  const uint8_t* keep;
};
constexpr int kPruneNone = 0, kPruneSaliency = 1, kPruneMask = 2;

// Quantizes columns [c0, c1) in order, each column's error divided by U's diagonal and propagated to the columns
// after it up to c2 (c2 - c0 <= kGptqMaxCols). Returns cudaSuccess or the launch error (cudaErrorInvalidValue for
// arguments it cannot take).
cudaError_t gptq_block(const GptqBlockArgs& args, cudaStream_t stream);

constexpr int kClipMaxCandidates = 40;  // candidate scales per group at most (algo/scales.py CLIP_FACTORS: 34)

// The clipping search of scales fixed before the solve (marlin_cli/algo/scales.py, clip_scales): for every group of
// g consecutive columns of a row, the candidate scale with the least sum_j c_j (w_j - s q_j)^2, q_j = w_j / s rounded
// to the grid (c_j = 1 without costs), the first of equal sums.
struct ClipScalesArgs {
  const float* w;           // (n, k) row-major
  const float* costs;       // (k,): what a rounding error of each column costs, or nullptr for 1
  const float* candidates;  // (count, n, k / g): candidate c of row r's group q at [(c * n + r) * (k / g) + q]
  float* scales;            // (n, k / g): the chosen candidates
  int64_t n, k;
  int g, count;
};

// Returns cudaSuccess, the launch error, or cudaErrorInvalidValue for arguments it cannot take.
cudaError_t clip_scales(const ClipScalesArgs& args, cudaStream_t stream);

}  // namespace marlin_cli
