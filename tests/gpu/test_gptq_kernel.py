"""GPTQ's column loop on the CUDA kernel (kernels/gptq.cu) against the torch loop it replaces, on the H200, without
pruning and with both 2:4 rules (SparseGPT's saliency, the magnitude baseline's fixed mask).

Both run the same float32 operations in the same order (w / s rounded half to even and clamped; (w - q s) / U_jj;
w - err U_jc as one fma), so codes, scales and errors agree bit for bit unless a rounding differs; the tests
require at least 99.9% identical codes (a flipped rounding tie changes one code and, through the error
propagation, nudges later columns) and the same Hessian-weighted error within 0.1%. Group scales taken during the
solve follow the updated weights, and with --clip each one comes from the loop run on every candidate scale (the
kernel's loop where the solve runs on the kernel), so a near tie between two candidates may fall either way; 99.5%
must agree.
"""

from __future__ import annotations

import pytest
import torch

from marlin_cli.algo.gptq import FixedMask, _columns, gptq, inverse_cholesky, saliency_prune
from marlin_cli.algo.hessian import weighted_error
from marlin_cli.algo.scales import clip_candidates, clip_search
from marlin_cli.algo.sparsegpt import magnitude_gptq, magnitude_mask, sparsegpt
from marlin_cli.config import QuantConfig
from marlin_cli.errors import ShapeError
from marlin_cli.kernel import ops

pytestmark = pytest.mark.gpu


