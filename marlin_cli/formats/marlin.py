"""The MARLIN dense layout (DESIGN.md 3.1): pure, bit-exact pack and unpack.

W is handled as (K, N) = Linear.weight.T with 4-bit codes 0..15. The packed weight is int32 (K/16, 2N): 16x16 tiles,
each 16x64 strip reshuffled into the mma.m16n8k16 B-fragment order, 8 codes per int32. Scales are fp16 (K/g, N) with
their columns permuted to match; a layer with one group (per-channel scales) uses the per-channel permutation.
"""

from __future__ import annotations

import functools

import torch

from marlin_cli import grid
from marlin_cli.config import GROUP_SIZES
from marlin_cli.errors import ShapeError

TILE = 16


def shape_problem(k: int, n: int, group_size: int) -> str | None:
    """Why a (K, N) layer cannot be stored in this layout with `group_size`, or None when it can."""
    if k % 128:
        return f"in_features={k} is not a multiple of 128 (Marlin tile)"
    if n % 64:
        return f"out_features={n} is not a multiple of 64 (Marlin tile)"
    if group_size not in GROUP_SIZES:
        return f"group size {group_size} is not one of {GROUP_SIZES}"
    if group_size != -1 and k % group_size:
        return f"in_features={k} is not a multiple of the group size {group_size}"
    return None


@functools.cache
def weight_perm() -> torch.Tensor:
    """Permutation of one 16x64 strip (1024 codes): packed[:, i] = unpacked[:, perm[i]]."""
    perm: list[int] = []
    for i in range(32):
        col = i // 4
        lane = [
            16 * row + col + 8 * block
            for block in (0, 1)
            for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)
        ]
        for j in range(4):  # the four 16x16 tiles of the strip
            perm.extend(p + 256 * j for p in lane)
    # interleave so the int4 -> fp16 conversion works on pairs of nibbles
    return torch.tensor(perm).reshape(-1, 8)[:, [0, 2, 4, 6, 1, 3, 5, 7]].reshape(-1)


@functools.cache
def scale_perm(grouped: bool) -> torch.Tensor:
    """Column permutation of the scales: within 64 columns (grouped) or 32 columns (per channel)."""
    if grouped:
        return torch.tensor([i + 8 * j for i in range(8) for j in range(8)])
    return torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])


def _check_tiles(k: int, n: int) -> None:
    problem = shape_problem(k, n, -1)
    if problem is not None:
        raise ShapeError(problem)


def pack_weight(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes (K, N) in 0..15 -> int32 (K/16, 2N) in the Marlin tile order."""
    k, n = codes.shape
    _check_tiles(k, n)
    t = codes.to(torch.uint8).reshape(k // TILE, TILE, n // TILE, TILE).permute(0, 2, 1, 3)  # (K/16, N/16, 16, 16)
    t = t.reshape(-1, 1024)[:, weight_perm()]  # one row per 16x64 strip
    return grid.pack_nibbles(t.reshape(k // TILE, 2 * n, 8))  # 8 nibbles per int32 column


def unpack_weight(packed: torch.Tensor) -> torch.Tensor:
    """int32 (K/16, 2N) -> uint8 codes (K, N); the exact inverse of `pack_weight`."""
    k, n = packed.shape[0] * TILE, packed.shape[1] // 2
    _check_tiles(k, n)
    t = grid.unpack_nibbles(packed).reshape(-1, 1024)
    out = torch.empty_like(t)
    out[:, weight_perm()] = t
    out = out.reshape(k // TILE, n // TILE, TILE, TILE).permute(0, 2, 1, 3)  # (K/16, 16, N/16, 16)
    return out.reshape(k, n)


def pack_scales(scales: torch.Tensor) -> torch.Tensor:
    """Group scales (K/g, N) -> fp16 (K/g, N) with columns in the kernel's order."""
    groups, n = scales.shape
    perm = scale_perm(groups > 1)
    return scales.to(torch.float16).reshape(-1, len(perm))[:, perm].reshape(groups, n).contiguous()


def unpack_scales(packed: torch.Tensor) -> torch.Tensor:
    """The exact inverse of `pack_scales`."""
    groups, n = packed.shape
    perm = scale_perm(groups > 1)
    out = torch.empty_like(packed).reshape(-1, len(perm))
    out[:, perm] = packed.reshape(-1, len(perm))
    return out.reshape(groups, n)
