"""A plain, slow implementation of GPTQ as the paper states it (Frantar et al. 2022, Algorithm 1), for tests only.

No lazy batching: after every column, the whole remaining matrix is updated with the row of the upper Cholesky
factor of H^-1. Scales: absmax / 7.5 rounded to fp16, taken from the current weights when a group starts (or up front
from the original weights for static act-order and per-channel scales). Float64 throughout.
"""

from __future__ import annotations

import torch


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


def reference_gptq(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, act_order: str, damp: float = 0.01):
    """Returns codes (N, K) and per-column scales (N, K), both in the original column order."""
    w, h, g = prepare(weight, hessian, group_size)
    n, k = w.shape
    order = torch.argsort(torch.diag(h), descending=True) if act_order != "none" else torch.arange(k)
    static = act_order == "static" or g == k
    upfront = torch.zeros(n, k, dtype=torch.float64)
    for c in range(0, k, g):  # original contiguous groups
        upfront[:, c : c + g] = fp16_scale(w[:, c : c + g].abs().amax(1)).unsqueeze(1)
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    w, h = w[:, order], h[order][:, order]
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    codes = torch.zeros(n, k, dtype=torch.float64)
    scales = torch.zeros(n, k, dtype=torch.float64)
    for j in range(k):
        if static:
            s = upfront[:, order[j]]
        elif j % g == 0:
            s = fp16_scale(w[:, j : j + g].abs().amax(1))
        codes[:, j], q = quant(w[:, j], s)
        scales[:, j] = s
        err = (w[:, j] - q) / u[j, j]
        w[:, j:] -= err.unsqueeze(1) * u[j, j:].unsqueeze(0)
    inverse = torch.argsort(order)
    return codes[:, inverse], scales[:, inverse]


def reference_sparsegpt(weight: torch.Tensor, hessian: torch.Tensor, group_size: int, damp: float = 0.01):
    """SparseGPT 2:4 with 4-bit quantization (Frantar & Alistarh 2023, Algorithm 1 with the 2:4 mask rule and
    quantized kept weights), natural column order, column by column. Scales as in `reference_gptq` ("none").

    Returns codes (N, K) (pruned: 8), per-column scales (N, K) and the pruned mask (N, K), all float64/bool.
    """
    w, h, g = prepare(weight, hessian, group_size)
    n, k = w.shape
    upfront = fp16_scale(w.abs().amax(1)) if g == k else None
    h = h + damp * torch.diag(h).mean() * torch.eye(k, dtype=torch.float64)
    u = torch.linalg.cholesky(torch.linalg.inv(h), upper=True)
    d = torch.diag(u)
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
            s = fp16_scale(w[:, j : j + g].abs().amax(1))
        codes[:, j], q = quant(w[:, j], s)
        codes[pruned[:, j], j], q[pruned[:, j]] = 8, 0
        scales[:, j] = s
        err = (w[:, j] - q) / u[j, j]
        w[:, j:] -= err.unsqueeze(1) * u[j, j:].unsqueeze(0)
    return codes, scales, pruned
