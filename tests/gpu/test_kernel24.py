"""The 2:4 CUDA kernel against the float32 reference of the dequantized 2:4 weights on the H200.

Tolerance: mean|C - C_ref| / mean|C_ref| <= 2e-3, as for the dense kernel and for the same reasons: the kernel
rounds each dequantized, scaled weight to fp16 (relative error <= 2^-11), accumulates in fp32 in its own order (the
warp-specialized kernels' split strips: each part rounded to fp16 once before it is added) and rounds C to fp16 (<=
2^-11); independent rounding errors average to a few 1e-4 of the output's magnitude, while a wrong tile, metadata
word, scale or row shows up as an error of order 1.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gpu_helpers import block_slots, kernels_launched, poison, random_operands24, rel_error

from marlin_cli.errors import ShapeError
from marlin_cli.formats import marlin24
from marlin_cli.kernel import build, ops, reference
from marlin_cli.nn import MarlinLinear

pytestmark = pytest.mark.gpu

TOL = 2e-3  # see the module docstring
M_ALL = (1, 7, 9, 16, 17, 32, 33, 64, 80, 100, 128, 256, 1024)
LLAMA2_7B = ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096))
LLAMA3_70B = ((8192, 10240), (28672, 8192))
MINILM = ((384, 384), (384, 1536), (1536, 384))


@functools.lru_cache(maxsize=4)
def _layer(k: int, n: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random 2:4 layer and its float32 dequantized weights (unpacked on the GPU), shared by the M sweeps."""
    _, b24, meta, s = random_operands24(1, k, n, group, seed=k + n + group)
    return b24, meta, s, reference.dequantize24(b24, meta, s)


def _check(m: int, k: int, n: int, group: int) -> float:
    b24, meta, s, w = _layer(k, n, group)
    a = torch.randn(m, k, generator=torch.Generator(device="cuda").manual_seed(m), device="cuda").half()
    ref = a.float() @ w
    poison(m, n)
    c = ops.gemm24(a, ops.prepare24(b24, meta), s)
    torch.cuda.synchronize()
    assert c.shape == (m, n) and c.dtype == torch.float16
    err = rel_error(c, ref)
    assert err <= TOL, f"m={m} k={k} n={n} g={group}: relative error {err:.2e} > {TOL}"
    return err


def test_random_metadata_is_valid() -> None:
    _, b24, meta, s = random_operands24(1, 256, 128, 128)
    codes, _ = marlin24.unpack(b24, meta, s)  # raises on an invalid nibble
    assert ((codes.reshape(64, 4, 128) != 8).sum(1) <= 2).all()


