"""SparseGPT 2:4 + 4-bit against the paper's algorithm, the 2:4 rule, and the magnitude baseline."""

from __future__ import annotations

import pytest
import torch
from gptq_reference import reference_sparsegpt
from test_gptq import correlated_problem, stored_to_natural

from marlin_cli.algo.gptq import gptq
from marlin_cli.algo.hessian import weighted_error
from marlin_cli.algo.sparsegpt import magnitude_gptq, magnitude_mask, magnitude_rtn, saliency_prune, sparsegpt
from marlin_cli.config import Method, QuantConfig
from marlin_cli.errors import UsageError

SPARSE = dict(sparse24=True)


def assert_two_of_four(codes: torch.Tensor) -> None:
    """codes (K, N): at most 2 codes != 8 (nonzero values) in every 4 consecutive rows of each column."""
    k, n = codes.shape
    nonzero = (codes != 8).reshape(k // 4, 4, n).sum(1)
    assert int(nonzero.max()) <= 2


@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_codes_scales_and_mask_as_the_papers_algorithm(group_size: int, clip: bool, seed: int) -> None:
    w, h = correlated_problem(48, 256, seed)
    want_codes, want_scales, want_pruned = reference_sparsegpt(w, h, group_size, clip=clip)
    masks: list[torch.Tensor] = []

    def recording(j: int, cols: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        mask = saliency_prune(j, cols, d)
        if len(cols) == len(w):  # the solve's rows, not the --clip search's rows x candidates
            masks.append(mask)
        return mask

    # blocks narrower than K: lazy batch updates must reproduce the column-by-column algorithm exactly (float64)
    cfg = QuantConfig(group_size=group_size, block_size=max(64, group_size), clip=clip, **SPARSE)
    got = gptq(w, h, cfg, recording)
    codes, scales = stored_to_natural(got)
    assert torch.equal(torch.cat(masks, dim=1), want_pruned)
    assert torch.equal(codes, want_codes)
    assert torch.equal(scales, want_scales)
    assert torch.equal(sparsegpt(w, h, cfg).codes, got.codes)


@pytest.mark.parametrize("solve", ["sparsegpt", "magnitude", "rtn"])
@pytest.mark.parametrize("group_size", [-1, 128])
def test_at_most_two_nonzeros_in_every_four_along_k(solve: str, group_size: int) -> None:
    w, h = correlated_problem(64, 256, 2)
    w, h = w.float(), h.float()
    cfg = QuantConfig(group_size=group_size, **SPARSE)
    result = {
        "sparsegpt": lambda: sparsegpt(w, h, cfg),
        "magnitude": lambda: magnitude_gptq(w, h, cfg),
        "rtn": lambda: magnitude_rtn(w, group_size),
    }[solve]()
    assert_two_of_four(result.codes)
    assert result.perm is None
    weight = result.weight()  # (N, K): the same rule on the dequantized values
    assert int((weight != 0).reshape(64, 64, 4).sum(-1).max()) <= 2


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("seed", [3, 4])
def test_calibrated_beats_magnitude_on_the_hessian_weighted_error(clip: bool, seed: int) -> None:
    w, h = correlated_problem(128, 256, seed)
    w, h = w.float(), h.float()
    cfg = QuantConfig(clip=clip, **SPARSE)
    calibrated = weighted_error(w - sparsegpt(w, h, cfg).weight(), h)
    magnitude = weighted_error(w - magnitude_gptq(w, h, cfg).weight(), h)
    rounded = weighted_error(w - magnitude_rtn(w, 128).weight(), h)
    assert calibrated < 0.9 * magnitude < 0.9 * rounded


def test_weighted_errors_the_solves_bring() -> None:
    """SparseGPT's own weighted error is the direct product (pruned weights included); the magnitude baseline, whose
    solve saw the pruned weights as zeros, brings none."""
    w, h = correlated_problem(32, 256, seed=4)
    result = sparsegpt(w, h, QuantConfig(sparse24=True))
    assert abs(result.weighted_error / weighted_error(w - result.weight().double(), h) - 1) < 1e-12
    assert magnitude_gptq(w, h, QuantConfig(sparse24=True, method=Method.MAGNITUDE)).weighted_error is None


def test_magnitude_keeps_the_two_largest_of_every_four() -> None:
    w = torch.tensor([[0.1, -3.0, 2.0, 0.5, 4.0, 1.0, -2.0, 0.0]])
    assert magnitude_mask(w).tolist() == [[False, True, True, False, True, False, True, False]]
    result = magnitude_rtn(w.repeat(64, 16), 128)
    assert torch.equal((result.codes != 8).T, magnitude_mask(w.repeat(64, 16)))


def test_dead_input_channels_get_zero_weight() -> None:
    w, h = correlated_problem(64, 128, 5)
    h[:, 7] = 0
    h[7, :] = 0
    result = sparsegpt(w, h, QuantConfig(**SPARSE))
    assert torch.all(result.weight()[:, 7] == 0) and torch.isfinite(result.weight()).all()
    assert_two_of_four(result.codes)


def test_singular_hessian_is_retried_with_more_damping() -> None:
    w = torch.randn(64, 128, dtype=torch.float64)
    v = torch.randn(128, 1, dtype=torch.float64)
    result = sparsegpt(w, v @ v.T, QuantConfig(damp=1e-9, **SPARSE))
    assert result.damp >= 1e-9 and torch.isfinite(result.weight()).all()


def test_sparse24_defaults_to_the_natural_order_and_refuses_act_order() -> None:
    assert QuantConfig(**SPARSE).act_order.value == "none"
    assert QuantConfig().act_order.value == "static"
    for order in ("static", "group"):
        with pytest.raises(UsageError, match=f"--act-order {order} with --sparse24.*natural column order"):
            QuantConfig(act_order=order, **SPARSE)
    with pytest.raises(UsageError, match="--method magnitude .* needs --sparse24"):
        QuantConfig(method=Method.MAGNITUDE)
    with pytest.raises(ValueError, match="natural column order"):
        gptq(torch.randn(8, 128), torch.eye(128), QuantConfig(), saliency_prune)


def test_magnitude_mask_keeps_the_earlier_column_on_a_tie() -> None:
    """Weights on a 4-bit grid tie often; the earlier column wins, on every device alike (topk did not promise it)."""
    w = torch.tensor([[1.0, -1.0, 1.0, 0.5, 2.0, 2.0, 2.0, 2.0, 0.25, -3.0, 3.0, -3.0]])
    keep = [[True, True, False, False, True, True, False, False, False, True, True, False]]
    assert magnitude_mask(w).tolist() == keep
    flipped = [[True, True, False, False, True, True, False, False, False, True, True, False]]
    assert magnitude_mask(w.flip(1)).tolist() == flipped


def test_magnitude_mask_is_a_stable_descending_sorts_first_two() -> None:
    """The pairwise rule against its definition: the first 2 of each group of 4 |w| under a stable descending sort,
    on a coarse grid where most groups hold ties."""
    w = (torch.randn(64, 512, generator=torch.Generator().manual_seed(3)) * 2).round() / 2
    groups = w.abs().reshape(64, 128, 4)
    assert (groups.unsqueeze(-1) == groups.unsqueeze(-2)).sum((-1, -2)).gt(4).float().mean() > 0.5, "ties are common"
    first = torch.sort(groups, dim=2, descending=True, stable=True).indices[..., :2]
    want = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, first, True).reshape(64, 512)
    assert torch.equal(magnitude_mask(w), want)


def test_rtn_solves_in_no_column_order() -> None:
    """RTN rounds each weight on its own: its act-order is none, and another is refused (it once wrote desc_act with
    no permutation to go with it)."""
    assert QuantConfig(method=Method.RTN).act_order.value == "none"
    assert QuantConfig(method=Method.RTN, **SPARSE).act_order.value == "none"
    for order in ("static", "group"):
        with pytest.raises(UsageError, match=f"--act-order {order} with --method rtn"):
            QuantConfig(method=Method.RTN, act_order=order)
