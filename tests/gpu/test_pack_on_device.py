"""The pipeline packs each layer on the device it was solved on, and `marlin pack` converts each layer on its
--device: the same tensors as on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_helpers import write_export

from marlin_cli.algo.result import QuantResult
from marlin_cli.io.checkpoint import Checkpoint
from marlin_cli.pipeline import OutputFormat, pack_layer
from marlin_cli.repack import RepackJob, repack

pytestmark = pytest.mark.gpu

K, N = 512, 256
TIED = 0.005  # the share of scales the clipping search may choose differently on the GPU (_assert_like_the_cpu)


def _result(group_size: int, perm: bool, sparse24: bool, seed: int = 0) -> QuantResult:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (K, N), generator=gen, dtype=torch.uint8)
    if sparse24:  # two of every four along K become the zero code 8
        drop = torch.rand(K // 4, 4, N, generator=gen).argsort(1)[:, :2]
        codes = codes.reshape(K // 4, 4, N).scatter(1, drop, 8).reshape(K, N)
    groups = 1 if group_size == -1 else K // group_size
    scales = torch.rand(groups, N, generator=gen) * 0.1 + 1e-3
    order = torch.randperm(K, generator=gen) if perm else None
    return QuantResult(codes, scales, order)


def _assert_alike(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    """The GPU-packed tensors come back on the CPU, with the CPU-packed ones' names, dtypes and bits."""
    assert want.keys() == got.keys()
    for name, t in got.items():
        assert t.device.type == "cpu" and t.dtype == want[name].dtype and torch.equal(t, want[name]), name


@pytest.mark.parametrize("fmt", list(OutputFormat))
@pytest.mark.parametrize(("group_size", "perm"), [(-1, False), (128, False), (128, True), (32, True)])
def test_dense_formats_pack_alike_on_the_gpu(fmt: OutputFormat, group_size: int, perm: bool) -> None:
    cpu = _result(group_size, perm, False)
    gpu = QuantResult(cpu.codes.cuda(), cpu.scales.cuda(), None if cpu.perm is None else cpu.perm.cuda())
    _assert_alike(pack_layer(fmt, "layer", cpu), pack_layer(fmt, "layer", gpu))


@pytest.mark.parametrize("group_size", [-1, 128])
def test_2_4_packs_alike_on_the_gpu(group_size: int) -> None:
    cpu = _result(group_size, False, True, seed=1)
    gpu = QuantResult(cpu.codes.cuda(), cpu.scales.cuda(), None)
    _assert_alike(
        pack_layer(OutputFormat.MARLIN, "layer", cpu, True), pack_layer(OutputFormat.MARLIN, "layer", gpu, True)
    )


def _conversion(source: Path, out: Path, device: str, **job: Any) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Each layer's added error and every tensor written."""
    report = repack(RepackJob(source, out, device=device, **job))
    store = Checkpoint(out)
    return {r["name"]: r["error"] for r in report["layers"]}, {name: store.tensor(name) for name in store.names()}


def _assert_like_the_cpu(source: Path, tmp_path: Path, **job: Any) -> None:
    """Converted on the GPU, the CPU's tensors bit for bit. With --clip the search sums each candidate scale's squared
    error over a row's group, and the GPU sums in another order: where two candidates' errors tie to within float
    rounding the choice may differ, changing that scale and the layer's error by about the rounding (measured on the
    H100: 40 of 28,672 scales of the act-order exports, none of the others; the errors by at most 3.3e-7 of
    themselves), hence TIED and the errors' tolerance, 3.5x and 30x that."""
    cpu_errors, cpu = _conversion(source, tmp_path / "cpu", "cpu", **job)
    gpu_errors, gpu = _conversion(source, tmp_path / "gpu", "cuda", **job)
    if not job.get("clip"):
        _assert_alike(cpu, gpu)
        return
    assert cpu.keys() == gpu.keys()
    for name, error in cpu_errors.items():
        assert gpu_errors[name] == pytest.approx(error, rel=1e-5), name
    scales = [name for name in cpu if name.endswith(".s")]
    differ = sum(int((cpu[n] != gpu[n]).sum()) for n in scales) / sum(cpu[n].numel() for n in scales)
    assert differ <= TIED, differ


@pytest.mark.parametrize(
    "job",
    [{}, {"requantize": True, "group_size": 64}, {"requantize": True, "group_size": 32, "clip": True}],
    ids=["exact", "requantize", "requantize-clip"],
)
@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
def test_conversions_on_the_gpu_write_the_cpus_tensors(
    fmt: str, act_order: bool, job: dict[str, Any], tmp_path: Path
) -> None:
    """`marlin pack --device cuda` of an export decodes and converts each layer on the GPU."""
    source = tmp_path / "export"
    write_export(source, fmt, 128, act_order)
    _assert_like_the_cpu(source, tmp_path, **job)


@pytest.mark.parametrize("clip", [False, True], ids=["rtn", "rtn-clip"])
def test_2_4_conversion_on_the_gpu_writes_the_cpus_tensors(clip: bool, tmp_path: Path) -> None:
    """A dense Marlin checkpoint re-quantized to 2:4 (magnitude 2:4 + RTN) on the GPU."""
    source = tmp_path / "export"
    write_export(source, "gptq", 128, False)
    repack(RepackJob(source, tmp_path / "dense", device="cpu"))
    _assert_like_the_cpu(tmp_path / "dense", tmp_path, sparse24=True, clip=clip)
