"""The CUDA kernel against the float32 reference on the H200.

Tolerance: mean|C - C_ref| / mean|C_ref| <= 2e-3. The kernel rounds each dequantized, scaled weight to fp16
(relative error <= 2^-11), accumulates fp16 products in fp32 in its own order (a column strip split over the
warp-specialized kernels' blocks: each part rounded to fp16 once, <= 2^-11 of the part, then added in fp32), and
rounds C to fp16 (<= 2^-11); independent rounding errors average to a few 1e-4 of the output's magnitude, so 2e-3
leaves room while a wrong tile, scale or row shows up as an error of order 1. Chunks of 8 rows (m <= 8), and on the
H200 those of 16 and 32 rows (m = 9-32, groups of 128 or per channel), instead sum the products of still-offset
weights (1024 + q, 64 + q) in fp32 over 16-128 k and subtract the offsets' product there, which costs ~10 of fp32's
24 bits (relative ~1e-4 at worst), and scale the fp32 sums; test_offset_cancellation is the hard case for that.
"""

from __future__ import annotations

import re

import pytest
import torch
from gpu_helpers import (
    block_slots,
    dequantize_gpu,
    kernels_launched,
    poison,
    random_operands,
    random_operands24,
    rel_error,
    unpack_weight_gpu,
)

from marlin_cli.errors import ShapeError
from marlin_cli.formats import marlin
from marlin_cli.kernel import ops, reference

pytestmark = pytest.mark.gpu

TOL = 2e-3  # see the module docstring
M_ALL = (1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 80, 100, 128, 255, 256, 1024, 4096)
LLAMA2_7B = ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096))
LLAMA3_70B = ((8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192))
MINILM = ((384, 384), (384, 1536), (1536, 384))
ALL_SHAPES = ((128, 64), *MINILM, *LLAMA2_7B, *LLAMA3_70B)


def _check(m: int, k: int, n: int, group: int, act_order: bool = False, seed: int = 0) -> float:
    a, b, s = random_operands(m, k, n, group, seed=seed)
    perm = None
    if act_order:
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        perm = torch.randperm(k, generator=gen, device="cuda").int()
    w = dequantize_gpu(b, s)
    a_ref = a if perm is None else a[:, perm.long()]
    ref = a_ref.float() @ w
    poison(m, n)
    c = ops.gemm(a, b, s, perm)
    torch.cuda.synchronize()
    assert c.shape == (m, n) and c.dtype == torch.float16
    err = rel_error(c, ref)
    assert err <= TOL, f"m={m} k={k} n={n} g={group} act_order={act_order}: relative error {err:.2e} > {TOL}"
    return err


def test_gpu_unpack_matches_format() -> None:
    _, b, _ = random_operands(1, 256, 192, 128)
    assert torch.equal(unpack_weight_gpu(b).cpu(), marlin.unpack_weight(b.cpu()))


@pytest.mark.parametrize("group", [-1, 32, 128])
def test_against_reference_module(group: int) -> None:
    """The kernel against marlin_cli.kernel.reference itself (CPU unpack), on a shape small enough for it."""
    a, b, s = random_operands(33, 512, 320, group, seed=3)
    perm = torch.randperm(512, device="cuda").int()
    for p in (None, perm):
        poison(33, 320)
        c = ops.gemm(a, b, s, p)
        ref = reference.gemm(a.float(), b, s, p).float()
        assert rel_error(c, ref) <= TOL


@pytest.mark.parametrize("k,n", [(128, 64), (384, 1536), (4096, 4096), (11008, 4096)], ids=str)
@pytest.mark.parametrize("m", M_ALL)
def test_m_sweep(m: int, k: int, n: int) -> None:
    _check(m, k, n, 128 if k % 128 == 0 else -1, seed=m)


@pytest.mark.parametrize("k,n", ALL_SHAPES, ids=str)
@pytest.mark.parametrize("m", [1, 16, 32, 64, 80, 256])
def test_all_shapes(m: int, k: int, n: int) -> None:
    _check(m, k, n, 128, seed=k + n + m)


@pytest.mark.parametrize("k,n", [(1024, 768), (1536, 192), (8192, 1024), (1024, 8192)], ids=str)
@pytest.mark.parametrize("group", [-1, 32, 64, 128])
@pytest.mark.parametrize("m", [1, 12, 17, 48, 80, 100, 200])
def test_group_sizes(m: int, group: int, k: int, n: int) -> None:
    _check(m, k, n, group, seed=m * 7 + group)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group", [-1, 128])  # smaller groups take the mma.sync kernel at m = 9-16
