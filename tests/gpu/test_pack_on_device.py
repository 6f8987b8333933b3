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


def _conversion(source: Path, out: Path, device: str, **job: Any) -> dict[str, torch.Tensor]:
    repack(RepackJob(source, out, device=device, **job))
    store = Checkpoint(out)
    return {name: store.tensor(name) for name in store.names()}


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
    """`marlin pack --device cuda` of an export decodes and converts each layer on the GPU: the same tensors, bit for
    bit, as on the CPU. RTN and the clipping search are elementwise roundings and per-row sums over the same
    candidates; a sum taken in another order could flip a near-tie between two candidates, which these random
    weights do not reach."""
    source = tmp_path / "export"
    write_export(source, fmt, 128, act_order)
    cpu = _conversion(source, tmp_path / "cpu", "cpu", **job)
    gpu = _conversion(source, tmp_path / "gpu", "cuda", **job)
    _assert_alike(cpu, gpu)


def test_2_4_conversion_on_the_gpu_writes_the_cpus_tensors(tmp_path: Path) -> None:
    """A dense Marlin checkpoint re-quantized to 2:4 (magnitude 2:4 + RTN, with the clipping search) on the GPU."""
    source = tmp_path / "export"
    write_export(source, "gptq", 128, False)
    repack(RepackJob(source, tmp_path / "dense", device="cpu"))
    job = {"sparse24": True, "clip": True}
    _assert_alike(
        _conversion(tmp_path / "dense", tmp_path / "cpu", "cpu", **job),
        _conversion(tmp_path / "dense", tmp_path / "gpu", "cuda", **job),
    )
