"""Layer Hessians H = (2/n) sum x x^T, accumulated as a running mean so float32 never sees a large sum."""

from __future__ import annotations

import torch


class Hessian:
    """Running H for one group of layers that read the same input of width `columns`."""

    def __init__(self, columns: int, device: torch.device | str = "cpu") -> None:
        self.matrix = torch.zeros(columns, columns, dtype=torch.float32, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        """Fold in a batch of inputs (..., columns)."""
        x = x.reshape(-1, x.shape[-1]).to(self.matrix.device, torch.float32)
        n = x.shape[0]
        total = self.tokens + n
        # rescale the old mean, then add the new tokens pre-scaled by sqrt(2/total): no running sum ever grows
        self.matrix.mul_(self.tokens / total)
        x = x * (2.0 / total) ** 0.5
        self.matrix.addmm_(x.T, x)
        self.tokens = total


def weighted_error(delta: torch.Tensor, hessian: torch.Tensor) -> float:
    """Output error of a weight change on the inputs behind `hessian`: sum over rows of d H d^T.

    delta: (N, K) weight difference; hessian: (K, K). Equals (2/n) * ||X delta^T||^2 for the captured inputs X.
    """
    delta = delta.to(hessian.dtype)
    return float(((delta @ hessian) * delta).sum())
