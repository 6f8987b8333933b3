// FP16 x INT4 GEMM on the Sparse-MARLIN 2:4 layout (DESIGN.md 3.2 and 5): the launcher the torch binding calls.
// Plain CUDA C++: no PyTorch headers, so `nvcc -c kernels/marlin24.cu` compiles on its own.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "marlin.h"  // the workspace (parts of split strips) is the dense kernel's: workspace_ints(sms)

namespace marlin_cli {

struct Gemm24Args {
  const void* a;      // fp16 (m, k) row-major, contiguous
  const void* b;      // int32 (k / 32, 2 n): the kept codes, 2:4 tile order (see gemm24_kernel_order)
  const void* meta;   // int16 (k / 32, 2 n): the metadata, mma.sp order (see gemm24_kernel_order)
  const void* s;      // fp16 (groups, n), 2:4 column order
  void* c;            // fp16 (m, n) output
  int* workspace;     // int32, workspace_ints(sms) entries
  int64_t workspace_len;
  int m, n, k, groups;
  int sms;            // multiprocessors to spread the work over
  int device;
};

// Returns cudaSuccess or the first error (cudaErrorInvalidValue for arguments the kernel cannot take).
cudaError_t gemm24(const Gemm24Args& args, cudaStream_t stream);

// Whether gemm24 on `device` runs the Hopper (wgmma.sp) kernels, which read b and meta in the kernel order
// (marlin_cli.formats.marlin24.to_kernel_order) rather than as stored.
bool gemm24_kernel_order(int device);

}  // namespace marlin_cli
