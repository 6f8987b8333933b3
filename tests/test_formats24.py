"""The Sparse-MARLIN 2:4 layout: bit-exact round trips, known answers that pin the metadata nibbles, the metadata order
and the tile order to DESIGN.md 3.2, and the errors for codes or shapes the layout cannot take."""

from __future__ import annotations

import pytest
import torch

from marlin_cli import grid
from marlin_cli.errors import CheckpointError, ShapeError
from marlin_cli.formats import marlin24
from marlin_cli.kernel import ops, reference

SHAPES = [(128, 128), (256, 384), (384, 1536), (1536, 256)]


def random_24_codes(k: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 codes (K, N) obeying 2:4 along K: each group of 4 has 0, 1 or 2 non-zero codes (1..15 except 8) at
    random positions, so every kind of group is present."""
    nonzeros = torch.randint(0, 3, (k // 4, 1, n), generator=gen)
    rank = torch.rand(k // 4, 4, n, generator=gen).argsort(dim=1).argsort(dim=1)  # a random order of the 4 positions
    values = torch.randint(1, 15, (k // 4, 4, n), generator=gen)
    values = values + (values >= grid.ZERO).to(values.dtype)  # 1..15 without 8
    codes = torch.where(rank < nonzeros, values, grid.ZERO)
    return codes.reshape(k, n).to(torch.uint8)


def _meta_word(meta: torch.Tensor, row: int, col: int) -> int:
    return int(meta[row, col]) & 0xFFFF


@pytest.mark.parametrize("k,n", SHAPES, ids=[f"{k}x{n}" for k, n in SHAPES])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
def test_round_trip_is_bit_exact(k: int, n: int, group_size: int) -> None:
    gen = torch.Generator().manual_seed(k * n + group_size)
    codes = random_24_codes(k, n, gen)
    counts = (codes.reshape(k // 4, 4, n) != grid.ZERO).sum(1)
    assert {0, 1, 2} <= set(counts.unique().tolist())
    groups = 1 if group_size == -1 else k // group_size
    scales = (torch.rand(groups, n, generator=gen) + 0.01).half().float()
    packed = marlin24.pack(codes, scales)
    assert packed["B_24"].shape == (k // 32, 2 * n) and packed["B_24"].dtype == torch.int32
    assert packed["B_meta"].shape == (k // 32, 2 * n) and packed["B_meta"].dtype == torch.int16
    assert packed["s"].shape == (groups, n) and packed["s"].dtype == torch.float16
    codes_back, scales_back = marlin24.unpack(packed["B_24"], packed["B_meta"], packed["s"])
    assert codes_back.dtype == torch.uint8 and torch.equal(codes_back, codes)
    assert scales_back.dtype == torch.float32 and torch.equal(scales_back, scales)


def test_every_stored_group_names_two_positions() -> None:
    """Groups with fewer than 2 non-zeros still store 2 distinct positions (mma.sp rejects idx0 == idx1)."""
    codes = torch.full((128, 128), grid.ZERO, dtype=torch.uint8)
    meta = marlin24.pack(codes, torch.ones(1, 128))["B_meta"]
    assert {_meta_word(meta, r, c) for r in range(4) for c in range(256)} == {0x4444}  # [T,T,F,F] everywhere


def test_metadata_nibbles_and_order() -> None:
    """Known answer: nibble idx0 | idx1 << 2 per group of 4, four per int16 along K, and the int16 words of columns
    n, n + 8 (K 0..15) side by side, then K 16..31, then columns n + 16, n + 24 (DESIGN.md 3.2, `meta_perm`)."""
    codes = torch.full((128, 256), grid.ZERO, dtype=torch.uint8)
    codes[0:2, 0] = 3  # group 0: [T,T,F,F] -> 0b0100
    codes[6:8, 0] = 5  # group 1: [F,F,T,T] -> 0b1110
    codes[9, 0], codes[11, 0] = 1, 15  # group 2: [F,T,F,T] -> 0b1101
    codes[14, 0] = 2  # group 3: [F,F,T,F] keeps its first zero: positions 0, 2 -> 0b1000
    codes[16, 8] = 4  # column 8, group 4 (K 16..19): [T,F,F,F] -> positions 0, 1 -> 0b0100
    codes[19, 8] = 6  # ... and group 4 of column 8 gets [T,F,F,T] -> 0b1100
    codes[55, 49] = 7  # column 49 = 32 + 16 + 1 (a = 1, b = 2, 3), K 48..63, group 1 of that word: 0b1100
    meta = marlin24.pack(codes, torch.ones(1, 256))["B_meta"]
    assert _meta_word(meta, 0, 0) == 0b1000_1101_1110_0100  # column 0, K 0..15
    assert _meta_word(meta, 0, 1) == 0x4444  # column 8, K 0..15
    assert _meta_word(meta, 0, 3) == 0x444C  # column 8, K 16..31 (word 4a + b = 1, high half)
    assert _meta_word(meta, 1, 0) == 0x4444  # column 0, K 32..47
    assert _meta_word(meta, 1, 64 + 2 * (4 * 1 + 2)) == 0x4444  # column 49, K 32..47: word 4a + b = 6, low half
    assert _meta_word(meta, 1, 64 + 2 * (4 * 1 + 3)) == 0x44C4  # column 49, K 48..63: word 4a + b = 7, low half
    assert torch.equal(marlin24.unpack(*marlin24.pack(codes, torch.ones(1, 256)).values())[0], codes)


def test_metadata_order_is_cutlass_interleaved() -> None:
    """`meta_perm` agrees with the metadata reordering torch carries for its CUTLASS 2:4 kernels (int16 metadata),
    an independent statement of the ColumnMajorInterleaved<2> arrangement DESIGN.md 3.2 names."""
    conversions = pytest.importorskip("torch.sparse._semi_structured_conversions")
    rows, cols = 64, 4  # N = 64 columns, K = 64 (four int16 words per column)
    offsets = conversions._calculate_meta_reordering_scatter_offsets(rows, cols, torch.int16, "cpu")
    src = torch.arange(rows * cols).reshape(rows, cols)  # (N, K/16)
    theirs = torch.empty(rows * cols, dtype=torch.int64)
    theirs[offsets] = src.reshape(-1)
    m = src.reshape(rows // 32, 32, cols // 2, 2).permute(2, 0, 1, 3).reshape(cols // 2, rows // 32, 64)
    ours = m[:, :, marlin24.meta_perm()].reshape(-1)
    assert torch.equal(ours, theirs)


def test_first_word_holds_lane_0_fragment() -> None:
    """Word 0 of B_24 holds the kept codes of (compressed row, column) (0,0) (8,0) (0,4) (8,4) (1,0) (9,0) (1,4) (9,4):
    lane 0's rows of the sparse A fragment for columns 0 and 4, nibbles interleaved so pairs convert together."""
    codes = torch.full((128, 128), grid.ZERO, dtype=torch.uint8)
    # groups 0 and 4 keep positions 0, 1: compressed rows 0, 1 are K rows 0, 1 and rows 8, 9 are K rows 16, 17
    where = [(0, 0), (16, 0), (0, 4), (16, 4), (1, 0), (17, 0), (1, 4), (17, 4)]
    values = [1, 2, 3, 4, 5, 6, 7, 9]
    for v, (k, n) in zip(values, where):
        codes[k, n] = v
    word = int(marlin24.pack(codes, torch.ones(1, 128))["B_24"][0, 0]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == values


def test_lane_word_covers_its_columns() -> None:
    """Word j of lane 4c + t holds columns 8c + j and 8c + j + 4 at compressed rows 2t, 2t + 1, 2t + 8, 2t + 9."""
    codes = torch.full((128, 128), grid.ZERO, dtype=torch.uint8)
    c, t, j = 5, 3, 2
    n0 = 8 * c + j
    # group t keeps K rows 4t + 2, 4t + 3 (positions 2, 3); group t + 4 keeps positions 0, 3
    codes[4 * t + 2, n0], codes[4 * (t + 4), n0], codes[4 * t + 2, n0 + 4], codes[4 * (t + 4), n0 + 4] = 1, 2, 3, 4
    codes[4 * t + 3, n0], codes[4 * (t + 4) + 3, n0], codes[4 * t + 3, n0 + 4], codes[4 * (t + 4) + 3, n0 + 4] = (
        5,
        6,
        7,
        9,
    )
    word = int(marlin24.pack(codes, torch.ones(1, 128))["B_24"][0, 4 * (4 * c + t) + j]) & 0xFFFFFFFF
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [1, 2, 3, 4, 5, 6, 7, 9]


def test_scale_permutations_are_the_documented_ones() -> None:
    assert marlin24.scale_perm(True)[:10].tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12]
    assert torch.equal(marlin24.scale_perm(False), torch.arange(64))


def test_reference_dequantizes_the_stored_codes() -> None:
    gen = torch.Generator().manual_seed(7)
    codes = random_24_codes(256, 128, gen)
    scales = (torch.rand(2, 128, generator=gen) + 0.5).half().float()
    packed = marlin24.pack(codes, scales)
    w = reference.dequantize24(packed["B_24"], packed["B_meta"], packed["s"])
    assert torch.equal(w, grid.decode(codes, scales.repeat_interleave(256 // scales.shape[0], dim=0)))
    a = torch.randn(5, 256, generator=gen)
    c = reference.gemm24(a, packed["B_24"], packed["B_meta"], packed["s"])
    assert c.dtype == torch.float32 and torch.allclose(c, a @ w)


def test_pack_names_the_first_group_with_three_nonzeros() -> None:
    codes = random_24_codes(256, 128, torch.Generator().manual_seed(3))
    codes[4:8, 3] = torch.tensor([1, 8, 2, 3], dtype=torch.uint8)
    codes[200:204, 1] = 9
    with pytest.raises(ShapeError, match=r"rows 4\.\.7 of column 3 hold 3 non-zero"):
        marlin24.pack(codes, torch.ones(1, 128))


@pytest.mark.parametrize(
    "k,n,groups,rule",
    [
        (100, 128, 1, "multiple of 128"),
        (128, 64, 1, "out_features=64 is not a multiple of 128"),
        (512, 128, 2, "group size 256"),
        (384, 128, 5, "do not divide"),
    ],
)
def test_pack_refuses_bad_shapes(k: int, n: int, groups: int, rule: str) -> None:
    with pytest.raises(ShapeError, match=rule):
        marlin24.pack(torch.full((k, n), grid.ZERO, dtype=torch.uint8), torch.ones(groups, n))


def test_shape_problem() -> None:
    assert marlin24.shape_problem(4096, 11008, 128) is None
    assert "group size 48" in (marlin24.shape_problem(4096, 4096, 48) or "")
    assert "out_features=4160" in (marlin24.shape_problem(4096, 4160, 128) or "")


def test_pack_refuses_mismatched_operands() -> None:
    with pytest.raises(ShapeError, match="must be"):
        marlin24.pack(torch.full((128, 128), grid.ZERO, dtype=torch.uint8), torch.ones(1, 64))
    with pytest.raises(ShapeError, match="4-bit"):
        marlin24.pack(torch.full((128, 128), 16, dtype=torch.uint8), torch.ones(1, 128))


def test_unpack_refuses_corrupt_metadata_and_shapes() -> None:
    packed = marlin24.pack(torch.full((128, 128), grid.ZERO, dtype=torch.uint8), torch.ones(1, 128))
    meta = packed["B_meta"].clone()
    meta[0, 5] = 0x4445  # a nibble 0b0101 names position 1 twice
    with pytest.raises(CheckpointError, match="0b0101"):
        marlin24.unpack(packed["B_24"], meta, packed["s"])
    with pytest.raises(ShapeError, match="B_meta"):
        marlin24.unpack(packed["B_24"], packed["B_meta"][:, :128], packed["s"])
    with pytest.raises(ShapeError, match="N=128"):
        marlin24.unpack(packed["B_24"], packed["B_meta"], packed["s"][:, :64])


def test_gemm24_on_cpu_runs_the_reference() -> None:
    gen = torch.Generator().manual_seed(11)
    codes = random_24_codes(256, 128, gen)
    packed = marlin24.pack(codes, (torch.rand(2, 128, generator=gen) + 0.5).half().float())
    a = torch.randn(3, 256, generator=gen)
    c = ops.gemm24(a, ops.prepare24(packed["B_24"], packed["B_meta"]), packed["s"])
    assert torch.equal(c, reference.gemm24(a, packed["B_24"], packed["B_meta"], packed["s"]))


@pytest.mark.parametrize(
    "m,k,n,groups,rule",
    [
        (0, 256, 128, 1, "at least 1"),
        (2, 200, 128, 1, "multiple of 128"),
        (2, 256, 64, 1, r"out_features=64 must be a multiple of 128 \(2:4"),
        (2, 256, 128, 3, "do not fit"),
    ],
)
def test_gemm24_refuses_bad_shapes_before_any_launch(m: int, k: int, n: int, groups: int, rule: str) -> None:
    b24 = torch.zeros(max(k // 32, 1), 2 * n, dtype=torch.int32)
    meta = torch.zeros_like(b24, dtype=torch.int16)
    with pytest.raises(ShapeError, match=rule):
        ops.gemm24(torch.zeros(m, k), ops.prepare24(b24, meta), torch.ones(groups, n))


def test_gemm24_refuses_mismatched_metadata() -> None:
    a, b24 = torch.zeros(1, 256), torch.zeros(8, 256, dtype=torch.int32)
    with pytest.raises(ShapeError, match="do not match"):
        ops.gemm24(a, ops.prepare24(b24, torch.zeros(4, 256, dtype=torch.int16)), torch.ones(1, 128))
    with pytest.raises(ShapeError, match="2-D"):
        ops.gemm24(a, ops.prepare24(b24, torch.zeros(8, 256, 1, dtype=torch.int16)), torch.ones(1, 128))
    with pytest.raises(TypeError, match="prepare24"):  # the codes alone, not prepare24's pair
        ops.gemm24(a, b24, torch.ones(1, 128))


def test_kernel_order_places_each_word_as_the_hopper_kernels_read_it() -> None:
    """Stored word 4c + w of k32 row r of a strip (word w of lane chunk c = 8g + 4h + t) lands in the (tile r // 4,
    strip, row r % 4) block of 256 words at 64w + 32h + (4g + t + 4h + 8w) % 32 (kernels/marlin24_sm90.cu,
    kernel_word); metadata chunk c of the row in its block at c ^ (c >> 3 & 3)."""
    gen = torch.Generator().manual_seed(3)
    b24 = torch.randint(-(2**31), 2**31 - 1, (8, 512), generator=gen, dtype=torch.int64).int()  # 2 tiles, 2 strips
    meta = torch.randint(-(2**15), 2**15 - 1, (8, 512), generator=gen, dtype=torch.int64).short()
    kb, km = (t.flatten() for t in marlin24.to_kernel_order(b24, meta))
    for row, strip, g, h, t, w in [(0, 0, 0, 0, 0, 0), (1, 0, 7, 1, 3, 3), (6, 1, 2, 0, 1, 2), (7, 1, 5, 1, 0, 1)]:
        block = 256 * (2 * 4 * (row // 4) + 4 * strip + row % 4)
        at = block + 64 * w + 32 * h + (4 * g + t + 4 * h + 8 * w) % 32
        assert kb[at] == b24[row, 256 * strip + 4 * (8 * g + 4 * h + t) + w]
    for row, strip, c in [(0, 0, 0), (1, 1, 9), (5, 0, 26), (6, 1, 31)]:
        to = 256 * (2 * 4 * (row // 4) + 4 * strip + row % 4) + 8 * (c ^ (c >> 3 & 3))
        assert torch.equal(km[to : to + 8], meta[row, 256 * strip + 8 * c : 256 * strip + 8 * c + 8])
    back = marlin24.from_kernel_order(*marlin24.to_kernel_order(b24, meta))
    assert torch.equal(back[0], b24) and torch.equal(back[1], meta)
    assert sorted(marlin24.kernel_word_perm().tolist()) == list(range(256))
    with pytest.raises(ShapeError, match="multiple of 128"):
        marlin24.to_kernel_order(b24[:, :128], meta[:, :128])


def test_gemm24_on_cpu_takes_kernel_order_weights_too() -> None:
    """Weights prepared for the Hopper kernels (a layer moved off such a GPU) still run through the reference."""
    gen = torch.Generator().manual_seed(12)
    packed = marlin24.pack(random_24_codes(256, 256, gen), (torch.rand(2, 256, generator=gen) + 0.5).half().float())
    a = torch.randn(3, 256, generator=gen)
    w = ops.Weights24(*marlin24.to_kernel_order(packed["B_24"], packed["B_meta"]), kernel_order=True)
    assert torch.equal(ops.gemm24(a, w, packed["s"]), reference.gemm24(a, *packed.values()))
