"""2:4 pruning with 4-bit quantization: SparseGPT (Frantar & Alistarh 2023) and the magnitude baseline.

Both run the GPTQ loop (algo/gptq.py) in the natural column order with a pruning rule: pruned weights become 0, kept
ones their 4-bit codes (code 8 is 0), and both errors are propagated alike. SparseGPT chooses, at every 4th column,
the 2 of the next 4 weights of each row with the smallest OBS saliency w^2 / d^2 (d: the diagonal of the upper
Cholesky factor of H^-1) from the weights as updated so far; the magnitude baseline fixes the mask up front (the 2
largest |w| of every 4 kept), zeroes the rest, and GPTQ-quantizes what is kept.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from marlin_cli.algo.gptq import KEEP, PRUNE_M, FixedMask, Kernels, gptq, saliency_prune
from marlin_cli.algo.result import QuantResult
from marlin_cli.algo.rtn import rtn
from marlin_cli.config import QuantConfig


def magnitude_mask(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) weights -> bool (N, K), True where kept: the 2 largest |w| of every 4 consecutive columns of a row, the
    earlier column on a tie. Ties are common in weights already on a 4-bit grid (a dense Marlin checkpoint re-quantized
    to 2:4), and topk breaks them differently on the CPU and the GPU. A weight is kept when fewer than 2 of its group
    beat it (a larger |w|, or an equal one in an earlier column): the rule of a stable descending sort, in 6 elementwise
    comparisons (a third of the sort's time on the CPU)."""
    n, k = weight.shape
    cols = weight.abs().reshape(n, k // PRUNE_M, PRUNE_M).unbind(2)
    beaten = [torch.zeros(cols[0].shape, dtype=torch.uint8, device=weight.device) for _ in range(PRUNE_M)]
    for j in range(PRUNE_M):
        for i in range(j + 1, PRUNE_M):
            earlier_wins = cols[j] >= cols[i]
            beaten[i] += earlier_wins
            beaten[j] += ~earlier_wins
    return (torch.stack(beaten, 2) < KEEP).reshape(n, k)


def sparsegpt(
    weight: torch.Tensor, hessian: torch.Tensor, cfg: QuantConfig, kernels: Kernels | None = None
) -> QuantResult:
    """Prune (N, K) weights to 2:4 and quantize the rest in one pass against the (K, K) Hessian (`kernels`: as gptq)."""
    return gptq(weight, hessian, cfg, saliency_prune, kernels)


def magnitude_gptq(
    weight: torch.Tensor, hessian: torch.Tensor, cfg: QuantConfig, kernels: Kernels | None = None
) -> QuantResult:
    """The baseline: keep the 2 largest |w| of every 4, then GPTQ the kept weights with the mask fixed."""
    keep = magnitude_mask(weight)
    # the solve saw the pruned weights as zeros: its weighted error leaves their change out
    return replace(gptq(weight * keep, hessian, cfg, FixedMask(keep), kernels), weighted_error=None)


def magnitude_rtn(weight: torch.Tensor, group_size: int, clip: bool = False) -> QuantResult:
    """No calibration: keep the 2 largest |w| of every 4 and round the kept ones to nearest (pruned: code 8)."""
    return rtn(weight * magnitude_mask(weight), group_size, clip)
