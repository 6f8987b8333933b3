"""The pipeline packs each layer on the device it was solved on: the same tensors as packing on the CPU."""

from __future__ import annotations

import pytest
import torch

from marlin_cli.algo.result import QuantResult
from marlin_cli.pipeline import OutputFormat, pack_layer

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
