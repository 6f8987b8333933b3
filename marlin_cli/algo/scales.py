"""Group scales on the 4-bit grid: absmax, and the Hessian-weighted clipping search."""

from __future__ import annotations

import torch

from marlin_cli import grid

# Scale = factor * absmax / 7.5 (the symmetric grid spans -8..7 steps). The search tries shrinking the range, and one
# factor that makes +absmax exactly representable (8/7.5), which helps groups whose largest weight is positive.
CLIP_FACTORS = tuple(1.0 - 0.025 * i for i in range(17)) + (8 / 7.5,)
FP16_SUBNORMAL_MIN = 2.0**-24
FP16_MAX = 65504.0
LARGEST_WEIGHT = FP16_MAX * 7.5  # larger weights need a scale fp16 cannot hold: it is clamped, they saturate


def to_fp16_grid(scale: torch.Tensor) -> torch.Tensor:
    """Round scales to what the fp16 checkpoint stores, kept positive and finite, back in the input dtype."""
    return scale.clamp(min=FP16_SUBNORMAL_MIN, max=FP16_MAX).to(torch.float16).to(scale.dtype)


def absmax_scales(w: torch.Tensor) -> torch.Tensor:
    """(N, g) group of weights -> (N,) scales from each row's absolute maximum."""
    return to_fp16_grid(w.abs().amax(dim=1) / 7.5)


def clip_scales(w: torch.Tensor, hessian: torch.Tensor | None) -> torch.Tensor:
    """(N, g) group -> (N,) scales minimising the row error d H d^T (d = w - dequant(w)) over CLIP_FACTORS.

    hessian: the (g, g) block of the layer Hessian for these columns, or None for plain squared error.
    """
    amax = w.abs().amax(dim=1)
    best_err = torch.full_like(amax, float("inf"))
    best = absmax_scales(w)
    for factor in CLIP_FACTORS:
        s = to_fp16_grid(amax * factor / 7.5).unsqueeze(1)
        d = w - grid.decode(grid.encode(w, s), s)
        err = ((d @ hessian) * d).sum(1) if hessian is not None else d.square().sum(1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, s.squeeze(1), best)
    return best


def group_scales(w: torch.Tensor, group_size: int, hessian: torch.Tensor | None, clip: bool) -> torch.Tensor:
    """(N, K) weights -> (N, K/g) scales of contiguous column groups (g = K when group_size is -1)."""
    g = w.shape[1] if group_size == -1 else group_size
    out = []
    for c in range(0, w.shape[1], g):
        block = w[:, c : c + g]
        if clip:
            out.append(clip_scales(block, None if hessian is None else hessian[c : c + g, c : c + g]))
        else:
            out.append(absmax_scales(block))
    return torch.stack(out, dim=1)
