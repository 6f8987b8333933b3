// FP16 x INT4 GEMM on the MARLIN dense layout (DESIGN.md 3.1 and 5): the launcher the torch binding calls.
// Plain CUDA C++: no PyTorch headers, so `nvcc -c kernels/marlin.cu` compiles on its own.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace marlin_cli {

// The workspace is one int32 buffer holding fp32 parts of split column strips: two slots per block of at most
// kMaxTileElems floats each, for up to kMaxBlocksPerSm blocks per SM; then kFlagsPerBlock counters per block, with
// which the warp-specialized kernels' blocks hand each other parts. Each launch writes the slots before it reads
// them; the counters must be zero before the first launch (allocate the workspace zeroed), and every launch leaves
// them zero.
constexpr int64_t kMaxTileElems = 64 * 256;
constexpr int kMaxBlocksPerSm = 2;
constexpr int kFlagsPerBlock = 2;

inline int64_t workspace_part_ints(int sms) {
  return static_cast<int64_t>(sms) * kMaxBlocksPerSm * 2 * kMaxTileElems;
}
inline int64_t workspace_ints(int sms) {
  return workspace_part_ints(sms) + static_cast<int64_t>(sms) * kMaxBlocksPerSm * kFlagsPerBlock;
}

struct GemmArgs {
  const void* a;      // fp16 (m, k) row-major, contiguous
  const void* b;      // int32 (k / 16, 2 n), Marlin tile order
  const void* s;      // fp16 (groups, n), Marlin column order
  const int* perm;    // int32 (k,) or nullptr: the kernel computes a[:, perm] @ W
  void* a_perm;       // fp16 (m, k) scratch for the gathered A; only read when perm != nullptr
  void* c;            // fp16 (m, n) output
  int* workspace;     // int32, workspace_ints(sms) entries
  int64_t workspace_len;
  int m, n, k, groups;
  int sms;            // multiprocessors to spread the work over
  int device;
};

// Returns cudaSuccess or the first error (cudaErrorInvalidValue for arguments the kernel cannot take).
cudaError_t gemm(const GemmArgs& args, cudaStream_t stream);

}  // namespace marlin_cli
