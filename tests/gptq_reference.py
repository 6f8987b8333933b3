"""A plain, slow implementation of GPTQ as the paper states it (Frantar et al. 2022, Algorithm 1), for tests only.

No lazy batching: after every column, the whole remaining matrix is updated with the row of the upper Cholesky
factor of H^-1. Scales: absmax / 7.5 rounded to fp16, taken from the current weights when a group starts (or up front
from the original weights for static act-order and per-channel scales). With `clip`, each row's scale is the first
best of the clipping factors: for scales fixed up front by the rounding error weighted by 1 / U_jj^2, for a group
starting by the sum of the squared column errors of running this algorithm on that group's columns alone.
Float64 throughout.
"""

from __future__ import annotations

import torch

from marlin_cli.algo.scales import CLIP_FACTORS


def fp16_scale(amax: torch.Tensor) -> torch.Tensor:
    return (amax / 7.5).clamp(min=2.0**-24).half().double()


def quant(w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    code = torch.clamp(torch.round(w / s) + 8, 0, 15)
    return code, (code - 8) * s


def prepare(weight: torch.Tensor, hessian: torch.Tensor, group_size: int):
    """Float64 copies with dead input channels (H_ii = 0) handled: H_ii = 1 and the weight column 0; and g."""
    w = weight.double().clone()
    h = hessian.double().clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    return w, h, w.shape[1] if group_size == -1 else group_size


def first_best(scales: list[torch.Tensor], losses: list[torch.Tensor]) -> torch.Tensor:
    """Per row, the first scale of the smallest loss."""
    best, best_loss = scales[0].clone(), torch.full_like(scales[0], float("inf"))
    for s, loss in zip(scales, losses, strict=True):
        better = loss < best_loss
        best[better], best_loss[better] = s[better], loss[better]
    return best


def group_loss(w: torch.Tensor, u: torch.Tensor, s: torch.Tensor, prune: bool = False) -> torch.Tensor:
    """Per row, the sum of the squared column errors of this algorithm on the columns of w alone (u: U's block),
    with SparseGPT's 2:4 rule (`reference_sparsegpt`) when `prune`."""
    w = w.clone()
    loss = torch.zeros(w.shape[0], dtype=torch.float64)
    for i in range(w.shape[1]):
        if prune and i % 4 == 0:
            saliency = w[:, i : i + 4] ** 2 / torch.diag(u)[i : i + 4] ** 2
            pruned = torch.zeros_like(saliency, dtype=torch.bool)
            pruned.scatter_(1, torch.argsort(saliency, dim=1, stable=True)[:, :2], True)
        q = quant(w[:, i], s)[1]
        if prune:
            q[pruned[:, i % 4]] = 0
        err = (w[:, i] - q) / u[i, i]
        w[:, i:] -= err.unsqueeze(1) * u[i, i:].unsqueeze(0)
        loss += err**2
    return loss


def reference_gptq(
    weight: torch.Tensor, hessian: torch.Tensor, group_size: int, act_order: str, damp: float = 0.01, clip: bool = False
):
    """Returns codes (N, K) and per-column scales (N, K), both in the original column order."""
    w, h, g = prepare(weight, hessian, group_size)
    n, k = w.shape
    order = torch.argsort(torch.diag(h), descending=True) if act_order != "none" else torch.arange(k)
    static = act_order == "static" or g == k
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(h[order][:, order]), upper=True)
    cost = torch.empty(k, dtype=torch.float64)
    cost[order] = 1 / torch.diag(u) ** 2  # of each original column
    upfront = torch.zeros(n, k, dtype=torch.float64)
    for c in range(0, k, g):  # original contiguous groups
        block = w[:, c : c + g]
        candidates = [fp16_scale(block.abs().amax(1) * f) for f in (CLIP_FACTORS if clip else (1.0,))]
        losses = [(block - quant(block, s.unsqueeze(1))[1]) ** 2 @ cost[c : c + g] for s in candidates]
        upfront[:, c : c + g] = first_best(candidates, losses).unsqueeze(1)
    w = w[:, order]
    codes = torch.zeros(n, k, dtype=torch.float64)
    scales = torch.zeros(n, k, dtype=torch.float64)
    for j in range(k):
        if static:
            s = upfront[:, order[j]]
        elif j % g == 0:
            amax = w[:, j : j + g].abs().amax(1)
            candidates = [fp16_scale(amax * f) for f in (CLIP_FACTORS if clip else (1.0,))]
            s = first_best(candidates, [group_loss(w[:, j : j + g], u[j : j + g, j : j + g], c) for c in candidates])
        codes[:, j], q = quant(w[:, j], s)
        scales[:, j] = s
        err = (w[:, j] - q) / u[j, j]
        w[:, j:] -= err.unsqueeze(1) * u[j, j:].unsqueeze(0)
    inverse = torch.argsort(order)
    return codes[:, inverse], scales[:, inverse]


def reference_sparsegpt(
    weight: torch.Tensor, hessian: torch.Tensor, group_size: int, damp: float = 0.01, clip: bool = False
):
    """SparseGPT 2:4 with 4-bit quantization (Frantar & Alistarh 2023, Algorithm 1 with the 2:4 mask rule and
    quantized kept weights), natural column order, column by column. Scales as in `reference_gptq` ("none"; with
    `clip` a group's candidates run this algorithm, pruning included).

    Returns codes (N, K) (pruned: 8), per-column scales (N, K) and the pruned mask (N, K), all float64/bool.
    """
    w, h, g = prepare(weight, hessian, group_size)
    n, k = w.shape
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    d = torch.diag(u)
    factors = CLIP_FACTORS if clip else (1.0,)
    upfront = None
    if g == k:
        candidates = [fp16_scale(w.abs().amax(1) * f) for f in factors]
        upfront = first_best(candidates, [(w - quant(w, s.unsqueeze(1))[1]) ** 2 @ d**-2 for s in candidates])
    codes = torch.zeros(n, k, dtype=torch.float64)
    scales = torch.zeros(n, k, dtype=torch.float64)
    pruned = torch.zeros(n, k, dtype=torch.bool)
    for j in range(k):
        if j % 4 == 0:  # per row, prune the 2 of the next 4 weights whose removal costs least: w^2 / d^2
            saliency = w[:, j : j + 4] ** 2 / d[j : j + 4] ** 2
            for r in range(n):
                for c in sorted(range(4), key=lambda c: saliency[r, c].item())[:2]:
                    pruned[r, j + c] = True
        if upfront is not None:
            s = upfront
        elif j % g == 0:
            candidates = [fp16_scale(w[:, j : j + g].abs().amax(1) * f) for f in factors]
            losses = [group_loss(w[:, j : j + g], u[j : j + g, j : j + g], c, prune=True) for c in candidates]
            s = first_best(candidates, losses)
        codes[:, j], q = quant(w[:, j], s)
        codes[pruned[:, j], j], q[pruned[:, j]] = 8, 0
        scales[:, j] = s
        err = (w[:, j] - q) / u[j, j]
        w[:, j:] -= err.unsqueeze(1) * u[j, j:].unsqueeze(0)
    return codes, scales, pruned