@pytest.mark.parametrize("m", [9, 16])
def test_three_blocks_per_sm(m: int, group: int, act_order: bool) -> None:
    """16 x 128 wgmma tiles at three blocks per SM (11008 x 4096 on the H200: sm90_blocks_per_sm)."""
    _check(m, 11008, 4096, group, act_order=act_order, seed=m + group)


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group", [-1, 32, 128])
def test_long_narrow_layers_take_256_columns(group: int, act_order: bool) -> None:
    """128 x 256 tiles on 14336 x 4096 at m = 128 (16 strips of 112 tiles, 8 to 9 parts each: sm90_cols128)."""
    _check(128, 14336, 4096, group, act_order=act_order, seed=group)


@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("m", [1, 12, 33, 256])
def test_act_order(m: int, group: int) -> None:
    _check(m, 4096, 1536, group, act_order=True, seed=m + group)


@pytest.mark.parametrize("n", [1024, 1088])
@pytest.mark.parametrize("group", [-1, 128])
@pytest.mark.parametrize("m", [1, 8, 16, 32])
def test_offset_cancellation(m: int, group: int, n: int) -> None:
    """Activations far from zero mean (32 + N(0, 1), all positive): the fp32 sums of offset weights times
    activations are then largest against the result, the worst case for the cancellation: 8-row chunks (m <= 8) and
    on the H200 the wgmma kernel's 16- and 32-row chunks (m = 16, 32, n = 1024); n = 1088 (not a multiple of 128)
    runs both on the mma.sync kernel, which scales fp16 weights at those heights, for comparison. The reference is
    float64."""
    a, b, s = random_operands(m, 4096, n, group, seed=17)
    a = (a.float() + 32).half()
    ref = (a.double() @ dequantize_gpu(b, s).double()).float()
    poison(m, n)
    err = rel_error(ops.gemm(a, b, s), ref)
    print(f"m={m} g={group} n={n}: relative error {err:.2e}")
    assert err <= TOL


def test_large_m() -> None:
    """m past one launch's 16 chunks of 64 rows, with a ragged last chunk."""
    _check(16384 + 13, 1024, 512, 128, seed=11)


@pytest.mark.parametrize(
    "m,k,n",
    [(16, 4096, 4096), (1, 11008, 4096), (48, 4096, 4096), (80, 4096, 4096), (100, 8192, 1024), (256, 28672, 8192)],
)
def test_repeatable(m: int, k: int, n: int) -> None:
    """Partial sums are added in a fixed order, so repeated launches give bit-identical outputs."""
    a, b, s = random_operands(m, k, n, 128, seed=5)
    first = ops.gemm(a, b, s)
    for _ in range(3):
        poison(m, n)
        assert torch.equal(ops.gemm(a, b, s), first)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("m", [1, 16, 64, 1100])
def test_chained_layers_read_the_previous_output(m: int, graph: bool) -> None:
    """Four layers back to back, each taking the previous one's output as its activations, dense and 2:4 in turn.

    On the H200 every launch may start before the previous kernel has completed (programmatic dependent launch);
    a read of A, or of the shared workspace, ahead of the kernel's wait would see the NaN poison, an empty graph
    buffer or the previous run's parts. m = 1100 takes two launches per call (more than 16 chunks of 64 rows).
    Scales are cut to 1/4 so the activations stay in fp16 range across the chain."""
    shapes = ((4096, 12288), (12288, 4096), (4096, 12288), (12288, 4096))
    layers, weights = [], []
    for i, (k, n) in enumerate(shapes):
        if i % 2 == 0:
            _, b, s = random_operands(1, k, n, 128, seed=i)
            layers.append(lambda a, b=b, s=s / 4: ops.gemm(a, b, s))
            weights.append(dequantize_gpu(b, s / 4))
        else:
            _, b24, meta, s24 = random_operands24(1, k, n, 128, seed=i)
            w24 = ops.prepare24(b24, meta)
            layers.append(lambda a, w=w24, s24=s24 / 4: ops.gemm24(a, w, s24))
            weights.append(reference.dequantize24(b24, meta, s24 / 4))
    a = torch.randn(m, shapes[0][0], generator=torch.Generator(device="cuda").manual_seed(m), device="cuda").half()

    def chain() -> list[torch.Tensor]:
        outs = [a]
        for layer in layers:
            outs.append(layer(outs[-1]))
        return outs

    for _, n in shapes:
        poison(m, n)
    if graph:
        chain()  # builds and loads the kernels, sizes the workspace outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = chain()
        g.replay()
    else:
        outs = chain()
    torch.cuda.synchronize()
    for i, w in enumerate(weights):
        err = rel_error(outs[i + 1], outs[i].float() @ w)
        assert err <= TOL, f"m={m} layer {i} ({'graph' if graph else 'eager'}): relative error {err:.2e} > {TOL}"


