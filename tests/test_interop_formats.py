"""GPTQ and compressed-tensors tensors <-> our (codes, scales, perm): bit-exact round trips and clear refusals."""

from __future__ import annotations

import pytest
import torch

from marlin_cli import grid
from marlin_cli.errors import CheckpointError
from marlin_cli.formats import compressed_tensors as ct
from marlin_cli.formats import gptq
from marlin_cli.formats.gptq import Layer

GROUP_SIZES = [-1, 32, 64, 128]


def random_layer(k: int, n: int, group_size: int, act_order: bool, seed: int = 0) -> Layer:
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else k // group_size
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(groups, n, generator=gen) + 0.01).half().float()
    perm = torch.randperm(k, generator=gen) if act_order and groups > 1 else None
    return Layer(codes, scales, perm)


def dense(layer: Layer) -> torch.Tensor:
    """(N, K) float32 weight in the natural input order."""
    w = grid.decode(layer.codes, layer.scales.repeat_interleave(layer.codes.shape[0] // layer.scales.shape[0], dim=0))
    if layer.perm is not None:
        w = torch.empty_like(w).index_copy_(0, layer.perm.long(), w)
    return w.T


def assert_same_layer(got: Layer, want: Layer) -> None:
    """Same codes, scales and permutation; for a permuted layer, any perm ordering each group's rows the same way."""
    assert torch.equal(got.scales, want.scales)
    assert (got.perm is None) == (want.perm is None)
    assert torch.equal(dense(got), dense(want))
    if want.perm is None:
        assert torch.equal(got.codes, want.codes)


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_round_trip(fmt: str, group_size: int, act_order: bool) -> None:
    layer = random_layer(256, 192, group_size, act_order)
    t = gptq.to_gptq(layer, fmt)
    assert t["qweight"].shape == (32, 192) and t["qweight"].dtype == torch.int32
    assert t["qzeros"].shape == (layer.scales.shape[0], 24) and t["scales"].dtype == torch.float16
    assert t["g_idx"].shape == (256,) and t["g_idx"].dtype == torch.int32
    word = 0x77777777 if fmt == "gptq" else 0x88888888
    assert (t["qzeros"].to(torch.int64) & 0xFFFFFFFF).eq(word).all()
    back = gptq.from_gptq(t, "layer", checkpoint_format=fmt)
    assert_same_layer(back, layer)
    assert torch.equal(gptq.dequantize(t, "layer", checkpoint_format=fmt), dense(layer))
    # converting again gives the very same tensors
    again = gptq.to_gptq(back, fmt)
    assert all(torch.equal(again[key], t[key]) for key in t)


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_compressed_tensors_round_trip(group_size: int, act_order: bool) -> None:
    layer = random_layer(384, 128, group_size, act_order, seed=3)
    t = ct.to_compressed(layer)
    assert t["weight_packed"].shape == (128, 48) and t["weight_packed"].dtype == torch.int32
    assert t["weight_scale"].shape == (128, layer.scales.shape[0])
    assert t["weight_shape"].tolist() == [128, 384]
    assert ("weight_g_idx" in t) == (layer.perm is not None)
    assert torch.equal(t["weight_packed"], gptq.to_gptq(layer)["qweight"].T), "weight_packed is qweight transposed"
    back = ct.from_compressed(t, "layer")
    assert_same_layer(back, layer)
    assert torch.equal(ct.dequantize(t, "layer"), dense(layer))


def test_first_word_bit_order() -> None:
    """Input rows 0..7 of column 0 land in bits 0-3, 4-7, ... of qweight[0, 0] (DESIGN.md 3.3)."""
    codes = torch.zeros(128, 64, dtype=torch.uint8)
    codes[:8, 0] = torch.arange(1, 9, dtype=torch.uint8)
    word = int(gptq.to_gptq(Layer(codes, torch.ones(1, 64), None))["qweight"][0, 0]) & 0xFFFFFFFF
    assert word == 0x87654321


def test_desc_act_g_idx_becomes_a_sorting_perm() -> None:
    """A non-monotone g_idx (desc_act) gives a perm that makes every group contiguous, with the same dequant."""
    k, n, g = 256, 64, 64
    gen = torch.Generator().manual_seed(5)
    g_idx = (torch.arange(k) // g)[torch.randperm(k, generator=gen)].to(torch.int32)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(k // g, n, generator=gen) + 0.1).half()
    zeros = gptq.pack_along(torch.full((k // g, n), 7, dtype=torch.uint8), 1)
    t = {"qweight": gptq.pack_along(codes, 0), "qzeros": zeros, "scales": scales, "g_idx": g_idx}
    layer = gptq.from_gptq(t, "layer")
    assert layer.perm is not None
    assert torch.equal(g_idx[layer.perm].long(), torch.arange(k) // g), "stored rows are sorted by group"
    assert torch.equal(dense(layer), gptq.dequantize(t, "layer"))


def test_refusals_name_the_tensor() -> None:
    layer = random_layer(128, 64, 32, False)
    t = gptq.to_gptq(layer)
    asym = dict(t, qzeros=gptq.pack_along(torch.full((4, 64), 3, dtype=torch.uint8), 1))
    with pytest.raises(CheckpointError, match=r"layer\.qzeros .*asymmetric.*--requantize"):
        gptq.from_gptq(asym, "layer")
    with pytest.raises(CheckpointError, match="8-bit GPTQ.*--requantize"):
        gptq.from_gptq(t, "layer", bits=8)
    bad_groups = dict(t, g_idx=torch.zeros(128, dtype=torch.int32))
    with pytest.raises(CheckpointError, match=r"layer\.g_idx has groups of 0\.\.128 rows"):
        gptq.from_gptq(bad_groups, "layer")
    c = ct.to_compressed(layer)
    with pytest.raises(CheckpointError, match=r"layer\.weight_zero_point: asymmetric"):
        ct.from_compressed(dict(c, weight_zero_point=torch.zeros(8, 4, dtype=torch.int32)), "layer")
    with pytest.raises(CheckpointError, match="8-bit"):
        ct.from_compressed(c, "layer", num_bits=8)


def test_dequantize_refuses_tensors_that_disagree() -> None:
    """Dequantization (what --requantize and verify read) checks the shapes and group numbers it indexes with."""
    t = gptq.to_gptq(random_layer(128, 64, 32, False))
    for bad, phrase in [
        (
            dict(t, g_idx=torch.full((128,), 4, dtype=torch.int32)),
            r"layer\.g_idx must hold 128 group numbers in 0\.\.3",
        ),
        (dict(t, g_idx=torch.zeros(64, dtype=torch.int32)), r"layer\.g_idx must hold 128 group numbers"),
        (dict(t, scales=t["scales"][:, :32]), r"layer\.scales is \[4, 32\], qweight implies N=64"),
        ({k: v for k, v in dict(t, qweight=t["qweight"][:0]).items() if k != "g_idx"}, "do not divide in_features=0"),
    ]:
        with pytest.raises(CheckpointError, match=phrase):
            gptq.dequantize(bad, "layer")
    c = ct.to_compressed(random_layer(128, 64, 32, False))
    for bad, phrase in [
        (dict(c, weight_shape=torch.tensor([64, 136])), r"weight_packed is \[64, 16\], which does not hold"),
        (dict(c, weight_scale=c["weight_scale"][:32]), r"weight_scale is \[32, 4\], weight_shape says N=64"),
    ]:
        with pytest.raises(CheckpointError, match=phrase):
            ct.dequantize(bad, "layer")


def test_asymmetric_and_8bit_dequantize() -> None:
    """What cannot be converted exactly can still be dequantized (the --requantize path)."""
    gen = torch.Generator().manual_seed(2)
    k, n, g = 128, 64, 32
    q = torch.randint(0, 256, (k, n), generator=gen, dtype=torch.uint8)
    z = torch.randint(100, 150, (k // g, n), generator=gen, dtype=torch.uint8)
    s = torch.rand(k // g, n, generator=gen).half()
    t = {"qweight": gptq.pack_along(q, 0, 8), "qzeros": gptq.pack_along(z, 1, 8), "scales": s}
    want = ((q.float() - z.float().repeat_interleave(g, 0)) * s.float().repeat_interleave(g, 0)).T
    assert torch.equal(gptq.dequantize(t, "layer", bits=8, checkpoint_format="gptq_v2"), want)
