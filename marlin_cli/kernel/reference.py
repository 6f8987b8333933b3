"""Plain-torch reference of every kernel op: unpack, dequantize, float32 matmul. Runs on any device."""

from __future__ import annotations

import torch

from marlin_cli import grid
from marlin_cli.formats import marlin, marlin24


def dequantize(b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Marlin-packed B int32 (K/16, 2N) and packed scales (K/g, N) -> float32 W (K, N) in stored row order."""
    codes = marlin.unpack_weight(b.cpu()).to(b.device)
    scales = marlin.unpack_scales(s.cpu()).to(s.device).float()
    return grid.decode_groups(codes, scales)


def gemm(a: torch.Tensor, b: torch.Tensor, s: torch.Tensor, perm: torch.Tensor | None = None) -> torch.Tensor:
    """C (M, N) = A[:, perm] @ dequant(B), accumulated in float32, returned in A's dtype.

    a: (M, K) float; b: int32 (K/16, 2N); s: (K/g, N); perm: int32 (K,) for act-order checkpoints, else None.
    """
    if perm is not None:
        a = a[:, perm.long()]
    return (a.float() @ dequantize(b, s)).to(a.dtype)


def dequantize24(b24: torch.Tensor, meta: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """2:4 B_24 int32 (K/32, 2N), B_meta int16 (K/32, 2N), packed scales (G, N) -> float32 W (K, N) on b24's device."""
    codes, scales = marlin24.unpack(b24, meta, s)
    return grid.decode_groups(codes, scales)


def gemm24(a: torch.Tensor, b24: torch.Tensor, meta: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """C (M, N) = A @ dequant24(B), accumulated in float32, returned in A's dtype. a: (M, K) float."""
    return (a.float() @ dequantize24(b24, meta, s)).to(a.dtype)
