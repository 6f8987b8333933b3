"""The Marlin dense layout: bit-exact round trips, and a known answer that pins the tile order to DESIGN.md 3.1."""

from __future__ import annotations

import pytest
import torch

from marlin_cli import grid
from marlin_cli.algo.gptq import gptq
from marlin_cli.config import QuantConfig
from marlin_cli.errors import ShapeError
from marlin_cli.formats import marlin

SHAPES = [(128, 64), (256, 192), (384, 1536), (1536, 384)]


@pytest.mark.parametrize(("dtype", "bits"), [(torch.int32, 32), (torch.int16, 16)])
def test_nibble_packing_matches_shifts_and_sums(dtype: torch.dtype, bits: int) -> None:
    """grid.pack_nibbles (bytes of a word reinterpreted) against the arithmetic definition: entry i times 16**i,
    summed, as a two's-complement word, from entries along any axis; unpack_nibbles must invert it, its values after
    any axis of the words."""
    per = bits // 4
    values = torch.randint(0, 16, (37, 5, per), generator=torch.Generator().manual_seed(bits), dtype=torch.uint8)
    sums = (values.to(torch.int64) << torch.arange(0, bits, 4)).sum(-1)
    want = torch.where(sums >= 2 ** (bits - 1), sums - 2**bits, sums).to(dtype)
    packed = grid.pack_nibbles(values, dtype)
    assert packed.dtype == dtype and torch.equal(packed, want)
    assert torch.equal(grid.pack_nibbles(values.permute(0, 2, 1), dtype, dim=1), want)  # entries along another axis
    assert torch.equal(grid.unpack_nibbles(packed), values)
    assert torch.equal(grid.unpack_nibbles(packed, 1), values)
    assert torch.equal(grid.unpack_nibbles(packed, 0), values.permute(0, 2, 1))  # (37, per, 5)
    assert torch.equal(grid.unpack_nibbles(packed.T, 0), values.permute(1, 2, 0))  # words not contiguous


@pytest.mark.parametrize("k,n", SHAPES, ids=[f"{k}x{n}" for k, n in SHAPES])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
def test_round_trip_is_bit_exact(k: int, n: int, group_size: int) -> None:
    gen = torch.Generator().manual_seed(k * n + group_size)
    codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
    groups = 1 if group_size == -1 else k // group_size
    scales = (torch.rand(groups, n, generator=gen) + 0.01).half()
    packed = marlin.pack_weight(codes)
    assert packed.shape == (k // 16, 2 * n) and packed.dtype == torch.int32
    assert torch.equal(marlin.unpack_weight(packed), codes)
    packed_s = marlin.pack_scales(scales)
    assert packed_s.shape == scales.shape and packed_s.dtype == torch.float16
    assert torch.equal(marlin.unpack_scales(packed_s), scales)


@pytest.mark.parametrize("act_order", ["none", "static", "group"])
@pytest.mark.parametrize("group_size", [-1, 32, 128])
def test_quantized_layer_round_trip(act_order: str, group_size: int) -> None:
    """codes, scales and permutation of a real GPTQ result come back unchanged from the packed tensors."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 256, generator=gen)
    result = gptq(
        torch.randn(128, 256, generator=gen), 2 * x.T @ x / 512, QuantConfig(group_size=group_size, act_order=act_order)
    )
    assert (result.perm is not None) == (act_order == "group")
    assert torch.equal(marlin.unpack_weight(marlin.pack_weight(result.codes)), result.codes)
    assert torch.equal(marlin.unpack_scales(marlin.pack_scales(result.scales)).float(), result.scales)


def test_first_word_holds_the_mma_fragment_of_tile_0() -> None:
    """Word 0 of row 0 holds W[k, n] at (0,0) (8,0) (0,8) (8,8) (1,0) (9,0) (1,8) (9,8): lane 0's B fragment of the
    two m16n8k16 halves, nibbles interleaved so pairs convert together (DESIGN.md 3.1 steps 2 and 3)."""
    codes = torch.zeros(128, 64, dtype=torch.uint8)
    where = [(0, 0), (8, 0), (0, 8), (8, 8), (1, 0), (9, 0), (1, 8), (9, 8)]
    for value, (k, n) in enumerate(where, start=1):
        codes[k, n] = value if value < 16 else 0
    word = int(marlin.pack_weight(codes)[0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == list(range(1, 9))


def test_scale_permutations_are_the_documented_ones() -> None:
    assert marlin.scale_perm(True)[:10].tolist() == [0, 8, 16, 24, 32, 40, 48, 56, 1, 9]
    assert marlin.scale_perm(False)[:10].tolist() == [0, 1, 8, 9, 16, 17, 24, 25, 2, 3]


@pytest.mark.parametrize(
    "k,n,group_size,rule",
    [
        (100, 64, 128, "multiple of 128"),
        (128, 96, 128, "multiple of 64"),
        (128, 64, 48, "group size 48"),
        (384, 64, 256, "group size 256"),
    ],
)
def test_shapes_the_layout_refuses(k: int, n: int, group_size: int, rule: str) -> None:
    assert rule in (marlin.shape_problem(k, n, group_size) or "")


def test_pack_refuses_bad_shapes() -> None:
    with pytest.raises(ShapeError, match="multiple of 128"):
        marlin.pack_weight(torch.zeros(100, 64, dtype=torch.uint8))