@pytest.mark.parametrize(
    "m,k,n,group,match",
    [
        (1, 100, 64, -1, "multiple of 128"),
        (1, 256, 96, -1, "multiple of 64"),
        (0, 256, 64, -1, "at least 1"),
    ],
)
def test_bad_shapes(m: int, k: int, n: int, group: int, match: str) -> None:
    a = torch.randn(m, k, device="cuda").half()
    b = torch.zeros(max(k // 16, 1), 2 * n, dtype=torch.int32, device="cuda")
    s = torch.ones(1, n, dtype=torch.float16, device="cuda")
    with pytest.raises(ShapeError, match=match):
        ops.gemm(a, b, s)


def test_bad_operands() -> None:
    a, b, s = random_operands(4, 256, 128, 128)
    with pytest.raises(ShapeError, match="do not fit"):
        ops.gemm(a, b, s[:, :64].contiguous())
    with pytest.raises(ShapeError, match="do not fit"):
        ops.gemm(a, b, torch.ones(3, 128, dtype=torch.float16, device="cuda"))
    with pytest.raises(ShapeError, match="float16"):
        ops.gemm(a.float(), b, s)
    with pytest.raises(ShapeError, match="contiguous"):
        ops.gemm(torch.randn(256, 4, device="cuda").half().t(), b, s)
    with pytest.raises(ShapeError, match="does not match"):
        ops.gemm(a, b[:8], s)
    with pytest.raises(ShapeError, match=r"\(256,\)"):
        ops.gemm(a, b, s, torch.arange(128, device="cuda", dtype=torch.int32))


def _kernels_launched(m: int, k: int, n: int, group: int = 128) -> str:
    a, b, s = random_operands(m, k, n, group)
    return kernels_launched(lambda: ops.gemm(a, b, s))


def test_hopper_runs_the_wgmma_kernel() -> None:
    """On compute capability 9.0 the build targets 9.0a and the wgmma kernel runs from m = 9 (m <= 8: the mma.sync
    kernel's 8-row chunks): 16-row chunks up to m = 16 (not with groups below 128: the mma.sync kernel; perf-log o1),
    32-row chunks up to m = 32 (groups below 128: 64-row chunks; o7), then the warp-specialized kernel's 64-row
    chunks up to m = 64 (w10) and 128-row chunks up to m = 128, each by 256 columns where 256-column strips fill most
    of the GPU's block slots (two per SM; one per SM for the 64-row chunks, so n = 4096 takes 256 columns there; the
    128-row chunks also where each SM gets at least 12 such tiles, c256) and by 128 where not (n % 128 == 0), 256 x
    128 tiles above m = 128 (perf-log w8). 16 x 128 tiles run three blocks per SM where that gives each SM fewer tiles
    than two (perf-log s25)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs compute capability 9.0")
    eight, nine, nine_long, sixteen_wide, sixteen_odd, sixteen_g32, sixteen_g64 = (
        _kernels_launched(8, 256, 512),
        _kernels_launched(9, 256, 512),
        _kernels_launched(9, 11008, 4096),  # 2752 tiles: 21 per SM at three blocks, 22 at two
        _kernels_launched(16, 256, 16384),
        _kernels_launched(16, 256, 320),
        _kernels_launched(16, 256, 512, group=32),
        _kernels_launched(16, 256, 512, group=64),
    )
    assert "Sm90Cfg<16, 128, 2>" in nine and "Sm90Cfg<16, 256, 2>" in sixteen_wide
    assert "Sm90Cfg<16, 128, 3>" in nine_long
    for launched in (eight, sixteen_odd, sixteen_g32, sixteen_g64):
        assert "gemm_kernel<" in launched and "gemm_sm90_kernel" not in launched
    least, most_wide, least_g32, least_g64 = (
        _kernels_launched(17, 256, 512),
        _kernels_launched(32, 256, 16384),
        _kernels_launched(17, 256, 512, group=32),
        _kernels_launched(32, 256, 512, group=64),
    )
    assert "Sm90Cfg<32, 128, 2>" in least and "Sm90Cfg<32, 256, 2>" in most_wide
    assert "Sm90WsCfg<64, 128>" in least_g32 and "Sm90WsCfg<64, 128>" in least_g64
    least, wide, wide_4096, narrow, odd, short, short_wide, tall, tall_wide, tall_narrow, taller, too_narrow = (
        _kernels_launched(33, 256, 512),
        _kernels_launched(64, 256, 16384),  # 64 strips of 256 columns x 8 parts: every block slot
        _kernels_launched(64, 256, 4096),  # 16 strips of 256 columns x 8 parts: 128 of the 132 slots
        _kernels_launched(64, 256, 512),
        _kernels_launched(64, 256, 384),
        _kernels_launched(65, 256, 512),
        _kernels_launched(96, 256, 16384),
        _kernels_launched(97, 256, 512),
        _kernels_launched(128, 256, 16384),
        _kernels_launched(128, 256, 384),
        _kernels_launched(129, 256, 16384),
        _kernels_launched(65, 256, 192),
    )
    assert "Sm90WsCfg<64, 128>" in least  # 64-row chunks from 33 rows on (perf-log a3, o7, w10)
    assert "Sm90WsCfg<64, 256>" in wide and "Sm90WsCfg<64, 256>" in wide_4096
    assert "Sm90WsCfg<64, 512>" in _kernels_launched(64, 28672, 8192)  # runs of 54 tiles: 64 x 512 (perf-log w11)
    assert "Sm90WsCfg<64, 128>" in narrow and "Sm90WsCfg<64, 128>" in odd
    assert "Sm90WsCfg<96, 128>" in short and "Sm90WsCfg<96, 256>" in short_wide  # 65-96 rows (perf-log w12)
    assert "Sm90WsCfg<128, 128>" in tall and "Sm90WsCfg<128, 128>" in tall_narrow
    assert "Sm90WsCfg<128, 256>" in tall_wide and "Sm90WsCfg<256, 128>" in taller
    # 128-row chunks by 256 columns also where each SM gets at least 12 such tiles (perf-log c256): 16 strips x 112
    # tiles of 14336 x 4096 (13.6 an SM), not 11008 x 4096's 86 (10.4)
    assert "Sm90WsCfg<128, 256>" in _kernels_launched(128, 14336, 4096)
    assert "Sm90WsCfg<128, 128>" in _kernels_launched(128, 11008, 4096)
    assert "gemm_kernel<" in too_narrow and "gemm_sm90" not in too_narrow  # n not a multiple of 128


def test_split_strips_are_added_by_a_second_kernel() -> None:
    """Every kernel saves the parts of column strips that several blocks' runs share, and add_parts_kernel adds them
    after the launch (perf-log a1, q1), unless the runs are long enough for the warp-specialized tiles to add
    them themselves (test_long_runs_add_their_parts_in_the_kernel); when every run holds whole strips only the GEMM
    runs. Split: one strip in parts (dense m = 1 on the mma.sync kernel, m = 16 on the wgmma kernel, m = 128 and 256
    on the warp-specialized one, 2:4 m = 16 on the wgmma.sp kernel); whole: k = 128 (one or two tiles per strip) over
    more strips than block slots."""
    slots = block_slots()
    wide = 256 * slots
    for m, k, n in ((1, 4096, 128), (16, 4096, 256), (128, 2048, 128), (256, 2048, 128)):
        split = _kernels_launched(m, k, n)
        assert "add_parts_kernel" in split, f"m={m}: {split}"
    a, b24, meta, s24 = random_operands24(16, 4096, 128, 128)
    assert "add_parts_kernel" in kernels_launched(lambda: ops.gemm24(a, ops.prepare24(b24, meta), s24))
    for m in (1, 65, 256):
        whole = _kernels_launched(m, 128, wide)
        assert "add_parts_kernel" not in whole, f"m={m}: {whole}"


def _parts_blocks_per_band(launched: str) -> list[int]:
    """The blocks per 8-row band (the last template argument) of each add_parts_kernel in `launched`."""
    return [int(x) for x in re.findall(r"add_parts_kernel<.*?, (?:true|false), (\d+)>\(", launched)]


def test_parts_bands_split_where_their_block_does_not_fit() -> None:
    """On 8- and 16-row wgmma tiles a band of split strips' parts takes two 256-thread blocks where one 512-thread
    block does not fit on an SM beside the GEMM's blocks (perf-log pk1): the dense 16 x 256 tiles (185 registers a
    thread) leave too little room, the 2:4 ones (128) enough; 32-row tiles keep whole bands."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernels need compute capability 9.0")
    dense16, dense32 = _kernels_launched(16, 4096, 12288), _kernels_launched(32, 4096, 12288)
    assert "Sm90Cfg<16, 256, 2>" in dense16 and _parts_blocks_per_band(dense16) == [2], dense16
    assert "Sm90Cfg<32, 256, 2>" in dense32 and _parts_blocks_per_band(dense32) == [1], dense32
    a, b24, meta, s24 = random_operands24(16, 4096, 12288, 128)
    sparse16 = kernels_launched(lambda: ops.gemm24(a, ops.prepare24(b24, meta), s24))
    assert "Sm90Cfg<256, 16, 2>" in sparse16 and _parts_blocks_per_band(sparse16) == [1], sparse16


