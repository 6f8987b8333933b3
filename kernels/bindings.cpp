// Registers the kernels as the torch custom ops marlin_cli::gemm (dense), marlin_cli::gemm24 (2:4) with
// marlin_cli::gemm24_kernel_order (which order of its weights it reads on a device), marlin_cli::gptq_block (the GPTQ
// column loop) and marlin_cli::clip_scales (the clipping search of fixed scales).
// Only argument plumbing lives here; the shape rules are enforced (with user-facing messages) in
// marlin_cli/kernel/ops.py and re-checked below as a last line.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "gptq.h"
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

void gptq_block_cuda(at::Tensor& w, const at::Tensor& u, const at::Tensor& s, int64_t s_row, int64_t s_col,
                     at::Tensor& codes, at::Tensor& errors, int64_t e0, int64_t c0, int64_t c1, int64_t c2,
                     const std::optional<at::Tensor>& keep, int64_t prune) {
  const char* op = "marlin_cli::gptq_block";
  const at::Tensor* tensors[] = {&w, &u, &s, &codes, &errors};
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->device() == w.device(), op,
                ": contiguous CUDA tensors on one device only");
  }
  TORCH_CHECK(w.scalar_type() == at::kFloat && u.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat &&
                  errors.scalar_type() == at::kFloat && codes.scalar_type() == at::kByte,
              op, ": w, u, s and errors must be float32, codes uint8");
  TORCH_CHECK(w.dim() == 2 && codes.sizes() == w.sizes() && u.dim() == 2 && u.size(0) == w.size(1) &&
                  u.size(1) == w.size(1) && errors.dim() == 2 && errors.size(0) == w.size(0),
              op, ": bad shapes w=", w.sizes(), " u=", u.sizes(), " codes=", codes.sizes(), " errors=", errors.sizes());
  const int64_t n = w.size(0), k = w.size(1);
  TORCH_CHECK(n <= INT32_MAX && k <= INT32_MAX && 0 <= c0 && c0 < c1 && c1 <= c2 && c2 <= k &&
                  c2 - c0 <= marlin_cli::kGptqMaxCols && e0 <= c0 && c1 - e0 <= errors.size(1),
              op, ": bad column range [", c0, ", ", c1, ", ", c2, ") for k=", k);
  TORCH_CHECK(s_row >= 0 && s_col >= 0 && (n - 1) * s_row + (c1 - 1) * s_col < s.numel(), op,
              ": scale strides reach past s");
  TORCH_CHECK(prune >= marlin_cli::kPruneNone && prune <= marlin_cli::kPruneMask && (prune == 0 || c0 % 4 == 0), op,
              ": bad pruning mode ", prune, " at column ", c0);
  if (prune == marlin_cli::kPruneMask) {
    TORCH_CHECK(keep.has_value() && keep->is_cuda() && keep->device() == w.device() && keep->is_contiguous() &&
                    keep->scalar_type() == at::kByte && keep->sizes() == w.sizes(),
                op, ": keep must be a contiguous uint8 CUDA tensor of w's shape");
  }
  const c10::cuda::CUDAGuard guard(w.device());
  marlin_cli::GptqBlockArgs args{};
  args.prune = static_cast<int>(prune);
  args.keep = prune == marlin_cli::kPruneMask ? keep->data_ptr<uint8_t>() : nullptr;
  args.w = w.data_ptr<float>();
  args.u = u.data_ptr<float>();
  args.s = s.data_ptr<float>();
  args.s_row = s_row;
  args.s_col = s_col;
  args.codes = codes.data_ptr<uint8_t>();
  args.errors = errors.data_ptr<float>();
  args.e_row = errors.size(1);
  args.e0 = static_cast<int>(e0);
  args.n = static_cast<int>(n);
  args.k = static_cast<int>(k);
  args.c0 = static_cast<int>(c0);
  args.c1 = static_cast<int>(c1);
  args.c2 = static_cast<int>(c2);
  const cudaError_t err = marlin_cli::gptq_block(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, " failed: ", cudaGetErrorString(err));
}

void clip_scales_cuda(const at::Tensor& w, const std::optional<at::Tensor>& costs, const at::Tensor& candidates,
                      at::Tensor& scales) {
  const char* op = "marlin_cli::clip_scales";
  const at::Tensor* tensors[] = {&w, &candidates, &scales};
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->is_cuda() && t->is_contiguous() && t->device() == w.device() && t->scalar_type() == at::kFloat,
                op, ": contiguous float32 CUDA tensors on one device only");
  }
  TORCH_CHECK(w.dim() == 2 && scales.dim() == 2 && scales.size(0) == w.size(0) && scales.size(1) >= 1 &&
                  w.size(1) % scales.size(1) == 0 && candidates.dim() == 3 && candidates.size(1) == w.size(0) &&
                  candidates.size(2) == scales.size(1) && candidates.size(0) >= 1 &&
                  candidates.size(0) <= marlin_cli::kClipMaxCandidates,
              op, ": bad shapes w=", w.sizes(), " candidates=", candidates.sizes(), " scales=", scales.sizes());
  TORCH_CHECK(w.size(1) / scales.size(1) <= INT32_MAX, op, ": groups of more than 2^31 columns");
  if (costs.has_value()) {
    TORCH_CHECK(costs->is_cuda() && costs->device() == w.device() && costs->is_contiguous() &&
                    costs->scalar_type() == at::kFloat && costs->dim() == 1 && costs->size(0) == w.size(1),
                op, ": costs must be a contiguous float32 CUDA tensor of w's columns");
  }
  const c10::cuda::CUDAGuard guard(w.device());
  marlin_cli::ClipScalesArgs args{};
  args.w = w.data_ptr<float>();
  args.costs = costs.has_value() ? costs->data_ptr<float>() : nullptr;
  args.candidates = candidates.data_ptr<float>();
  args.scales = scales.data_ptr<float>();
  args.n = w.size(0);
  args.k = w.size(1);
  args.g = static_cast<int>(w.size(1) / scales.size(1));
  args.count = static_cast<int>(candidates.size(0));
  const cudaError_t err = marlin_cli::clip_scales(args, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, op, " failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY(marlin_cli, m) {
  m.def("gemm(Tensor a, Tensor b, Tensor s, Tensor? perm, Tensor(a!) workspace) -> Tensor");
  m.def("gemm24(Tensor a, Tensor b, Tensor meta, Tensor s, Tensor(a!) workspace) -> Tensor");
  m.def("gemm24_kernel_order(int device) -> bool",
        [](int64_t device) { return marlin_cli::gemm24_kernel_order(static_cast<int>(device)); });
  m.def(
      "gptq_block(Tensor(a!) w, Tensor u, Tensor s, int s_row, int s_col, Tensor(b!) codes, Tensor(c!) errors, "
      "int e0, int c0, int c1, int c2, Tensor? keep, int prune) -> ()");
  m.def("clip_scales(Tensor w, Tensor? costs, Tensor candidates, Tensor(a!) scales) -> ()");
}

TORCH_LIBRARY_IMPL(marlin_cli, CUDA, m) {
  m.impl("gemm", &gemm_cuda);
  m.impl("gemm24", &gemm24_cuda);
  m.impl("gptq_block", &gptq_block_cuda);
  m.impl("clip_scales", &clip_scales_cuda);
}
