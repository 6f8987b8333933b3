"""Layer Hessians H = (2/n) sum x x^T, accumulated as a running mean so float32 never sees a large sum."""

from __future__ import annotations

import torch

# cuBLAS multiplies fp16 / bf16 matrices into a float32 result (torch.addmm's out_dtype, where this torch has it)
_HALF_INPUTS_FLOAT_OUT = "dtype_out" in torch.ops.aten.addmm.overloads()


class Hessian:
    """Running H for one group of layers that read the same input of width `columns`."""

    def __init__(self, columns: int, device: torch.device | str = "cpu") -> None:
        self.matrix = torch.zeros(columns, columns, dtype=torch.float32, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        """Fold in a batch of inputs (..., columns)."""
        x = x.reshape(-1, x.shape[-1]).to(self.matrix.device)
        total = self.tokens + x.shape[0]
        # H <- H * old/total + (2/total) x^T x: the old mean is rescaled and the batch's sum enters scaled, in one
        # call, so no running sum grows with the token count
        beta, alpha = self.tokens / total, 2.0 / total
        if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and _HALF_INPUTS_FLOAT_OUT:
            # fp16 / bf16 inputs go to the tensor cores unconverted: the products are exact in float32, the sums
            # lose a few low bits (~2.5e-5 of the largest entry on the H200, against ~6e-7 from float32 inputs;
            # tests/gpu/test_hessian.py), 400 times below the default damping. 28672-wide inputs over 262,144
            # tokens: 7.98 s -> 0.67 s on the H200 (scripts/bench_gptq.py).
            torch.addmm(self.matrix, x.T, x, beta=beta, alpha=alpha, out_dtype=torch.float32, out=self.matrix)
        else:
            x = x.float()
            self.matrix.addmm_(x.T, x, beta=beta, alpha=alpha)
        self.tokens = total


def weighted_error(delta: torch.Tensor, hessian: torch.Tensor, tf32: bool = False) -> float:
    """Output error of a weight change on the inputs behind `hessian`: sum over rows of d H d^T.

    delta: (N, K) weight difference; hessian: (K, K). Equals (2/n) * ||X delta^T||^2 for the captured inputs X.
    `tf32`: a float32 product on a GPU runs on the tensor cores, its inputs rounded to 10-bit mantissas, for the
    report (28672 x 8192 on the H200: 0.262 -> 0.038 s, 3.8e-5 from the float64 value); exact comparisons leave it
    off.
    """
    delta = delta.to(hessian.dtype)
    if not (tf32 and hessian.is_cuda and hessian.dtype == torch.float32):
        return float(((delta @ hessian) * delta).sum())
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        product = delta @ hessian
    finally:
        torch.set_float32_matmul_precision(before)
    return float((product * delta).sum())