@pytest.mark.parametrize(
    "m,k,n,group,tile",
    [
        (256, 4096, 22016, 128, "Sm90WsCfg<256, 128>"),  # runs of 84 tiles, strips of 64: two parts per strip
        (256, 4096, 12288, -1, "Sm90WsCfg<256, 128>"),  # runs of 47: three parts
        (200, 8192, 8192, 32, "Sm90WsCfg<256, 128>"),  # runs of 63, strips of 128: up to four parts
        (300, 1024, 12288, 32, "Sm90WsCfg<256, 128>"),  # two 256-row chunks side by side (the second 44 rows)
        (128, 4096, 22016, 128, "Sm90WsCfg<128, 256>"),  # runs of 42 tiles, strips of 64: up to three parts
        (80, 4096, 22016, 128, "Sm90WsCfg<96, 256>"),  # the same partition on 96-row tiles, rows past m
        (100, 2048, 5760, -1, "Sm90WsCfg<128, 128>"),  # runs of 11, strips of 32: up to four parts, rows past m
        (64, 4096, 22016, 128, "Sm90WsCfg<64, 256>"),  # runs of 42 tiles, strips of 64: up to three parts
        (48, 2048, 5760, -1, "Sm90WsCfg<64, 128>"),  # runs of 11, strips of 32: up to four parts, rows past m
    ],
    ids=str,
)
def test_long_runs_add_their_parts_in_the_kernel(m: int, k: int, n: int, group: int, tile: str) -> None:
    """The warp-specialized tiles add split strips' parts in the kernel where runs are at least a third of a strip
    (perf-log f3, o6): no add_parts_kernel, outputs within tolerance, bit-identical over repeated launches (each
    launch returns the blocks' counters to zero for the next)."""
    if torch.cuda.get_device_capability() != (9, 0) or block_slots() != 2 * 132:
        pytest.skip("the partition above is the H200's (132 SMs)")
    launched = _kernels_launched(m, k, n, group)
    assert tile in launched and "add_parts_kernel" not in launched, launched
    a, b, s = random_operands(m, k, n, group, seed=m + n)
    first = ops.gemm(a, b, s)
    assert rel_error(first, a.float() @ dequantize_gpu(b, s)) <= TOL
    for _ in range(3):
        poison(m, n)
        assert torch.equal(ops.gemm(a, b, s), first)


