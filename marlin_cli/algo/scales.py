"""Group scales on the 4-bit grid: absmax, and the clipping search over shrunken scales (plain or per-column weighted
squared error; GPTQ's grouped search, which runs its column loop on these candidates, is algo.gptq.search_scales)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from marlin_cli import grid

# Scale = factor * absmax / 7.5 (the symmetric grid spans -8..7 steps). The search tries shrinking the range in steps
# of 1/80, and one factor that makes +absmax exactly representable (8/7.5), which helps groups whose largest weight is
# positive. Steps of 1/40 gave GPTQ's grouped search 1.5% more held-out error on MiniLM (docs/gptq-log.md).
CLIP_FACTORS = tuple(1.0 - 0.0125 * i for i in range(33)) + (8 / 7.5,)
FP16_SUBNORMAL_MIN = 2.0**-24
FP16_MAX = 65504.0
LARGEST_WEIGHT = FP16_MAX * 7.5  # larger weights need a scale fp16 cannot hold: it is clamped, they saturate
# Weights the clipping search takes per pass (whole groups): on a GPU many, so a layer costs a few hundred launches
# instead of a dozen per group and factor; on the CPU few enough that its temporaries stay in cache.
SEARCH_ELEMENTS = {"cuda": 1 << 24, "cpu": 1 << 19}


def to_fp16_grid(scale: torch.Tensor) -> torch.Tensor:
    """Round scales to what the fp16 checkpoint stores, kept positive and finite, back in the input dtype."""
    return scale.clamp(min=FP16_SUBNORMAL_MIN, max=FP16_MAX).to(torch.float16).to(scale.dtype)


def absmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    """max |x| along dim, without the copy that x.abs() would make (5x faster on the CPU for a 4096 x 4096 layer)."""
    return torch.maximum(x.amax(dim), -x.amin(dim))


def clip_candidates(amax: torch.Tensor) -> torch.Tensor:
    """The scales the clipping search tries for groups of largest magnitude `amax`: (len(CLIP_FACTORS), *amax.shape),
    the unclipped absmax scale first."""
    factors = torch.tensor(CLIP_FACTORS, dtype=amax.dtype, device=amax.device).view(-1, *[1] * amax.dim())
    return to_fp16_grid(amax * factors / 7.5)


def clip_scales(w: torch.Tensor, costs: torch.Tensor | None) -> torch.Tensor:
    """(N, G, g) groups -> (N, G) scales minimising each group row's error sum_j c_j d_j^2 (d = w - dequant(w)) over
    CLIP_FACTORS (the first of equal errors wins, so the unclipped absmax scale unless another is better).

    costs: (G, g), what a rounding error of each column costs (GPTQ: 1 / U_jj^2), or None for plain squared error.
    """
    candidates = clip_candidates(absmax(w, 2))
    best, best_err = candidates[0], torch.full_like(candidates[0], float("inf"))
    for s in candidates:
        step = s.unsqueeze(2)
        d = w - grid.round_signed(w, step).mul_(step)  # = decode(encode(w)) exactly, without the uint8 round trip
        d.square_()
        err = (d if costs is None else d.mul_(costs)).sum(2)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best = torch.where(better, s, best)
    return best


# The clipping search of scales fixed up front, on whole layers: (w (N, K), g, costs (K,) or None) -> (N, K / g)
# scales, as `clip_search` defines it (kernel.ops.clip_scales is the CUDA kernel's).
ScaleSearch = Callable[[torch.Tensor, int, "torch.Tensor | None"], torch.Tensor]


def clip_search(w: torch.Tensor, g: int, costs: torch.Tensor | None) -> torch.Tensor:
    """clip_scales over the contiguous column groups of (N, K) weights, a run of groups per pass."""
    n, k = w.shape
    groups = w.reshape(n, k // g, g)
    group_costs = None if costs is None else costs.reshape(k // g, g)
    step = max(1, SEARCH_ELEMENTS.get(w.device.type, SEARCH_ELEMENTS["cpu"]) // (n * g))
    return torch.cat(
        [
            clip_scales(groups[:, c : c + step], None if group_costs is None else group_costs[c : c + step])
            for c in range(0, k // g, step)
        ],
        dim=1,
    )


def group_scales(
    w: torch.Tensor, group_size: int, costs: torch.Tensor | None, clip: bool, search: ScaleSearch = clip_search
) -> torch.Tensor:
    """(N, K) weights -> (N, K/g) scales of contiguous column groups (g = K when group_size is -1); with `clip`,
    `search` with per-column error costs (K,) or plain squared error (None)."""
    n, k = w.shape
    g = k if group_size == -1 else group_size
    if not clip:
        return to_fp16_grid(absmax(w.reshape(n, k // g, g), 2) / 7.5)
    return search(w, g, costs)
