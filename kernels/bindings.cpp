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

// Checks both ops share: device, rank, dtypes, contiguity and the shape rules (b holds `k_per_row` rows of K per
// row; n is a multiple of `n_tile`).
void check_common(const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& s,
                  const at::Tensor& workspace, int64_t k_per_row, int64_t n_tile) {
  TORCH_CHECK(a.is_cuda() && b.is_cuda() && s.is_cuda() && workspace.is_cuda(), op, ": CUDA tensors only");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && s.dim() == 2, op, ": a, b, s must be 2-D");
  TORCH_CHECK(a.scalar_type() == at::kHalf && s.scalar_type() == at::kHalf, op, ": a and s must be fp16");
  TORCH_CHECK(b.scalar_type() == at::kInt && workspace.scalar_type() == at::kInt, op,
              ": b and workspace must be int32");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && s.is_contiguous() && workspace.is_contiguous(), op,
              ": tensors must be contiguous");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1) / 2;
  TORCH_CHECK(m >= 1 && k % 128 == 0 && n % n_tile == 0 && b.size(0) * k_per_row == k && s.size(1) == n, op,
              ": bad shapes a=", a.sizes(), " b=", b.sizes(), " s=", s.sizes());
  TORCH_CHECK(m <= INT32_MAX && k <= INT32_MAX && n <= INT32_MAX, op, ": dimension too large");
}

// The argument fields both ops share, for the current device; returns the output C, allocated here.
template <class Args>
at::Tensor fill_common(Args& args, const char* op, const at::Tensor& a, const at::Tensor& b, const at::Tensor& s,
                       at::Tensor& workspace) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  TORCH_CHECK(workspace.numel() >= marlin_cli::workspace_ints(sms), op, ": workspace needs ",
              marlin_cli::workspace_ints(sms), " int32 entries, got ", workspace.numel());
  at::Tensor c = at::empty({a.size(0), b.size(1) / 2}, a.options());
  args.a = a.data_ptr();
  args.b = b.data_ptr();
  args.s = s.data_ptr();
  args.c = c.data_ptr();
  args.workspace = workspace.data_ptr<int>();
  args.workspace_len = workspace.numel();
  args.m = static_cast<int>(a.size(0));
  args.n = static_cast<int>(c.size(1));
  args.k = static_cast<int>(a.size(1));
  args.groups = static_cast<int>(s.size(0));
  args.sms = sms;
  args.device = a.get_device();
  return c;
}

at::Tensor gemm_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& s, const std::optional<at::Tensor>& perm,
                     at::Tensor& workspace) {
  check_common("marlin_cli::gemm", a, b, s, workspace, 16, 64);
  const c10::cuda::CUDAGuard guard(a.device());
  marlin_cli::GemmArgs args{};
  at::Tensor c = fill_common(args, "marlin_cli::gemm", a, b, s, workspace);
  at::Tensor a_perm;
  if (perm.has_value()) {
    const at::Tensor& p = *perm;
    TORCH_CHECK(p.is_cuda() && p.scalar_type() == at::kInt && p.dim() == 1 && p.size(0) == a.size(1) &&
                    p.is_contiguous(),
                "marlin_cli::gemm: perm must be a contiguous int32 CUDA tensor of shape (k,)");
    a_perm = at::empty_like(a);
    args.perm = p.data_ptr<int>();
    args.a_perm = a_perm.data_ptr();
  }
  const cudaError_t err = marlin_cli::gemm(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "marlin_cli::gemm failed: ", cudaGetErrorString(err));
  return c;
}

at::Tensor gemm24_cuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& meta, const at::Tensor& s,
                       at::Tensor& workspace) {
  check_common("marlin_cli::gemm24", a, b, s, workspace, 32, 128);
  TORCH_CHECK(meta.is_cuda() && meta.scalar_type() == at::kShort && meta.sizes() == b.sizes() && meta.is_contiguous(),
              "marlin_cli::gemm24: meta must be a contiguous int16 CUDA tensor of b's shape");
  const c10::cuda::CUDAGuard guard(a.device());
  marlin_cli::Gemm24Args args{};
  at::Tensor c = fill_common(args, "marlin_cli::gemm24", a, b, s, workspace);
  args.meta = meta.data_ptr();
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