def test_short_runs_take_three_stages() -> None:
    """The mma.sync kernel's chunks of <= 16 rows take a 3-stage ring when no block's run is longer than 32 tiles (128
    columns x 128 deep), else 4 (perf-log f2). (16 rows: groups of 32, which the wgmma kernel leaves to it.)"""
    slots = block_slots()
    wide = 128 * (slots + 1)  # slots + 1 strips of 32 tiles each at k = 4096: more than 32 tiles per block
    short8, short16, long8, long16 = (
        _kernels_launched(1, 4096, 4096),
        _kernels_launched(16, 4096, 4096, group=32),
        _kernels_launched(1, 4096, wide),
        _kernels_launched(16, 4096, wide, group=32),
    )
    assert "Cfg<8, 2, 8, 3>" in short8 and "Cfg<16, 2, 8, 3>" in short16
    assert "Cfg<8, 2, 8, 4>" in long8 and "Cfg<16, 2, 8, 4>" in long16


def test_kernel_name() -> None:
    assert ops.kernel_name(torch.device("cuda")) == "cuda"
    assert ops.kernel_name(torch.device("cpu")) == "reference"


def test_opcheck() -> None:
    a, b, s = random_operands(17, 512, 256, 128)
    ops.gemm(a, b, s)  # builds, loads and registers the fake
    perm = torch.randperm(512, device="cuda").int()
    ws = ops.workspace(a.device)
    torch.library.opcheck(torch.ops.marlin_cli.gemm.default, (a, b, s, None, ws))
    torch.library.opcheck(torch.ops.marlin_cli.gemm.default, (a, b, s, perm, ws))
