"""The kernel build's inputs, checked without a GPU: architectures, flags, that every source is built and hashed,
and that the ops refuse what the kernels cannot take before building anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from marlin_cli.errors import ShapeError
from marlin_cli.kernel import build, ops

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def test_every_kernel_source_is_built_and_hashed() -> None:
    """A .cu left out of SOURCES would not be compiled; a header left out of HEADERS would not bust the cache."""
    assert {p.name for p in KERNELS.glob("*.cu")} | {"bindings.cpp"} == set(build.SOURCES)
    assert {p.name for p in KERNELS.glob("*.h")} | {p.name for p in KERNELS.glob("*.cuh")} == set(build.HEADERS)
    assert all((build.source_dir() / name).is_file() for name in build.SOURCES + build.HEADERS)


def test_the_sources_do_not_shadow_a_package_named_kernels() -> None:
    """transformers imports the `kernels` package where one is installed; from the top of a checkout (on sys.path
    under `python3 -m pytest` and for the scripts in scripts/) a regular package kernels/ would be found first."""
    code = "import importlib.util; s = importlib.util.find_spec('kernels'); print(s.origin if s else '')"
    run = subprocess.run([sys.executable, "-c", code], cwd=KERNELS.parent, capture_output=True, text=True, check=True)
    assert not run.stdout.strip().startswith(str(KERNELS))


@pytest.mark.parametrize(
    "capability,expected", [((9, 0), "9.0a"), ((8, 0), "8.0"), ((8, 9), "8.9"), ((12, 0), "12.0")], ids=str
)
def test_arch_list_follows_the_gpu(monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int], expected: str) -> None:
    """Hopper (9.0) builds the arch-specific 9.0a target, which the wgmma kernel needs; others build their own."""
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    assert build.arch_list() == expected


def test_arch_list_from_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert build.arch_list() == "8.0;9.0"


@pytest.mark.parametrize(
    "arches,wgmma", [("9.0a", True), ("8.0 9.0a", True), ("8.0;9.0a", True), ("9.0", False), ("8.0;9.0", False)]
)
def test_the_wgmma_kernel_is_enabled_only_for_sm90a(arches: str, wgmma: bool) -> None:
    """MARLIN_SM90A tells the host code the wgmma kernel exists; without 9.0a every m runs on the sm_80 kernel."""
    flags = build.cuda_flags(arches)
    assert ("-DMARLIN_SM90A" in flags) == wgmma
    assert flags[: len(build.CUDA_FLAGS)] == list(build.CUDA_FLAGS)


def test_a_build_is_announced_only_when_the_cache_lacks_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """needs_build() says whether the first kernel use compiles: the cached library is named by the sources' hash."""
    monkeypatch.setenv("MARLIN_CLI_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    monkeypatch.setattr(build, "kernel_problem", lambda *a: None)  # as on a GPU machine with nvcc
    monkeypatch.setattr(build, "_loaded", None)
    assert build.needs_build()
    library = build._library("9.0a")
    library.parent.mkdir(parents=True)
    library.touch()
    assert not build.needs_build()
    monkeypatch.setattr(build, "kernel_problem", lambda *a: "no CUDA GPU")  # nothing to compile for
    library.unlink()
    assert not build.needs_build()


def test_quantize_picks_the_solver_kernels_by_device(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path) -> None:  # noqa: ANN001
    """The CUDA kernels of the solve on a GPU where the kernels build; the torch loops (None) on the CPU, or with a
    note naming the reason when the GPU cannot build them."""
    from marlin_cli.cli import quantize
    from marlin_cli.config import QuantConfig
    from marlin_cli.kernel import ops
    from marlin_cli.pipeline import Job

    monkeypatch.setattr(quantize, "note_kernel_build", lambda device: None)
    assert quantize.solver_kernels(Job("m", tmp_path / "o", QuantConfig(), device="cpu")) is None
    on_gpu = Job("m", tmp_path / "o", QuantConfig(), device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU as --device's check sees it
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(ops, "solver_problem", lambda device: None)
    assert quantize.solver_kernels(on_gpu) is ops.KERNELS
    monkeypatch.setattr(ops, "solver_problem", lambda device: "nvcc was not found")
    assert quantize.solver_kernels(on_gpu) is None
    err = capsys.readouterr().err
    assert "run in torch" in err and "nvcc was not found" in err


def test_the_gptq_kernel_refuses_cpu_operands() -> None:
    w, codes = torch.randn(16, 256), torch.empty(16, 256, dtype=torch.uint8)
    with pytest.raises(ShapeError, match="w is on cpu: the kernel runs on CUDA devices only"):
        ops.gptq_block(w, torch.eye(256), torch.ones(16), False, codes, torch.empty(16, 256), 0, 0, 64, 64)
