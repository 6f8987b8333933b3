"""Group scales: the batched search of marlin_cli/algo/scales.py against a plain loop over groups and clipping
factors (the algorithm as written down: for each group, try every factor in order, keep the first best), on random
weights of unequal column scale with all-zero groups, with and without per-column error costs. Same operations per
group, so the scales must be identical, not close."""

from __future__ import annotations

import pytest
import torch

from marlin_cli import grid
from marlin_cli.algo import scales
from marlin_cli.algo.scales import CLIP_FACTORS, group_scales, to_fp16_grid


def reference_scales(w: torch.Tensor, g: int, costs: torch.Tensor | None, clip: bool) -> torch.Tensor:
    out = []
    for c in range(0, w.shape[1], g):
        block = w[:, c : c + g]
        amax = block.abs().amax(dim=1)
        best, best_err = to_fp16_grid(amax / 7.5), torch.full_like(amax, float("inf"))
        for factor in CLIP_FACTORS if clip else ():
            s = to_fp16_grid(amax * factor / 7.5).unsqueeze(1)
            d = block - grid.decode(grid.encode(block, s), s)
            err = d.square().sum(1) if costs is None else (d.square() * costs[c : c + g]).sum(1)
            best = torch.where(err < best_err, s.squeeze(1), best)
            best_err = torch.minimum(err, best_err)
        out.append(best)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize(("n", "k", "group_size"), [(96, 512, 32), (64, 256, 128), (200, 384, -1), (130, 768, 64)])
@pytest.mark.parametrize("with_costs", [True, False])
@pytest.mark.parametrize("clip", [True, False])
@pytest.mark.parametrize("search_elements", [1 << 19, 1 << 12])  # several groups per pass, and one
def test_group_scales_match_the_plain_loop(
    n: int,
    k: int,
    group_size: int,
    with_costs: bool,
    clip: bool,
    search_elements: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(scales.SEARCH_ELEMENTS, "cpu", search_elements)
    gen = torch.Generator().manual_seed(k + n)
    w = torch.randn(n, k, generator=gen) * torch.rand(k, generator=gen) * 3
    g = k if group_size == -1 else group_size
    w[0, :g] = 0.0
    w[1, -g:] = -0.0
    costs = torch.rand(k, generator=gen) * 10 if with_costs else None
    got = group_scales(w, group_size, costs, clip)
    assert torch.equal(got, reference_scales(w, g, costs, clip))
    assert got.shape == (n, k // g) and bool((got > 0).all())
