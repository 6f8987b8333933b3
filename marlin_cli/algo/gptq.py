"""GPTQ (Frantar et al. 2022, Algorithm 1) on the symmetric 4-bit grid, with act-order, groups and clipping.

Columns are quantized one at a time in the order chosen by act-order; each column's rounding error, divided by the
diagonal of the upper Cholesky factor U of H^-1, is propagated to the remaining columns of its block at once and to
the rest of the matrix lazily at block end (the paper's section 3, "lazy batch updates"). The same loop prunes to 2:4
when given a `Prune` rule (SparseGPT's `saliency_prune` or a `FixedMask`, used by algo/sparsegpt.py): pruned weights
become 0 and their error is propagated the same way. The loop over a block's columns is `_columns` in torch and the
clipping search of scales fixed up front `scales.clip_search`, or the `Kernels` passed in (the CUDA kernels',
kernel.ops.KERNELS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from marlin_cli import grid
from marlin_cli.algo.result import QuantResult
from marlin_cli.algo.scales import ScaleSearch, absmax, clip_candidates, clip_search, group_scales
from marlin_cli.config import ActOrder, QuantConfig
from marlin_cli.errors import NumericalError

DAMP_RETRIES = 3  # each retry multiplies the damping by 10
PRUNE_M = 4  # 2:4 sparsity: 2 of every 4 consecutive input columns are kept in each row

KEEP = 2  # of every PRUNE_M
# Rows (of one group's columns) that search_scales runs through one column loop, rows times candidates: bounds its
# temporaries (weights, errors: 64 MB each on a GPU at 128 columns) while keeping the torch loop's steps few.
SEARCH_ROWS = {"cuda": 1 << 17, "cpu": 1 << 14}
TRI_SOLVE = 1024  # invert_lower's halves of at most this many rows are one solve against the identity

# (first column j, the current weights (N, 4) of columns j..j+3, U's diagonal (4,) there) -> pruned mask bool (N, 4)
Prune = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
# The column loop: (w, U, scales, per_column, codes, errors, e0, c0, c1, c2, prune) -> None, as `_columns` defines it.
# kernel.ops.gptq_block runs it as one CUDA launch, for the pruning rules `saliency_prune` and `FixedMask` (or none).
ColumnLoop = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, bool, torch.Tensor, torch.Tensor, int, int, int, int, Prune | None],
    None,
]


@dataclass(frozen=True)
class Kernels:
    """What replaces the solve's torch loops (kernel.ops.KERNELS: one CUDA launch per block or group of columns for
    the column loop, one per layer for the search); float32 weights on their device."""

    columns: ColumnLoop
    clip_search: ScaleSearch


def saliency_prune(j: int, w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """SparseGPT's rule: the 2 of 4 weights of each row (N, 4) with the smallest w^2 / d^2, whose removal costs the
    least output error."""
    cost = w.square() / d.square()
    pruned = torch.zeros_like(w, dtype=torch.bool)
    return pruned.scatter_(1, torch.topk(cost, PRUNE_M - KEEP, dim=1, largest=False).indices, True)


@dataclass(frozen=True)
class FixedMask:
    """The rule of a mask fixed up front: `keep` (N, K) bool, True where a weight is kept."""

    keep: torch.Tensor

    def __call__(self, j: int, w: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return ~self.keep[:, j : j + PRUNE_M]


def invert_lower(m: torch.Tensor) -> torch.Tensor:
    """M^-1 of a lower triangular (K, K) M, in place (M's upper triangle must be zeros), returned.

    By halves: [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]], the corner from two triangular solves with
    the original A and C, then A and C inverted the same way: K^3 / 6 multiply-adds, against K^3 / 2 for one solve
    against the identity (which the halves of at most TRI_SOLVE rows still use)."""
    k = len(m)
    if k <= TRI_SOLVE:
        m.copy_(torch.linalg.solve_triangular(m, torch.eye(k, dtype=m.dtype, device=m.device), upper=False))
        return m
    h = k // 2
    a, b, c = m[:h, :h], m[h:, :h], m[h:, h:]
    corner = torch.linalg.solve_triangular(c, b, upper=False)  # C^-1 B
    b.copy_(torch.linalg.solve_triangular(a, corner, upper=False, left=False).neg_())  # -C^-1 B A^-1
    del corner
    invert_lower(a)
    invert_lower(c)
    return m


def inverse_cholesky(hessian: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of (H + d * mean(diag H) * I)^-1, raising d tenfold on failure; returns (U, d).

    With J the order-reversing permutation, J (H + dI) J = M M^T gives H + dI = R R^T for the upper triangular
    R = J M J, so U = R^-1 = J M^-1 J: one factorization and one triangular inverse, where inverting H and factoring
    the inverse took three factorizations (K = 28672 on the H200: 1.50 -> 0.44 s; as accurate in float32)."""
    mean_diag = torch.diag(hessian).mean()
    for attempt in range(DAMP_RETRIES):
        d = damp * 10**attempt
        # at most two K x K matrices besides H at a time (3.3 GB each for K = 28672 in float32), each intermediate
        # dropped once used
        reversed_h = hessian.flip(0, 1)
        reversed_h.diagonal().add_(d * mean_diag)
        lower, info = torch.linalg.cholesky_ex(reversed_h)
        del reversed_h
        if info == 0:
            upper = invert_lower(lower).flip(0, 1)
            del lower
            if bool(torch.isfinite(upper).all()):
                return upper, d
    raise NumericalError(
        f"the Hessian is not positive definite even with damping {d:g}; "
        "more or longer calibration samples (--nsamples, --seqlen) usually fix this"
    )


