"""What every quantization algorithm returns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from marlin_cli import grid


@dataclass(frozen=True)
class QuantResult:
    """One quantized layer, oriented like the checkpoint: W is (K, N) = Linear.weight.T.

    codes: uint8 (K, N), rows in stored order; scales: float32 (G, N) per group of stored rows (fp16-exact);
    perm: int64 (K,), stored row i is input channel perm[i], or None for the natural order;
    damp: the damping the solve used (after retries; 0 for RTN);
    weighted_error: tr(dW H dW^T) of the change dW from the weight the caller gave to the dequantized one, on the
    Hessian H it gave, where a solve has it for free (GPTQ, SparseGPT: from its own column errors), else None.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    perm: torch.Tensor | None = None
    damp: float = 0.0
    weighted_error: float | None = None

    def weight(self) -> torch.Tensor:
        """Dequantized weight (N, K) in the original input-channel order, float32."""
        w = grid.decode_groups(self.codes, self.scales.float())
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(0, self.perm, w)
        return w.T


def relative_error(weight: torch.Tensor, approx: torch.Tensor) -> float:
    """||weight - approx||^2 / ||weight||^2: the error of a layer quantized with no Hessian to weigh it."""
    return float((weight - approx).square_().sum() / weight.square().sum())
