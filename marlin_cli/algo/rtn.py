"""Round-to-nearest: the baseline every calibrated method is measured against."""

from __future__ import annotations

import torch

from marlin_cli import grid
from marlin_cli.algo.result import QuantResult
from marlin_cli.algo.scales import group_scales


def rtn(weight: torch.Tensor, group_size: int, clip: bool = False) -> QuantResult:
    """Quantize (N, K) weights with absmax group scales (plain squared-error clipping search when `clip`)."""
    w = weight.float()
    n, k = w.shape
    scales = group_scales(w, group_size, None, clip)  # (N, G)
    codes = grid.encode(w.reshape(n, scales.shape[1], -1), scales.unsqueeze(2)).reshape(n, k)  # scales broadcast
    return QuantResult(codes=codes.T.contiguous(), scales=scales.T.contiguous())
