"""`marlin build-kernels`: compile the bundled CUDA kernel ahead of time (otherwise it is built on first use)."""

from __future__ import annotations

from marlin_cli.cli.common import JsonOpt, Timer, err_console, print_json
from marlin_cli.kernel import build


def build_kernels_command(json_out: JsonOpt = False) -> None:
    """Compile the CUDA kernel for the GPU present (sm_80 or newer) into the per-user cache.

    Set TORCH_CUDA_ARCH_LIST (e.g. "8.0;9.0") to build for other architectures.
    """
    timer = Timer()
    path = build.build_kernels()
    if json_out:
        print_json({"library": str(path), "seconds": timer.seconds()})
    else:
        err_console.print(f"kernel built: {path} ({timer.seconds():.1f} s)")
