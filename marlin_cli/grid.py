"""The 4-bit symmetric grid shared by every format and algorithm: codes 0..15, value = (code - 8) * scale."""

from __future__ import annotations

import torch

BITS = 4
MAXQ = 2**BITS - 1  # largest code
ZERO = 2 ** (BITS - 1)  # code of the value 0


def round_signed(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Signed grid steps code - ZERO (-8..7) of `w` on the grid of `scale`, in the dtype of `w`."""
    return torch.clamp(torch.round(w / scale), -ZERO, MAXQ - ZERO)


def encode(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Codes (same shape as `w`, uint8) of `w` on the grid of `scale` (broadcast against `w`)."""
    return (round_signed(w, scale) + ZERO).to(torch.uint8)


def decode(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Values of `codes` on the grid of `scale`, in the dtype of `scale`."""
    return (codes.to(scale.dtype) - ZERO) * scale


def expand_groups(scales: torch.Tensor, rows: int) -> torch.Tensor:
    """(K/g, N) group scales -> (K, N): each group's row repeated over its g input rows."""
    return scales.repeat_interleave(rows // scales.shape[0], dim=0)
