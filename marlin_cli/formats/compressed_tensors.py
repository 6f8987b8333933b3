"""compressed-tensors `pack-quantized` tensors (DESIGN.md 3.4): pure, bit-exact conversion to and from our Layer.

weight_packed int32 (N, K/8): code of input column k of output row n in bits 4*(k % 8) of word [n, k // 8], value =
signed code + 8 (the GPTQ qweight transposed); weight_scale (N, G); weight_shape int64 [N, K]; weight_g_idx int32 (K,)
only with actorder "group"; weight_zero_point (N/8, G) only when asymmetric.
"""

from __future__ import annotations

import torch

from marlin_cli import grid
from marlin_cli.errors import CheckpointError
from marlin_cli.formats.gptq import (
    Layer,
    dequantize_rows,
    from_natural,
    group_index,
    pack_along,
    to_natural,
    unpack_along,
)

TENSORS = ("weight_packed", "weight_scale", "weight_shape", "weight_g_idx", "weight_zero_point")


def to_compressed(layer: Layer) -> dict[str, torch.Tensor]:
    """Our Layer -> {weight_packed, weight_scale, weight_shape[, weight_g_idx]} (weight_g_idx only with a perm)."""
    codes, g_idx = to_natural(layer)
    k, n = codes.shape
    out = {
        "weight_packed": pack_along(codes.T, 1),  # (N, K/8)
        "weight_scale": layer.scales.T.to(torch.float16).contiguous(),  # (N, G)
        "weight_shape": torch.tensor([n, k], dtype=torch.int64),
    }
    if layer.perm is not None:
        out["weight_g_idx"] = g_idx
    return out


def from_compressed(tensors: dict[str, torch.Tensor], name: str, num_bits: int = 4, symmetric: bool = True) -> Layer:
    """{weight_packed, weight_scale, weight_shape, weight_g_idx (optional)} of layer `name` -> our Layer, exactly.

    Raises CheckpointError naming the tensor for anything but symmetric 4-bit (re-quantize those instead).
    """
    if num_bits != grid.BITS:
        raise CheckpointError(f"{name}: {num_bits}-bit weights cannot be stored as 4-bit codes; use --requantize")
    if not symmetric or "weight_zero_point" in tensors:
        raise CheckpointError(
            f"tensor {name}.weight_zero_point: asymmetric weights cannot be stored exactly on the symmetric Marlin "
            "grid; re-quantize with --requantize"
        )
    n, k = _shape(tensors, name, num_bits)
    codes = _codes(tensors, k, grid.BITS)
    scales = tensors["weight_scale"]
    if scales.shape[0] != n:
        raise CheckpointError(f"tensor {name}.weight_scale is {list(scales.shape)}, weight_shape says N={n}")
    return from_natural(codes, scales.T, tensors.get("weight_g_idx"), name)


def dequantize(tensors: dict[str, torch.Tensor], name: str, num_bits: int = 4) -> torch.Tensor:
    """Dequantized weight (N, K) float32 of a 2/4/8-bit layer, symmetric or not: w = (q - zero) * scale. It is the
    transpose of a contiguous (K, N) tensor, as `QuantResult.weight` returns, so comparing them is cheap."""
    if num_bits not in (2, 4, 8):
        raise CheckpointError(f"{name}: {num_bits}-bit weights pack across words, which is not supported")
    n, k = _shape(tensors, name, num_bits)
    offset = 2 ** (num_bits - 1)
    q = _codes(tensors, k, num_bits).float().sub_(offset)  # signed codes (K, N)
    scales = tensors["weight_scale"].float()  # (N, G)
    if scales.shape[0] != n:
        raise CheckpointError(f"tensor {name}.weight_scale is {list(scales.shape)}, weight_shape says N={n}")
    zeros = torch.zeros_like(scales)
    if "weight_zero_point" in tensors:  # stored as signed zero + offset, packed along N
        zeros = unpack_along(tensors["weight_zero_point"], 0, num_bits)[:n].float() - offset
        if zeros.shape != scales.shape:
            raise CheckpointError(
                f"tensor {name}.weight_zero_point unpacks to {list(zeros.shape)}, not {list(scales.shape)}"
            )
    g_idx = group_index(tensors.get("weight_g_idx"), k, scales.shape[1], name)
    return dequantize_rows(q, zeros.T, scales.T, g_idx).T  # (K, N) in memory, as QuantResult.weight's


def _codes(tensors: dict[str, torch.Tensor], k: int, num_bits: int) -> torch.Tensor:
    """weight_packed (N, K bits/32) -> uint8 codes (K, N), contiguous."""
    return unpack_along(tensors["weight_packed"], 1, num_bits)[:, :k].T.contiguous()


def _shape(tensors: dict[str, torch.Tensor], name: str, num_bits: int) -> tuple[int, int]:
    shape = tensors.get("weight_shape")
    if shape is None or shape.numel() != 2:
        raise CheckpointError(f"tensor {name}.weight_shape is missing or not [out_features, in_features]")
    n, k = (int(v) for v in shape.tolist())
    packed = list(tensors["weight_packed"].shape)
    if len(packed) != 2 or packed[0] != n or not 0 < k <= packed[1] * 32 // num_bits:
        raise CheckpointError(f"tensor {name}.weight_packed is {packed}, which does not hold weight_shape [{n}, {k}]")
    return n, k
