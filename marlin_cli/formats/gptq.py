"""Standard GPTQ tensors (DESIGN.md 3.3): pure, bit-exact conversion to and from our (codes, scales, perm).

qweight int32 (K/8, N): the code of input row k in bits 4*(k % 8) of qweight[k // 8, n], rows in the natural input
order; qzeros int32 (G, N/8) packed along N; scales fp16 (G, N); g_idx int32 (K,), the group of every input row
(not monotone with desc_act). Zero points: "v1" (checkpoint_format "gptq") stores zero - 1, "v2" ("gptq_v2") stores
the zero itself; dequant w = (q - zero) * scale. Our grid is symmetric with zero 8, so only zero 8 converts exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from marlin_cli import grid
from marlin_cli.errors import CheckpointError, ShapeError

ZERO_FORMATS = {"gptq": 1, "gptq_v2": 0}  # checkpoint_format -> what the stored zero lacks (v1 stores zero - 1)
TENSORS = ("qweight", "qzeros", "scales", "g_idx")


class Layer(NamedTuple):
    """One 4-bit layer in our terms: codes uint8 (K, N) in stored row order, scales float32 (G, N) per group of
    stored rows, perm int64 (K,) (stored row i is input row perm[i]) or None for the natural order."""

    codes: torch.Tensor
    scales: torch.Tensor
    perm: torch.Tensor | None


def pack_along(values: torch.Tensor, dim: int, bits: int = 4) -> torch.Tensor:
    """Integer codes in 0..2**bits-1 -> int32, 32/bits codes per word along `dim`, code j of a word in bits bits*j."""
    per, dim = 32 // bits, dim % values.dim()
    if values.shape[dim] % per:
        raise ShapeError(f"{values.shape[dim]} values along dim {dim} is not a multiple of {per} ({bits}-bit packing)")
    if bits == grid.BITS:  # a word's codes on an axis after `dim`: one copy of the packed bytes, no int64 codes
        return grid.pack_nibbles(values.unflatten(dim, (-1, per)), dim=dim + 1)
    v = values.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], -1, per)  # (..., L/per, per)
    words = (v << torch.arange(0, 32, bits, dtype=torch.int64, device=v.device)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


def unpack_along(words: torch.Tensor, dim: int, bits: int = 4) -> torch.Tensor:
    """The exact inverse of `pack_along`: int32 -> uint8 codes, 32/bits times as long along `dim`."""
    dim %= words.dim()
    if bits == grid.BITS:
        return grid.unpack_nibbles(words.to(torch.int32), dim).flatten(dim, dim + 1)
    w = words.to(torch.int64).movedim(dim, -1) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=w.device)
    v = (w.unsqueeze(-1) >> shifts) & (2**bits - 1)  # (..., L, per)
    return v.reshape(*v.shape[:-2], -1).movedim(-1, dim).to(torch.uint8).contiguous()


def natural_g_idx(k: int, groups: int, device: torch.device | None = None) -> torch.Tensor:
    """g_idx of contiguous groups: row k is in group k // (K / G)."""
    return (torch.arange(k, device=device) // (k // groups)).to(torch.int32)


def _is_natural(g_idx: torch.Tensor, k: int, groups: int) -> bool:
    """Whether the int64 g_idx is that of contiguous groups (no act-order permutation)."""
    return torch.equal(g_idx, natural_g_idx(k, groups, g_idx.device).long())


def group_index(g_idx: torch.Tensor | None, k: int, groups: int, name: str) -> torch.Tensor:
    """The group of each of the K input rows, int64: `g_idx` checked, or the contiguous groups when it is absent."""
    if g_idx is None:
        if groups < 1 or k < groups or k % groups:
            raise CheckpointError(f"{name}: {groups} scale groups do not divide in_features={k}")
        return natural_g_idx(k, groups).long()
    g_idx = g_idx.to(torch.int64).reshape(-1)
    if g_idx.numel() != k or bool((g_idx < 0).any()) or bool((g_idx >= groups).any()):
        raise CheckpointError(f"tensor {name}.g_idx must hold {k} group numbers in 0..{groups - 1}")
    return g_idx


def dequantize_rows(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """(q - zero) * scale, in place on the float codes q (K, N), each row with its group's row of zeros and scales
    (G, N): broadcast over contiguous groups (no (K, N) copies of them), gathered per row for any other g_idx."""
    k, n = q.shape
    groups = scales.shape[0]
    if _is_natural(g_idx, k, groups):
        grouped = q.unflatten(0, (groups, k // groups))
        return grouped.sub_(zeros.unsqueeze(1)).mul_(scales.unsqueeze(1)).flatten(0, 1)
    return q.sub_(zeros[g_idx]).mul_(scales[g_idx])


def to_natural(layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (K, N) in the natural input order and the g_idx int32 (K,) of every input row."""
    k = layer.codes.shape[0]
    g_idx = natural_g_idx(k, layer.scales.shape[0], layer.codes.device)
    if layer.perm is None:
        return layer.codes, g_idx
    perm = layer.perm.long()
    codes = torch.empty_like(layer.codes).index_copy_(0, perm, layer.codes)  # natural row perm[i] = stored row i
    return codes, torch.empty_like(g_idx).index_copy_(0, perm, g_idx)


def from_natural(codes: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None, name: str) -> Layer:
    """Natural-order codes (K, N), scales (G, N) and g_idx (K,) -> our Layer.

    A g_idx that is not the contiguous one (desc_act) becomes a perm that sorts rows by group (stable, so rows keep
    their order inside a group): the groups are then contiguous in stored order, each exactly K/G rows long.
    """
    k, groups = codes.shape[0], scales.shape[0]
    if groups < 1 or k % groups:
        raise CheckpointError(f"tensor {name}.scales has {groups} groups, which do not divide in_features={k}")
    scales = scales.float()
    if g_idx is None:
        return Layer(codes, scales, None)
    g_idx = group_index(g_idx, k, groups, name)
    if _is_natural(g_idx, k, groups):
        return Layer(codes, scales, None)
    counts = torch.bincount(g_idx, minlength=groups)
    if bool((counts != k // groups).any()):
        raise CheckpointError(
            f"tensor {name}.g_idx has groups of {counts.min()}..{counts.max()} rows; the Marlin format needs "
            f"every group to hold in_features/groups = {k // groups} rows; re-quantize with --requantize"
        )
    perm = torch.sort(g_idx, stable=True).indices
    return Layer(codes[perm].contiguous(), scales, perm)


def to_gptq(layer: Layer, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """Our Layer -> {qweight, qzeros, scales, g_idx} (symmetric 4-bit, zero 8 stored by `checkpoint_format`)."""
    codes, g_idx = to_natural(layer)
    groups, n = layer.scales.shape
    zeros = torch.full((groups, n), grid.ZERO - ZERO_FORMATS[checkpoint_format], dtype=torch.uint8, device=codes.device)
    return {
        "qweight": pack_along(codes, 0),  # (K/8, N)
        "qzeros": pack_along(zeros, 1),  # (G, N/8)
        "scales": layer.scales.to(torch.float16).contiguous(),
        "g_idx": g_idx,
    }


def from_gptq(tensors: dict[str, torch.Tensor], name: str, bits: int = 4, checkpoint_format: str = "gptq") -> Layer:
    """{qweight, qzeros, scales, g_idx (optional)} of layer `name` -> our Layer, with no re-quantization.

    Raises CheckpointError naming the tensor when the layer is not symmetric 4-bit with zero 8 (use
    `dequantize` and re-quantize instead).
    """
    if bits != grid.BITS:
        raise CheckpointError(f"{name}: {bits}-bit GPTQ cannot be stored as 4-bit codes; re-quantize with --requantize")
    qweight, scales = tensors["qweight"], tensors["scales"]
    codes = unpack_along(qweight, 0)  # (K, N)
    if scales.shape[1] != codes.shape[1]:
        raise CheckpointError(f"tensor {name}.scales is {list(scales.shape)}, qweight implies N={codes.shape[1]}")
    zeros = stored_zeros(tensors, name, bits, checkpoint_format, scales.shape)
    if zeros is not None and bool((zeros != grid.ZERO).any()):
        bad = sorted(set(zeros.unique().tolist()) - {grid.ZERO})[:4]
        raise CheckpointError(
            f"tensor {name}.qzeros holds zero points {bad} ({checkpoint_format} convention), not {grid.ZERO}: "
            "asymmetric weights cannot be stored exactly on the symmetric Marlin grid; re-quantize with --requantize"
        )
    return from_natural(codes, scales, tensors.get("g_idx"), name)


def stored_zeros(
    tensors: dict[str, torch.Tensor], name: str, bits: int, checkpoint_format: str, shape: torch.Size
) -> torch.Tensor | None:
    """Zero points (G, N) as int64 after undoing the v1 minus-one, or None when the layer has no qzeros."""
    if "qzeros" not in tensors:
        return None
    if checkpoint_format not in ZERO_FORMATS:
        raise CheckpointError(f"checkpoint_format {checkpoint_format!r} is not one of {sorted(ZERO_FORMATS)}")
    zeros = unpack_along(tensors["qzeros"], 1, bits).to(torch.int64)[:, : shape[1]]
    if zeros.shape != shape:
        raise CheckpointError(f"tensor {name}.qzeros unpacks to {list(zeros.shape)}, scales are {list(shape)}")
    # v1 writers stored zero - 1 in `bits` bits, so zero 2**bits wrapped to 0; the +1 here restores every other value
    return zeros + ZERO_FORMATS[checkpoint_format]


def dequantize(
    tensors: dict[str, torch.Tensor], name: str, bits: int = 4, checkpoint_format: str = "gptq"
) -> torch.Tensor:
    """Dequantized weight (N, K) float32 of any 2/4/8-bit GPTQ layer, symmetric or not: w = (q - zero) * scale.
    It is the transpose of a contiguous (K, N) tensor, as `QuantResult.weight` returns, so comparing them is cheap."""
    if bits not in (2, 4, 8):
        raise CheckpointError(f"{name}: {bits}-bit GPTQ packs codes across words, which is not supported")
    qweight, scales = tensors["qweight"], tensors["scales"].float()
    q = unpack_along(qweight, 0, bits).to(torch.float32)  # (K, N)
    k = q.shape[0]
    if scales.shape[1] != q.shape[1]:
        raise CheckpointError(f"tensor {name}.scales is {list(scales.shape)}, qweight implies N={q.shape[1]}")
    zeros = stored_zeros(tensors, name, bits, checkpoint_format, scales.shape)
    zeros = torch.full_like(scales, 2 ** (bits - 1)) if zeros is None else zeros.float()
    return dequantize_rows(q, zeros, scales, group_index(tensors.get("g_idx"), k, scales.shape[0], name)).T
