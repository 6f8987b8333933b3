"""The 4-bit symmetric grid shared by every format and algorithm: codes 0..15, value = (code - 8) * scale."""

from __future__ import annotations

import torch

BITS = 4
MAXQ = 2**BITS - 1  # largest code
ZERO = 2 ** (BITS - 1)  # code of the value 0


def round_signed(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Signed grid steps code - ZERO (-8..7) of `w` on the grid of `scale`, in the dtype of `w`."""
    return (w / scale).round_().clamp_(-ZERO, MAXQ - ZERO)  # in place on the quotient: one temporary, not three


def encode(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Codes (same shape as `w`, uint8) of `w` on the grid of `scale` (broadcast against `w`)."""
    return round_signed(w, scale).add_(ZERO).to(torch.uint8)


def decode(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Values of `codes` on the grid of `scale` (which broadcasts against them), in the dtype of `scale`."""
    return codes.to(scale.dtype, copy=True).sub_(ZERO).mul_(scale)  # in place on the one copy


def decode_groups(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Codes (K, N) with group scales (K/g, N), each for g consecutive rows -> values (K, N) in the dtype of `scales`.
    The scales broadcast over their groups' rows: no (K, N) copy of them."""
    k, n = codes.shape
    groups = scales.shape[0]
    return decode(codes.reshape(groups, k // groups, n), scales.unsqueeze(1)).reshape(k, n)


# Nibble packing for every format: entry i of a word in bits 4i..4i+3. Entries 2i and 2i + 1 make byte i, and a
# word's bytes in memory order are its value on a little-endian machine (x86 and ARM, the platforms torch ships
# for), so packing is one OR of uint8 tensors and a reinterpreting view: no 64-bit shifts and sums.
def pack_nibbles(values: torch.Tensor, dtype: torch.dtype = torch.int32, dim: int = -1) -> torch.Tensor:
    """Values 0..15, each word's 2 * bytes of `dtype` of them along `dim` -> words of `dtype` (two's complement where
    signed), that axis removed. ((..., 2 * bytes) -> (...) for the last.)"""
    v = values.to(torch.uint8).movedim(dim, -1)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).contiguous().view(dtype).squeeze(-1)


def unpack_nibbles(words: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The exact inverse of `pack_nibbles`: integer words -> uint8 values 0..15, each word's 2 * bytes of them on a new
    axis right after `dim` ((..., L) -> (..., L, 2 * bytes) for the last). Written in that order directly: unpacking
    along another axis than the last (GPTQ's qweight, packed along K) needs no transposed copies."""
    dim %= words.dim()
    b = words.contiguous().unsqueeze(-1).view(torch.uint8).movedim(-1, dim + 1)  # each word's bytes after its axis
    v = b.new_empty(*b.shape[: dim + 2], 2, *b.shape[dim + 2 :])
    torch.bitwise_and(b, 0xF, out=v.select(dim + 2, 0))
    torch.bitwise_right_shift(b, 4, out=v.select(dim + 2, 1))
    return v.flatten(dim + 1, dim + 2)
