"""GPTQ against the paper's algorithm, RTN, and its numerical corner cases."""

from __future__ import annotations

import pytest
import torch
from gptq_reference import reference_gptq

from marlin_cli.algo.gptq import gptq, inverse_cholesky
from marlin_cli.algo.hessian import Hessian, weighted_error
from marlin_cli.algo.rtn import rtn
from marlin_cli.config import QuantConfig
from marlin_cli.errors import NumericalError


def correlated_problem(n: int, k: int, seed: int, tokens: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """Random weights and the Hessian of inputs with correlated channels of unequal scale (like real activations)."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=gen, dtype=torch.float64) / k**0.5 + torch.eye(k, dtype=torch.float64)
    x = (
        torch.randn(tokens, k, generator=gen, dtype=torch.float64)
        @ mix
        * torch.rand(k, generator=gen, dtype=torch.float64)
        * 3
    )
    return torch.randn(n, k, generator=gen, dtype=torch.float64), 2 * x.T @ x / tokens


def stored_to_natural(result) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """(N, K) codes and per-column scales in the original column order."""
    k = result.codes.shape[0]
    codes, scales = result.codes.double(), result.scales.double().repeat_interleave(k // result.scales.shape[0], dim=0)
    if result.perm is not None:
        codes = torch.empty_like(codes).index_copy_(0, result.perm, codes)
        scales = torch.empty_like(scales).index_copy_(0, result.perm, scales)
    return codes.T, scales.T


@pytest.mark.parametrize("act_order", ["none", "static", "group"])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_codes_and_scales_as_the_papers_algorithm(act_order: str, group_size: int, clip: bool, seed: int) -> None:
    """With --clip too: the batched searches (every candidate through the column loop at once for a group set as it
    starts; the 1 / U_jj^2-weighted rounding error for fixed scales) against the reference's plain loops."""
    w, h = correlated_problem(64, 256, seed)
    want_codes, want_scales = reference_gptq(w, h, group_size, act_order, clip=clip)
    # blocks narrower than K: the lazy batch updates must reproduce the column-by-column algorithm exactly (float64)
    cfg = QuantConfig(group_size=group_size, act_order=act_order, block_size=max(64, group_size), clip=clip)
    got = gptq(w, h, cfg)
    codes, scales = stored_to_natural(got)
    assert torch.equal(codes, want_codes)
    assert torch.equal(scales, want_scales)


@pytest.mark.parametrize("act_order", ["none", "static", "group"])
@pytest.mark.parametrize("clip", [False, True])
def test_gptq_beats_rtn_on_the_calibration_hessian(act_order: str, clip: bool) -> None:
    w, h = correlated_problem(128, 256, 3)
    w, h = w.float(), h.float()
    base = weighted_error(w - rtn(w, 128).weight(), h)
    err = weighted_error(w - gptq(w, h, QuantConfig(act_order=act_order, clip=clip)).weight(), h)
    assert err < 0.8 * base


def test_clip_search_lowers_the_error() -> None:
    w, h = correlated_problem(128, 256, 4)
    w, h = w.float(), h.float()
    plain = weighted_error(w - gptq(w, h, QuantConfig()).weight(), h)
    clipped = weighted_error(w - gptq(w, h, QuantConfig(clip=True)).weight(), h)
    assert clipped < plain


def test_dead_input_channels_get_zero_weight() -> None:
    w, h = correlated_problem(64, 128, 5)
    h[:, 7] = 0
    h[7, :] = 0
    result = gptq(w, h, QuantConfig())
    assert torch.all(result.weight()[:, 7] == 0)
    assert torch.isfinite(result.weight()).all()


@pytest.mark.parametrize("k", [192, 2100])  # 2100: the triangular inverse by halves, twice (TRI_SOLVE = 1024)
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_inverse_cholesky_is_the_upper_factor_of_the_damped_inverse(
    k: int, dtype: torch.dtype, tolerance: float
) -> None:
    """U upper triangular with a positive diagonal and U^T U = (H + d mean(diag H) I)^-1, against float64 inversion.
    float32 lands at 1.8e-7 (K = 192) and 3.7e-7 (K = 2100) of the largest entry here: 27-55x margin."""
    _, h = correlated_problem(1, k, seed=3)
    upper, d = inverse_cholesky(h.to(dtype), 0.01)
    damped = h + d * h.diagonal().mean() * torch.eye(k, dtype=torch.float64)
    expected = torch.linalg.cholesky(torch.linalg.inv(damped), upper=True)
    assert d == 0.01 and upper.dtype == dtype
    assert torch.equal(upper, upper.triu()) and bool((upper.diagonal() > 0).all())
    err = ((upper.double() - expected).abs().max() / expected.abs().max()).item()
    print(f"\nK={k} {dtype}: {err:.1e} of the largest entry")
    assert err < tolerance


@pytest.mark.parametrize("act_order", ["none", "static", "group"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_solves_weighted_error_is_the_direct_product(act_order: str, dtype: torch.dtype, tolerance: float) -> None:
    """||E||^2 - lambda ||dW||^2 from the solve's column errors is tr(dW H dW^T), with a dead input too. float32 lands
    within 3e-7 of the float64 product on these problems."""
    w, h = correlated_problem(48, 256, seed=1)
    h[5], h[:, 5] = 0, 0
    for cfg in (QuantConfig(act_order=act_order, group_size=32), QuantConfig(act_order=act_order, clip=True)):
        result = gptq(w.to(dtype), h.to(dtype), cfg)
        direct = weighted_error(w - result.weight().double(), h)
        assert abs(result.weighted_error / direct - 1) < tolerance


def test_singular_hessian_is_retried_with_more_damping() -> None:
    """Rank-1 Hessian: the first damping may or may not pass, but the result must be finite and the damping reported."""
    w = torch.randn(64, 128, dtype=torch.float64)
    v = torch.randn(128, 1, dtype=torch.float64)
    result = gptq(w, v @ v.T, QuantConfig(damp=1e-9))
    assert result.damp >= 1e-9 and torch.isfinite(result.weight()).all()


def test_hessian_that_is_not_a_matrix_of_numbers_fails_clearly() -> None:
    h = torch.full((128, 128), float("nan"), dtype=torch.float64)
    with pytest.raises(NumericalError, match="not positive definite"):
        gptq(torch.randn(64, 128, dtype=torch.float64), h, QuantConfig())


def test_hessian_running_mean_equals_the_direct_sum() -> None:
    x = torch.randn(3000, 96)
    h = Hessian(96)
    for chunk in x.split(700):
        h.add(chunk)
    assert h.tokens == 3000
    torch.testing.assert_close(h.matrix, 2 * x.T @ x / 3000, rtol=1e-4, atol=1e-4)


def test_rtn_codes_are_round_to_nearest() -> None:
    w = torch.randn(64, 256)
    result = rtn(w, 128)
    scales = (w.abs().reshape(64, 2, 128).amax(-1) / 7.5).half().float()  # (N, G)
    torch.testing.assert_close(result.scales, scales.T)
    want = torch.clamp(torch.round(w / scales.repeat_interleave(128, 1)) + 8, 0, 15)
    assert torch.equal(result.codes.T.float(), want)
