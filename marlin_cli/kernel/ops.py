"""Typed wrappers of the kernel ops. Until a CUDA build is present every op runs through `reference`."""

from __future__ import annotations

import torch

from marlin_cli.kernel import reference


def kernel_name(device: torch.device) -> str:
    """Which implementation `gemm` uses for tensors on `device`."""
    return "reference"


def gemm(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, perm: torch.Tensor | None = None) -> torch.Tensor:
    """C (M, N) = A[:, perm] @ dequant(B): A (M, K) fp16, B int32 (K/16, 2N) Marlin layout, s fp16 (K/g, N)."""
    return reference.gemm(a, b, s, perm)