def _columns(
    w: torch.Tensor,
    upper: torch.Tensor,
    s: torch.Tensor,
    per_column: bool,
    codes: torch.Tensor,
    errors: torch.Tensor,
    e0: int,
    c0: int,
    c1: int,
    c2: int,
    prune: Prune | None = None,
) -> None:
    """The column loop in torch (with `prune`, also pruning to 2:4): quantize columns [c0, c1) of w (N, K) in order
    with the scales s (N, K) if `per_column` else s (N,), propagate each column's error, divided by U's diagonal, to
    the columns after it up to c2, and write codes[:, j] and errors[:, j - e0]."""
    u = upper[c0:c2, c0:c2]
    block = w[:, c0:c2]  # a view: updates land in w
    steps = torch.empty(w.shape[0], c1 - c0, dtype=w.dtype, device=w.device)  # codes - ZERO, converted once at the end
    pruned = torch.empty(0)
    for i in range(c1 - c0):
        j = c0 + i
        sj = s[:, j] if per_column else s
        # few, whole-column operations per step: on a GPU this loop is bound by kernel launches
        q = grid.round_signed(block[:, i], sj)
        if prune is not None:
            if j % PRUNE_M == 0:  # chosen on the weights as updated so far, as SparseGPT does
                pruned = prune(j, block[:, i : i + PRUNE_M], torch.diag(u)[i : i + PRUNE_M])
            q = q.masked_fill(pruned[:, j % PRUNE_M], 0)
        err = (block[:, i] - q * sj) / u[i, i]
        block[:, i:].addr_(err, u[i, i:], alpha=-1)
        steps[:, i], errors[:, j - e0] = q, err
    codes[:, c0:c1] = (steps + grid.ZERO).to(torch.uint8)