@pytest.mark.parametrize("group", [-1, 32, 128])
def test_against_reference_module(group: int) -> None:
    """The kernel against marlin_cli.kernel.reference itself (CPU unpack) on a layer packed by marlin24.pack."""
    gen = torch.Generator().manual_seed(group + 2)
    w = torch.randn(512, 384, generator=gen)
    w = w * (w.abs().reshape(128, 4, 384).argsort(1).argsort(1) >= 2).reshape(512, 384)  # the 2 largest of 4
    groups = 1 if group == -1 else 512 // group
    scales = (w.abs().reshape(groups, -1, 384).amax(1) / 7).half().float()
    codes = (torch.round(w / scales.repeat_interleave(512 // groups, 0)).clamp(-8, 7) + 8).to(torch.uint8)
    packed = {name: t.cuda() for name, t in marlin24.pack(codes, scales).items()}
    a = torch.randn(33, 512, device="cuda").half()
    poison(33, 384)
    c = ops.gemm24(a, ops.prepare24(packed["B_24"], packed["B_meta"]), packed["s"])
    ref = reference.gemm24(a.cpu().float(), *(t.cpu() for t in packed.values()))
    assert rel_error(c.cpu(), ref) <= TOL


@pytest.mark.parametrize("k,n", [(128, 128), *MINILM, (4096, 4096), (11008, 4096)], ids=str)
@pytest.mark.parametrize("m", M_ALL)
def test_m_sweep(m: int, k: int, n: int) -> None:
    _check(m, k, n, 128)


@pytest.mark.parametrize("k,n", [*LLAMA2_7B, *LLAMA3_70B], ids=str)
@pytest.mark.parametrize("m", [1, 16, 64, 80, 128, 256])
def test_large_shapes(m: int, k: int, n: int) -> None:
    _check(m, k, n, 128)


@pytest.mark.parametrize("k,n", [(1024, 768), (4096, 4096), (1024, 8192)], ids=str)  # n = 8192: 8 / 16 x 256 tiles
@pytest.mark.parametrize("group", [-1, 32, 64, 128])
@pytest.mark.parametrize("m", [1, 7, 8, 12, 17, 48, 96, 100, 256])
def test_group_sizes(m: int, group: int, k: int, n: int) -> None:
    _check(m, k, n, group)


# (m, k, n) on more than two blocks per SM on the H200 (sm90_blocks_per_sm): three 8 x 128 (m <= 8) and 16 x 128 tiles
# on 11008 x 4096; four 8 x 128 ones on k x 4096 and three on a tie with two (4096 x 6144) at m <= 8
_MORE_BLOCKS = [(m, 11008, 4096) for m in (1, 8, 16)] + [
    (m, k, n) for k, n in ((8192, 4096), (14336, 4096), (4096, 6144)) for m in (1, 5, 8)
]


@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("m,k,n", _MORE_BLOCKS, ids=str)
def test_more_blocks_per_sm(m: int, k: int, n: int, group: int) -> None:
    _check(m, k, n, group)


@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("m,k", [(128, 14336), (200, 11008)], ids=str)
def test_long_narrow_layers_take_256_columns(m: int, k: int, group: int) -> None:
    """128 x 256 tiles on n = 4096 where the launch gives each SM at least 12 of them (sm90_cols128 on the H200):
    16 strips of 112 or 2 x 86 tiles, split in 8 to 9 parts each."""
    _check(m, k, 4096, group)


def test_large_m() -> None:
    """m past one launch's 16 chunks, with a ragged last chunk."""
    _check(16 * 32 * 2 + 13, 1024, 512, 128)


def _kernels_launched(m: int, n: int, k: int = 256) -> str:
    a, b24, meta, s = random_operands24(m, k, n, 128)
    w = ops.prepare24(b24, meta)
    return kernels_launched(lambda: ops.gemm24(a, w, s))


def test_hopper_runs_the_wgmma_sp_kernel() -> None:
    """On compute capability 9.0 every m runs on the wgmma.sp kernel: 16-row chunks up to m = 16 (perf-log s24),
    8-row ones at m <= 8 on 256-column tiles and on 128-column ones at three blocks per SM (perf-log r8), and 32-row
    ones up to m = 32 (perf-log o7), by 256 columns where 256-column strips fill most of the GPU's block slots, else
    by 128 (the 16-row chunks also on layers with long runs, perf-log s10); 64-row ones up to
    m = 64, by 256 columns on the warp-specialized kernel where those fill most of its one slot per SM (n = 4096
    included, perf-log w10), else 64 x 128 tiles on the one-warpgroup kernel; above m = 64 the warp-specialized
    kernel's 96-row tiles up to m = 96 (perf-log s23) and 128-row ones above, by 256 columns where those fill the GPU
    (perf-log w8) or give each SM at least 12 of them (perf-log c256), else by 128 (each computing warpgroup on half
    of the rows, perf-log s12). 16 x 128 tiles run three blocks per SM where that gives each SM fewer tiles than two
    (perf-log s25); at m <= 8 three or four 8 x 128 blocks where that gives it fewer, or as many on runs of at least
    4 tiles (perf-log b4, b5). Up to m = 16 the warp-specialized kernel's 16- and 8-row tiles by 512 columns, or
    16-row ones by 256 from m = 9, where one block per SM gets runs of at least 16 tiles that add their own parts
    (perf-log ws16, ws17)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma.sp kernel needs compute capability 9.0")
    eight, short16, three8, three16, long8, long16, least, most_wide, least64, wide, wide_4096, narrow, odd = (
        _kernels_launched(8, 512),  # 128 columns at two blocks per SM: 16-row chunks
        _kernels_launched(9, 512),
        _kernels_launched(1, 4096, k=11008),  # 2752 tiles: 21 per SM at three blocks, 22 at two
        _kernels_launched(16, 4096, k=11008),
        _kernels_launched(8, 8192, k=28672),  # 32 strips x 448 tiles: more than 32 per block slot
        _kernels_launched(16, 8192, k=28672),
        _kernels_launched(17, 512),
        _kernels_launched(32, 16384),
        _kernels_launched(33, 512),
        _kernels_launched(64, 16384),  # 64 strips of 256 columns x 8 parts: every block slot
        _kernels_launched(64, 4096),  # 16 strips of 256 columns x 8 parts: 128 of the 132 slots
        _kernels_launched(64, 512),
        _kernels_launched(64, 384),
    )
    least96, most96_wide, least128, tall, tall_wide = (
        _kernels_launched(65, 512),
        _kernels_launched(96, 16384),
        _kernels_launched(97, 512),
        _kernels_launched(200, 512),
        _kernels_launched(97, 16384),
    )
    four8, tie3, runs2 = (
        _kernels_launched(1, 4096, k=14336),  # 28 tiles an SM at two and at four blocks, runs of 7 at four
        _kernels_launched(8, 6144, k=4096),  # 12 at two, three and four; runs of 4 at three, 3 at four
        _kernels_launched(8, 4096, k=4096),  # 8 at two and four, runs of 2 at four
    )
    assert "Sm90Cfg<128, 8, 4>" in four8 and "Sm90Cfg<128, 8, 3>" in tie3 and "Sm90Cfg<128, 16, 2>" in runs2
    ws8, ws16, eight256, ws16_256, runs12 = (
        _kernels_launched(1, 34816, k=5120),  # 68 strips of 512 columns x 40 tiles: runs of 21, parts added in-kernel
        _kernels_launched(16, 34816, k=5120),
        _kernels_launched(8, 22016, k=4096),  # 43 x 32 tiles at 512 columns: runs of 11; 86 x 32 at 256: 21
        _kernels_launched(9, 22016, k=4096),
        _kernels_launched(16, 12288, k=4096),  # runs of 6 at 512 columns, 12 at 256
    )
    assert "Sm90WsCfg<512, 8>" in ws8 and "Sm90WsCfg<512, 16>" in ws16
    assert "Sm90Cfg<256, 8, 2>" in eight256 and "Sm90WsCfg<256, 16>" in ws16_256 and "Sm90Cfg<256, 16, 2>" in runs12
    assert "Sm90Cfg<128, 16, 2>" in eight and "gemm24_kernel<" not in eight
    assert "Sm90Cfg<128, 16, 2>" in short16 and "Sm90Cfg<128, 8, 3>" in three8 and "Sm90Cfg<128, 16, 3>" in three16
    assert "Sm90Cfg<256, 8, 2>" in long8 and "Sm90Cfg<256, 16, 2>" in long16
    assert "Sm90Cfg<128, 32, 2>" in least and "Sm90Cfg<256, 32, 2>" in most_wide
    assert "Sm90Cfg<128, 64, 2>" in least64
    assert "Sm90WsCfg<256, 64>" in wide and "Sm90WsCfg<256, 64>" in wide_4096
    assert "Sm90Cfg<128, 64, 2>" in narrow and "Sm90Cfg<128, 64, 2>" in odd
    assert "Sm90WsCfg<128, 96>" in least96 and "Sm90WsCfg<256, 96>" in most96_wide
    assert "Sm90WsCfg<128, 128>" in least128 and "Sm90WsCfg<128, 128>" in tall and "Sm90WsCfg<256, 128>" in tall_wide
    long128, long256, short128 = (
        _kernels_launched(128, 4096, k=14336),  # 16 strips x 112 tiles at 256 columns: 13.6 an SM
        _kernels_launched(256, 4096, k=11008),  # two chunks x 16 strips x 86 tiles: 20.8 an SM
        _kernels_launched(128, 4096, k=11008),  # 10.4 an SM: 128 columns (perf-log c256)
    )
    assert "Sm90WsCfg<256, 128>" in long128 and "Sm90WsCfg<256, 128>" in long256
    assert "Sm90WsCfg<128, 128>" in short128


@pytest.mark.parametrize(
    "m,k,n,group",
    [
        (128, 4096, 22016, 128),  # 128 x 256 tiles, runs of 21 tiles, strips of 32: up to three parts
        (256, 8192, 8192, -1),  # two 128-row chunks side by side, per-channel scales: two parts per strip
        (200, 4096, 4096, 32),  # 128 x 128 tiles (a row block per warpgroup), the second chunk 72 rows
        (64, 4096, 22016, 128),  # 64 x 256 tiles, runs of 21 tiles, strips of 32: up to three parts
        (80, 4096, 22016, 128),  # 96 x 256 tiles, the same runs
        (72, 4096, 5760, 32),  # 96 x 128 tiles (a row block of 48 per warpgroup), 45 strips: runs of 11 of 32
        (1, 5120, 34816, 128),  # 8 x 512 tiles (m <= 16, ws_small_cols), runs of 21 tiles, strips of 40
        (8, 5120, 34816, -1),
        (16, 4096, 33792, 32),  # 16 x 512 tiles, runs of 16, strips of 32: two parts each
        (12, 4096, 33792, 128),
        (9, 4096, 22016, 32),  # 16 x 256 tiles (m = 9-16, ws_small_cols), runs of 21, strips of 32
        (16, 4096, 22016, -1),
    ],
    ids=str,
)
def test_long_runs_add_their_parts_in_the_kernel(m: int, k: int, n: int, group: int) -> None:
    """The warp-specialized kernel's blocks add split strips' parts themselves where runs are at least a third of a
    strip (perf-log s22) and write whole strips to C through shared memory (s21): no add_parts_kernel, outputs
    within tolerance and bit-identical over repeated launches."""
    if torch.cuda.get_device_capability() != (9, 0) or block_slots() != 2 * 132:
        pytest.skip("the partition above is the H200's (132 SMs)")
    a, b24, meta, s = random_operands24(m, k, n, group, seed=m + n)
    w = ops.prepare24(b24, meta)
    launched = kernels_launched(lambda: ops.gemm24(a, w, s))
    assert "Sm90WsCfg<" in launched and "add_parts_kernel" not in launched, launched
    first = ops.gemm24(a, w, s)
    assert rel_error(first, a.float() @ reference.dequantize24(b24, meta, s)) <= TOL
    for _ in range(3):
        poison(m, n)
        assert torch.equal(ops.gemm24(a, w, s), first)


@pytest.mark.parametrize(
    "m,k,n",
    [(1, 11008, 4096), (16, 4096, 4096), (48, 4096, 4096), (80, 4096, 4096), (100, 8192, 1024), (256, 28672, 8192)],
)
def test_repeatable(m: int, k: int, n: int) -> None:
    """Partial sums are added in a fixed order, so repeated launches give bit-identical outputs."""
    a, b24, meta, s = random_operands24(m, k, n, 128, seed=5)
    w = ops.prepare24(b24, meta)
    first = ops.gemm24(a, w, s)
    for _ in range(3):
        poison(m, n)
        assert torch.equal(ops.gemm24(a, w, s), first)


def test_bad_operands() -> None:
    a, b24, meta, s = random_operands24(4, 256, 128, 128)
    w = ops.prepare24(b24, meta)
    with pytest.raises(ShapeError, match="do not fit"):
        ops.gemm24(a, w, torch.ones(3, 128, dtype=torch.float16, device="cuda"))
    with pytest.raises(ShapeError, match="float16"):
        ops.gemm24(a.float(), w, s)
    with pytest.raises(ShapeError, match="int16"):
        ops.gemm24(a, w._replace(meta=w.meta.int()), s)
    with pytest.raises(ShapeError, match="contiguous"):
        ops.gemm24(torch.randn(256, 4, device="cuda").half().t(), w, s)
    with pytest.raises(ShapeError, match="do not match"):
        ops.gemm24(a, w._replace(b24=w.b24[:4], meta=w.meta[:4]), s)
    with pytest.raises(ShapeError, match="multiple of 128"):
        ops.gemm24(a, w._replace(b24=w.b24[:, :128], meta=w.meta[:, :128]), s[:, :64].contiguous())
    with pytest.raises(ShapeError, match="multiple of 128"):
        ops.prepare24(b24[:, :128], meta[:, :128])
    with pytest.raises(ShapeError, match="prepare24"):  # weights in the other order than this device's kernel reads
        ops.gemm24(a, w._replace(kernel_order=not w.kernel_order), s)
    with pytest.raises(TypeError, match="prepare24"):  # the codes alone, not prepare24's pair
        ops.gemm24(a, b24, s)


def test_marlin_linear_keeps_its_state_dict_in_the_stored_order() -> None:
    """On the H200 a 2:4 MarlinLinear holds B_24 and B_meta in the Hopper kernels' order from the moment they are on
    the GPU (a load, a move); its forward changes nothing; its state dict, its dequantized weight, a reload and a move
    back to the CPU all see the stored order."""
    _, b24, meta, s = random_operands24(1, 512, 256, 128, seed=9)
    stored = {"B_24": b24, "B_meta": meta, "s": s}
    layer = MarlinLinear(512, 256, 4, act_order=False, bias=False, sparse24=True).cuda()
    layer.load_state_dict(stored)
    assert ops.kernel_order24(b24.device) and not torch.equal(layer.B_24, b24)  # in the kernels' order now
    x = torch.randn(5, 512, device="cuda").half()
    want = x.float() @ reference.dequantize24(b24, meta, s)
    held = layer.B_24.data_ptr(), layer.B_meta.data_ptr()
    assert rel_error(layer(x), want) <= TOL
    assert (layer.B_24.data_ptr(), layer.B_meta.data_ptr()) == held  # forward converted nothing
    assert all(torch.equal(t, stored[name]) for name, t in layer.state_dict().items())
    assert torch.equal(layer.dequantized_weight(), reference.dequantize24(b24, meta, s).T)
    layer.load_state_dict(stored)  # while in the kernels' order: loaded as stored, then put in that order again
    assert not torch.equal(layer.B_24, b24) and rel_error(layer(x), want) <= TOL
    layer.cpu()
    assert torch.equal(layer.B_24, b24.cpu()) and rel_error(layer(x.cpu().float()), want.cpu()) <= TOL
    layer.cuda()  # and back: the kernels' order again
    assert not torch.equal(layer.B_24, b24) and rel_error(layer(x), want) <= TOL


def test_opcheck() -> None:
    a, b24, meta, s = random_operands24(17, 512, 256, 128)
    w = ops.prepare24(b24, meta)
    ops.gemm24(a, w, s)  # builds, loads and registers the fake
    torch.library.opcheck(torch.ops.marlin_cli.gemm24.default, (a, w.b24, w.meta, s, ops.workspace(a.device)))


def test_metadata_registers_are_rewritten_late():
    """ptxas may rewrite a wgmma.sp group's metadata register before the group retires, and the hardware reads it
    after the issue: rewrites 20 and 57 instructions after it gave wrong outputs, 65 or more never have (perf-log s15,
    s17). A toolchain that schedules the stage loop differently fails here before it fails on data."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma.sp kernels are built for sm_90a only")
    script = Path(__file__).resolve().parents[2] / "scripts" / "check_meta_hazards.py"
    run = subprocess.run([sys.executable, str(script), str(build.build_kernels())], capture_output=True, text=True)
    print(run.stdout.splitlines()[-1] if run.stdout else run.stderr)
    if run.returncode == 2:
        pytest.skip("the built library has no wgmma.sp kernels (TORCH_CUDA_ARCH_LIST without 9.0a)")
    if run.returncode == 3:
        pytest.skip("cuobjdump not found (CUDA toolkit, or the test extra's nvidia-cuda wheels)")
    assert run.returncode == 0, run.stdout + run.stderr
