// Registers the kernels as the torch custom ops marlin_cli::gemm (dense) and marlin_cli::gemm24 (2:4). Only argument
// plumbing lives here; the shape rules are enforced (with user-facing messages) in marlin_cli/kernel/ops.py and
// re-checked below as a last line.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "marlin.h"
#include "marlin24.h"

namespace {

// Multiprocessors of the current device, after checking that the workspace covers them.
int checked_sms(const at::Tensor& workspace, const char* op) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  TORCH_CHECK(workspace.numel() >= marlin_cli::workspace_ints(sms), op, ": workspace needs ",
              marlin_cli::workspace_ints(sms), " int32 entries, got ", workspace.numel());
  return sms;
}

at::Tensor gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& s, const std::optional<at::Tensor>& perm,
                     at::Tensor& workspace) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && s.is_cuda() && workspace.is_cuda(), "marlin_cli::gemm: CUDA tensors only");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && s.dim() == 2, "marlin_cli::gemm: a, b, s must be 2-D");
  TORCH_CHECK(a.scalar_type() == at::kHalf && s.scalar_type() == at::kHalf, "marlin_cli::gemm: a and s must be fp16");
  TORCH_CHECK(b.scalar_type() == at::kInt && workspace.scalar_type() == at::kInt,
              "marlin_cli::gemm: b and workspace must be int32");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && s.is_contiguous() && workspace.is_contiguous(),
              "marlin_cli::gemm: tensors must be contiguous");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1) / 2;
  TORCH_CHECK(m >= 1 && k % 128 == 0 && n % 64 == 0 && b.size(0) * 16 == k && s.size(1) == n,
              "marlin_cli::gemm: bad shapes a=", a.sizes(), " b=", b.sizes(), " s=", s.sizes());
  TORCH_CHECK(m <= INT32_MAX && k <= INT32_MAX && n <= INT32_MAX, "marlin_cli::gemm: dimension too large");
  const c10::cuda::CUDAGuard guard(a.device());
  const int sms = checked_sms(workspace, "marlin_cli::gemm");

  at::Tensor c = at::empty({m, n}, a.options());
  at::Tensor a_perm;
  marlin_cli::GemmArgs args{};
  if (perm.has_value()) {
    const at::Tensor& p = *perm;
    TORCH_CHECK(p.is_cuda() && p.scalar_type() == at::kInt && p.dim() == 1 && p.size(0) == k && p.is_contiguous(),
                "marlin_cli::gemm: perm must be a contiguous int32 CUDA tensor of shape (k,)");
    a_perm = at::empty_like(a);
    args.perm = p.data_ptr<int>();
    args.a_perm = a_perm.data_ptr();
  }
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.s = s.data_ptr();
  args.c = c.data_ptr();
  args.workspace = workspace.data_ptr<int>();
  args.workspace_len = workspace.numel();
  args.m = static_cast<int>(m);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  args.groups = static_cast<int>(s.size(0));
  args.sms = sms;
  args.device = a.get_device();
  const cudaError_t err = marlin_cli::gemm(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "marlin_cli::gemm failed: ", cudaGetErrorString(err));
  return c;
}

at::Tensor gemm24_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& meta, const at::Tensor& s,
                       at::Tensor& workspace) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && meta.is_cuda() && s.is_cuda() && workspace.is_cuda(),
              "marlin_cli::gemm24: CUDA tensors only");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && s.dim() == 2 && meta.sizes() == b.sizes(),
              "marlin_cli::gemm24: a, b, s must be 2-D and meta the shape of b");
  TORCH_CHECK(a.scalar_type() == at::kHalf && s.scalar_type() == at::kHalf, "marlin_cli::gemm24: a and s must be fp16");
  TORCH_CHECK(b.scalar_type() == at::kInt && meta.scalar_type() == at::kShort && workspace.scalar_type() == at::kInt,
              "marlin_cli::gemm24: b and workspace must be int32, meta int16");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && meta.is_contiguous() && s.is_contiguous() &&
                  workspace.is_contiguous(),
              "marlin_cli::gemm24: tensors must be contiguous");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1) / 2;
  TORCH_CHECK(m >= 1 && k % 128 == 0 && n % 128 == 0 && b.size(0) * 32 == k && s.size(1) == n,
              "marlin_cli::gemm24: bad shapes a=", a.sizes(), " b=", b.sizes(), " s=", s.sizes());
  TORCH_CHECK(m <= INT32_MAX && k <= INT32_MAX && n <= INT32_MAX, "marlin_cli::gemm24: dimension too large");
  const c10::cuda::CUDAGuard guard(a.device());
  const int sms = checked_sms(workspace, "marlin_cli::gemm24");

  at::Tensor c = at::empty({m, n}, a.options());
  marlin_cli::Gemm24Args args{};
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.meta = meta.data_ptr();
  args.s = s.data_ptr();
  args.c = c.data_ptr();
  args.workspace = workspace.data_ptr<int>();
  args.workspace_len = workspace.numel();
  args.m = static_cast<int>(m);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  args.groups = static_cast<int>(s.size(0));
  args.sms = sms;
  args.device = a.get_device();
  const cudaError_t err = marlin_cli::gemm24(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "marlin_cli::gemm24 failed: ", cudaGetErrorString(err));
  return c;
}

}  // namespace

TORCH_LIBRARY(marlin_cli, m) {
  m.def("gemm(Tensor a, Tensor b, Tensor s, Tensor? perm, Tensor(a!) workspace) -> Tensor");
  m.def("gemm24(Tensor a, Tensor b, Tensor meta, Tensor s, Tensor(a!) workspace) -> Tensor");
}

TORCH_LIBRARY_IMPL(marlin_cli, CUDA, m) {
  m.impl("gemm", &gemm_cuda);
  m.impl("gemm24", &gemm24_cuda);
}
