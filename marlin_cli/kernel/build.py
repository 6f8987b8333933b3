"""Compile the bundled CUDA kernel on first use and register it as `torch.ops.marlin_cli.*`.

The sources ship as package data (`marlin_cli.kernels`; the top-level `kernels/` directory of a source checkout).
They are built with `torch.utils.cpp_extension.load` for the GPU present, sm_80 or newer (TORCH_CUDA_ARCH_LIST
overrides the list), into a per-user cache directory named by a hash of the sources, the architectures and the
torch / CUDA versions, so a second process or a second run reuses the build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from marlin_cli.errors import KernelUnavailable

SOURCES = (
    "marlin.cu",
    "marlin_mb1.cu",
    "marlin_mb2.cu",
    "marlin_mb3.cu",
    "marlin_mb4.cu",
    "marlin24.cu",
    "marlin_sm90.cu",
    "marlin24_sm90.cu",
    "gptq.cu",
    "bindings.cpp",
)
HEADERS = ("marlin.h", "marlin_kernel.cuh", "marlin24.h", "marlin24_kernel.cuh", "wgmma.cuh", "gptq.h")
MIN_CAPABILITY = (8, 0)  # mma.sync m16n8k16, mma.sp m16n8k32, cp.async and ldmatrix need sm_80
CUDA_FLAGS = ("-O3", "-std=c++17", "-lineinfo")

_lock = threading.Lock()
_loaded: Path | None = None


def source_dir() -> Path:
    """Directory holding the CUDA sources: an installation's `marlin_cli/kernels`, else the checkout's `kernels/`."""
    package = Path(__file__).resolve().parents[1]
    installed = package / "kernels"
    return installed if (installed / SOURCES[0]).is_file() else package.parent / "kernels"


def nvcc_path() -> str | None:
    """The nvcc torch's extension builder would use, or None."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").is_file():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def nvcc_version() -> str:
    """nvcc's release string ("13.0"), or "none"."""
    nvcc = nvcc_path()
    if nvcc is None:
        return "none"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    found = re.search(r"release (\d+\.\d+)", out)
    return found.group(1) if found else "unknown"


def kernel_problem(device: torch.device | str | int | None = None) -> str | None:
    """Why the kernel cannot run on `device` (None: the current CUDA device), or None when it can."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return "no CUDA GPU is visible to torch (the CPU reference path still works)"
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        return f"device {dev} is not a CUDA device"
    cap = torch.cuda.get_device_capability(dev)
    if cap < MIN_CAPABILITY:
        return (
            f"GPU {torch.cuda.get_device_name(dev)} has compute capability {cap[0]}.{cap[1]}; the kernel needs "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ampere, Ada, Hopper)"
        )
    if nvcc_path() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH) so the kernel cannot be compiled"
    return None


def arch_list() -> str:
    """Architectures to compile for: TORCH_CUDA_ARCH_LIST if set, else the capability of the current GPU (9.0 as
    9.0a, the target with wgmma, which the kernels for m > 8 need)."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    major, minor = torch.cuda.get_device_capability()
    return "9.0a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def cuda_flags(arches: str) -> list[str]:
    """nvcc flags; MARLIN_SM90A tells the host code that the wgmma kernel was compiled (only for sm_90a)."""
    flags = list(CUDA_FLAGS)
    if "9.0a" in re.split(r"[;\s]+", arches):
        flags.append("-DMARLIN_SM90A")
    return flags


def _build_hash(src: Path, arches: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((src / name).read_bytes())
    h.update(f"{arches}|{torch.__version__}|{torch.version.cuda}|{' '.join(cuda_flags(arches))}".encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """Root of the build cache: $MARLIN_CLI_CACHE, else $XDG_CACHE_HOME/marlin_cli, else ~/.cache/marlin_cli."""
    env = os.environ.get("MARLIN_CLI_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "marlin_cli"


def _unavailable(reason: str) -> KernelUnavailable:
    cap = "none"
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        cap = f"{major}.{minor}"
    return KernelUnavailable(
        f"{reason} (torch {torch.__version__}, torch CUDA {torch.version.cuda}, nvcc {nvcc_version()}, "
        f"GPU capability {cap}); fix the toolchain or run on CPU tensors to use the reference path"
    )


def build_kernels() -> Path:
    """Build (or reuse) the kernel library for the GPU present, load it, and return the shared library's path."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        problem = kernel_problem()
        if problem is not None:
            raise _unavailable(f"the CUDA kernel cannot be built: {problem}")
        from torch.utils import cpp_extension

        src = source_dir()
        arches = arch_list()
        library = _library(arches)
        name, build_dir = library.stem, library.parent
        build_dir.mkdir(parents=True, exist_ok=True)
        old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
        os.environ["TORCH_CUDA_ARCH_LIST"] = arches  # the explicit list; cpp_extension turns it into -gencode flags
        try:
            cpp_extension.load(
                name=name,
                sources=[str(src / s) for s in SOURCES],
                extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=cuda_flags(arches),
                extra_include_paths=[str(src)],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=bool(os.environ.get("MARLIN_CLI_VERBOSE_BUILD")),
            )
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            raise _unavailable(f"building the CUDA kernel in {build_dir} failed: {exc}") from exc
        finally:
            if old_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
        _loaded = library
        return _loaded


def _library(arches: str) -> Path:
    """Where the kernel library for the current sources and `arches` is built and cached."""
    digest = _build_hash(source_dir(), arches)
    return cache_dir() / digest / f"marlin_cli_kernels_{digest}.so"


def needs_build() -> bool:
    """Whether using the kernels on the GPU present would compile them first (not loaded, not in the cache)."""
    return _loaded is None and kernel_problem() is None and not _library(arch_list()).is_file()


def load_kernel() -> None:
    """Make `torch.ops.marlin_cli.gemm` and `gemm24` available, building the kernels first if needed. Idempotent."""
    build_kernels()