def search_scales(group: torch.Tensor, upper: torch.Tensor, loop: ColumnLoop, prune: Prune | None) -> torch.Tensor:
    """--clip for a group whose scales are set as it starts (act-order group or none): each row's scale among
    `clip_candidates` with the least GPTQ error on the group's own columns (the sum of their squared column errors),
    by running the solve's column loop on every candidate at once, one row per row and candidate.

    group: (N, g) weights as updated so far; upper: U's (g, g) diagonal block there; prune: the solve's rule, a
    FixedMask's columns those of the group. The error the group passes on to later columns is not counted.
    """
    n, g = group.shape
    candidates = clip_candidates(absmax(group, 1))  # (F, N)
    f = len(candidates)
    upper = upper.contiguous()
    scales = torch.empty(n, dtype=group.dtype, device=group.device)
    rows = max(1, SEARCH_ROWS.get(group.device.type, SEARCH_ROWS["cpu"]) // f)
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        w = group[r0:r1].repeat(f, 1)  # candidate-major: candidate i's rows at i * (r1 - r0)
        codes = torch.empty(w.shape, dtype=torch.uint8, device=w.device)
        errors = torch.empty_like(w)
        rule = FixedMask(prune.keep[r0:r1].repeat(f, 1)) if isinstance(prune, FixedMask) else prune
        loop(w, upper, candidates[:, r0:r1].reshape(-1), False, codes, errors, 0, 0, g, g, rule)
        loss = errors.square_().sum(1).view(f, r1 - r0)
        scales[r0:r1] = candidates[:, r0:r1].gather(0, loss.argmin(0, keepdim=True))[0]  # the first of equal losses
    return scales


def gptq(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    cfg: QuantConfig,
    prune: Prune | None = None,
    kernels: Kernels | None = None,
) -> QuantResult:
    """Quantize (N, K) weights against the (K, K) Hessian of their inputs; with `prune`, also prune them to 2:4.

    `prune` is asked at every column that is a multiple of 4 which of the next 4 weights of each row to drop
    (natural column order only). Computes in float64 when `weight` is float64 (for exact comparisons), else float32.
    `kernels` replace the torch column loop (unless `prune` is a rule it does not know) and the clipping search of
    fixed scales, for float32 weights.
    """
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    w = weight.to(dtype).clone()
    h = hessian.to(dtype).clone()
    n, k = w.shape
    g = k if cfg.group_size == -1 else cfg.group_size
    if cfg.block_size % g and g != k:
        raise ValueError(f"block size {cfg.block_size} must be a multiple of the group size {g}")
    if prune is not None and (k % PRUNE_M or cfg.block_size % PRUNE_M or cfg.act_order is not ActOrder.NONE):
        raise ValueError(f"2:4 pruning needs K={k} and the block size in multiples of 4 and the natural column order")

    dead = torch.diag(h) == 0  # inputs that were always zero: their weights never matter
    h[dead, dead] = 1
    w[:, dead] = 0

    perm = None if cfg.act_order is ActOrder.NONE else torch.argsort(torch.diag(h), descending=True)
    if perm is not None:
        h = h[perm][:, perm]
    upper, damp = inverse_cholesky(h, cfg.damp)
    lam = damp * torch.diag(h).mean()  # the damping inverse_cholesky added to the diagonal
    del h  # the scales' search needs U alone

    # Static act-order and per-channel scales are fixed up front, on the original contiguous groups. --clip weighs
    # each column's rounding error by what the solve charges for it, 1 / U_jj^2 (its column error is d / U_jj).
    fixed = None
    if cfg.act_order is ActOrder.STATIC or g == k:
        costs = upper.diagonal().square().reciprocal() if cfg.clip else None
        if costs is not None and perm is not None:
            costs = torch.empty_like(costs).index_copy_(0, perm, costs)  # to the natural order
        fixed = group_scales(w, cfg.group_size, costs, cfg.clip, kernels.clip_search if kernels else clip_search)
    col_scale = None if fixed is None else fixed.repeat_interleave(g, dim=1)  # (N, K): each column's scale
    if perm is not None:
        w = w[:, perm]
        col_scale = None if col_scale is None else col_scale[:, perm]

    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    found: list[torch.Tensor] = []  # group scales fixed as each group starts (dynamic groups)
    error_sq = torch.zeros((), dtype=dtype, device=w.device)  # sum of the squared column errors (weighted_error)
    loop: ColumnLoop = _columns
    if kernels is not None and (prune is None or prune is saliency_prune or isinstance(prune, FixedMask)):
        loop, w, upper = kernels.columns, w.contiguous(), upper.contiguous()
    for i1 in range(0, k, cfg.block_size):
        i2 = min(i1 + cfg.block_size, k)
        errors = torch.empty(n, i2 - i1, dtype=dtype, device=w.device)
        # One run per group in the block when groups start inside it (their scales come from the weights as updated
        # so far), else one for the whole block.
        step = i2 - i1 if col_scale is not None else g
        for c0 in range(i1, i2, step):
            c1 = min(c0 + step, i2)
            s = col_scale
            if s is None:
                group = w[:, c0 : c0 + g]
                if cfg.clip:
                    rule = FixedMask(prune.keep[:, c0 : c0 + g]) if isinstance(prune, FixedMask) else prune
                    s = search_scales(group, upper[c0 : c0 + g, c0 : c0 + g], loop, rule)
                else:
                    s = group_scales(group, -1, None, False)[:, 0]
                found.append(s)
            loop(w, upper, s, col_scale is not None, codes, errors, i1, c0, c1, i2, prune)
        w[:, i2:].addmm_(errors, upper[i1:i2, i2:], alpha=-1)
        error_sq += errors.square().sum()

    if cfg.act_order is ActOrder.STATIC:
        codes = torch.empty_like(codes).index_copy_(1, perm, codes)  # back to the natural order
        perm = None
    elif perm is not None:
        # Rows inside a group may be stored in any order; ascending input index makes the layout canonical, so
        # formats that record only each row's group (GPTQ's g_idx) convert back to exactly the same tensors.
        order = torch.argsort(torch.arange(k, device=perm.device) // g * k + perm)
        codes, perm = codes[:, order], perm[order]
    scales = fixed if fixed is not None else torch.stack(found, dim=1)  # (N, G)
    result = QuantResult(codes=codes.T.contiguous(), scales=scales.T.float().contiguous(), perm=perm, damp=damp)
    # The solve's weight change is dW = E U (E: the column errors, U^T U = (H + lambda I)^-1 with the dead inputs' 1s
    # on H's diagonal), so tr(dW (H + lambda I) dW^T) = ||E||^2; dW is zero on dead inputs (their weights were zeroed
    # and U has no entries off the diagonal in their rows and columns), whose rows and columns of the given H are zero.
    # That leaves the given H's error as ||E||^2 - lambda ||dW||^2, which spares the report (pipeline) one N x K x K
    # product.
    del w, upper  # the working copies: one N x K more below
    change = result.weight().to(dtype).sub_(weight)
    change[:, dead] = 0
    return replace(result, weighted_error=float(error_sq - lam * torch.linalg.vector_norm(change).square()))