def correlated_problem(n: int, k: int, seed: int, tokens: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Random weights and the Hessian of correlated inputs of unequal scale, float32 on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mix = torch.randn(k, k, generator=gen, device="cuda") / k**0.5 + torch.eye(k, device="cuda")
    x = torch.randn(tokens, k, generator=gen, device="cuda") @ mix * torch.rand(k, generator=gen, device="cuda") * 3
    return torch.randn(n, k, generator=gen, device="cuda"), 2 * x.T @ x / tokens


@pytest.mark.parametrize("prune", ["none", "saliency", "mask"])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize(("c0", "c1", "c2"), [(0, 128, 128), (128, 160, 256), (64, 96, 192), (0, 5, 7)])
def test_one_launch_matches_the_torch_loop(prune: str, per_column: bool, c0: int, c1: int, c2: int) -> None:
    if prune != "none" and c2 % 4:
        pytest.skip("pruning decides on whole groups of 4 columns: runs end at a multiple of 4 (block or K end)")
    n, k = 300, 256  # rows not a multiple of the kernel's 8 per block
    w, h = correlated_problem(n, k, seed=c0 + c1)
    rule = {"none": None, "saliency": saliency_prune, "mask": FixedMask(magnitude_mask(w))}[prune]
    upper = inverse_cholesky(h, 0.01)[0].contiguous()
    amax = w.abs().amax(dim=1, keepdim=True) / 7.5
    # seeded (not the global generator), so the data, and whether a rounding tie makes the loops part, does not
    # depend on which tests ran before
    gen = torch.Generator(device="cuda").manual_seed(c0 + c1 + 1)
    rand = torch.rand(n, k, generator=gen, device="cuda")
    s = (amax * rand + 0.01 * amax).contiguous() if per_column else amax[:, 0].clone()
    outs = []
    for loop in (ops.gptq_block, _columns):
        wi = w.clone()
        codes = torch.full((n, k), 0xEE, dtype=torch.uint8, device="cuda")  # poisoned: unwritten codes show
        errors = torch.full((n, c2 - c0), float("nan"), device="cuda")
        loop(wi, upper, s, per_column, codes, errors, c0, c0, c1, c2, rule)
        outs.append((wi, codes, errors))
    (w_k, codes_k, err_k), (w_t, codes_t, err_t) = outs
    assert torch.equal(codes_k[:, :c0], codes_t[:, :c0]) and bool((codes_k[:, :c0] == 0xEE).all())
    assert torch.equal(codes_k[:, c1:], codes_t[:, c1:])
    assert int(codes_k[:, c0:c1].max()) <= 15
    same = (codes_k[:, c0:c1] == codes_t[:, c0:c1]).float().mean().item()
    assert same >= 0.999, f"{same:.4%} of codes identical"
    assert torch.isfinite(err_k[:, : c1 - c0]).all()
    torch.testing.assert_close(err_k[:, : c1 - c0], err_t[:, : c1 - c0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w_k[:, c1:c2], w_t[:, c1:c2], rtol=1e-4, atol=1e-4)
    assert torch.equal(w_k[:, :c0], w_t[:, :c0]) and torch.equal(w_k[:, c2:], w_t[:, c2:])  # untouched


@pytest.mark.parametrize("prune", ["none", "saliency", "mask"])
@pytest.mark.parametrize(("c0", "c1", "c2"), [(0, 128, 128), (64, 96, 192), (0, 6, 8)])
def test_rows_alike_for_every_threads_per_row(prune: str, c0: int, c1: int, c2: int) -> None:
    """The kernel gives a row 1, 2, 4 or 8 threads as the rows are many or few (20000, 12000, 5000, 300 rows here);
    a row's loop depends on that row alone, so the first rows of each problem must come out bit for bit alike."""
    sizes = (20000, 12000, 5000, 300)
    w, h = correlated_problem(sizes[0], 256, seed=c1)
    upper = inverse_cholesky(h, 0.01)[0].contiguous()
    keep = magnitude_mask(w)
    s = (w.abs().amax(dim=1) / 7.5).contiguous()
    outs = []
    for n in sizes:
        rule = {"none": None, "saliency": saliency_prune, "mask": FixedMask(keep[:n].contiguous())}[prune]
        wi = w[:n].clone()
        codes = torch.full((n, 256), 0xEE, dtype=torch.uint8, device="cuda")  # poisoned: unwritten codes show
        errors = torch.full((n, c2 - c0), float("nan"), device="cuda")
        ops.gptq_block(wi, upper, s[:n].clone(), False, codes, errors, c0, c0, c1, c2, rule)
        assert torch.isfinite(errors[:, : c1 - c0]).all() and int(codes[:, c0:c1].max()) <= 15
        outs.append((wi[: sizes[-1]], codes[: sizes[-1]], errors[: sizes[-1], : c1 - c0]))
    for n, out in zip(sizes[1:], outs[1:]):
        for name, got, want in zip(("weights", "codes", "errors"), out, outs[0]):
            assert torch.equal(got, want), f"{name} of {n} rows differ from the same rows of {sizes[0]}"


@pytest.mark.parametrize("act_order", ["none", "static", "group"])
@pytest.mark.parametrize(("group_size", "clip"), [(-1, False), (32, True), (64, False), (128, False), (128, True)])
def test_gptq_on_the_kernel_matches_the_torch_loop(act_order: str, group_size: int, clip: bool) -> None:
    w, h = correlated_problem(384, 1024, seed=group_size % 7)
    cfg = QuantConfig(group_size=group_size, act_order=act_order, clip=clip)
    fast = gptq(w, h, cfg, kernels=ops.KERNELS)
    slow = gptq(w, h, cfg)
    same = (fast.codes == slow.codes).float().mean().item()
    err_fast, err_slow = weighted_error(w - fast.weight(), h), weighted_error(w - slow.weight(), h)
    print(f"\n{act_order} g={group_size} clip={clip}: {same:.4%} codes identical, error {err_fast / err_slow:.6f}x")
    assert same >= 0.999
    assert abs(err_fast / err_slow - 1) <= 1e-3
    assert abs(fast.weighted_error / err_fast - 1) <= 1e-5  # the solve's own error (kernel column errors): exact
    assert fast.perm is None if slow.perm is None else torch.equal(fast.perm, slow.perm)
    if not clip and (act_order == "static" or group_size == -1):  # absmax before the solve: identical
        assert torch.equal(fast.scales, slow.scales)
    else:  # the search (its kernel, or on the updated weights) may pick the neighbouring factor of a near tie
        close = torch.isclose(fast.scales, slow.scales, rtol=1e-3, atol=0).float().mean().item()
        assert close >= 0.995, f"{close:.4%} of group scales alike"


@pytest.mark.parametrize("solve", [sparsegpt, magnitude_gptq])
@pytest.mark.parametrize(("group_size", "clip"), [(-1, False), (32, False), (128, False), (-1, True), (128, True)])
def test_2_4_pruning_on_the_kernel_matches_the_torch_loop(solve, group_size: int, clip: bool) -> None:  # noqa: ANN001
    """With --clip the groups' search runs the pruning rule too (the fixed mask cut to the group's columns)."""
    w, h = correlated_problem(256, 1024, seed=3)
    cfg = QuantConfig(group_size=group_size, sparse24=True, clip=clip)
    fast = solve(w, h, cfg, kernels=ops.KERNELS)
    slow = solve(w, h, cfg)
    same = (fast.codes == slow.codes).float().mean().item()
    err_fast, err_slow = weighted_error(w - fast.weight(), h), weighted_error(w - slow.weight(), h)
    print(f"\n{solve.__name__} g={group_size} clip={clip}: {same:.4%} codes identical, {err_fast / err_slow:.6f}x")
    assert int((fast.codes != 8).reshape(256, 4, 256).sum(1).max()) <= 2  # 2:4 along K
    assert same >= 0.999
    assert abs(err_fast / err_slow - 1) <= 1e-3


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("g", [32, 64, 128, 1024])
def test_clip_search_kernel_matches_torch(g: int, weighted: bool) -> None:
    """The kernel's search (kernels/gptq.cu) against algo.scales.clip_search on the same candidates. Each element's
    error is rounded alike, only the sums over a group run in another order: float32 sums of g positive terms in two
    orders differ by at most about 2 g 2^-24 of the sum, so where the choices differ the kernel's must be within that
    of torch's (float64 errors), and 99.9% must be identical."""
    n, k = 300, 1024
    gen = torch.Generator(device="cuda").manual_seed(g + weighted)
    w = torch.randn(n, k, generator=gen, device="cuda")
    w[:, :64] *= 8  # outliers in some groups, which the search is for
    w[7, : max(g, 64)] = 0  # an all-zero group: every candidate ties, the first wins
    costs = torch.rand(k, generator=gen, device="cuda") * 10 + 0.1 if weighted else None
    got = torch.full((n, k // g), float("nan"), device="cuda")  # poisoned: an unwritten scale shows
    candidates = clip_candidates(w.view(n, k // g, g).abs().amax(2)).contiguous()
    torch.ops.marlin_cli.clip_scales(w, costs, candidates, got)
    want = clip_search(w, g, costs)
    assert torch.equal(ops.clip_scales(w, g, costs), got)

    def error(s: torch.Tensor) -> torch.Tensor:  # per group, float64
        x = w.double().view(n, k // g, g)
        d = (x - (x / s.double().unsqueeze(2)).round().clamp(-8, 7) * s.double().unsqueeze(2)).square()
        return (d if costs is None else d * costs.double().view(k // g, g)).sum(2)

    same = (got == want).float().mean().item()
    print(f"\ng={g} weighted={weighted}: {same:.4%} of {got.numel()} scales identical")
    assert same >= 0.999
    assert bool((error(got) <= error(want) * (1 + 2 * g * 2**-24)).all())
    assert got[7, 0] == candidates[0, 7, 0]


def test_bad_arguments_are_refused_before_launch() -> None:
    w, h = correlated_problem(16, 256, seed=0)
    upper = torch.eye(256, device="cuda")
    codes = torch.empty(16, 256, dtype=torch.uint8, device="cuda")
    errors = torch.empty(16, 256, device="cuda")
    s = torch.ones(16, device="cuda")
    with pytest.raises(ShapeError, match="column range"):
        ops.gptq_block(w, upper, s, False, codes, errors, 0, 0, 129, 129)  # wider than 128 columns
    with pytest.raises(ShapeError, match="float32"):
        ops.gptq_block(w.double(), upper, s, False, codes, errors, 0, 0, 64, 64)
    with pytest.raises(ShapeError, match="u .* is not contiguous"):
        ops.gptq_block(w, upper.t().contiguous().t(), s, False, codes, errors, 0, 0, 64, 64)
    with pytest.raises(ShapeError, match="codes is on cpu"):
        ops.gptq_block(w, upper, s, False, codes.cpu(), errors, 0, 0, 64, 64)
    short_mask = FixedMask(torch.ones_like(w[:8], dtype=torch.bool))
    with pytest.raises(ShapeError, match="fixed mask"):
        ops.gptq_block(w, upper, s, False, codes, errors, 0, 0, 64, 64, short_mask)
    with pytest.raises(ShapeError, match="scale"):
        ops.gptq_block(w, upper, s, True, codes, errors, 0, 0, 64, 64)  # per-column scales need (N, K)
    with pytest.raises(ShapeError, match="multiple of 4"):
        ops.gptq_block(w, upper, s, False, codes, errors, 0, 2, 64, 64, saliency_prune)
    with pytest.raises(ShapeError, match="in torch"):
        ops.gptq_block(w, upper, s, False, codes, errors, 0, 0, 64, 64, lambda j, x, d: x > 0)
    with pytest.raises(ShapeError, match="float32"):
        ops.clip_scales(w.double(), 128, None)
    with pytest.raises(ShapeError, match="do not divide"):
        ops.clip_scales(w, 96, None)
    with pytest.raises(ShapeError, match="costs"):
        ops.clip_scales(w, 128, torch.ones(128, device="cuda"))
    with pytest.raises(ShapeError, match="costs is on cpu"):
        ops.clip_scales(w, 128, torch.ones(256))
