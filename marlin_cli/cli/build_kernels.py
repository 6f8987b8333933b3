"""`marlin build-kernels`: compile the bundled CUDA kernels ahead of time (otherwise they are built on first use)."""

from __future__ import annotations

from marlin_cli.cli.common import JsonOpt, Timer, err_console, print_json


def build_kernels_command(json_out: JsonOpt = False) -> None:
    """Compile the CUDA kernels for the GPU present (sm_80 or newer) into the per-user cache.

    A compute capability 9.0 GPU (H100, H200) is built for 9.0a, which adds the Hopper kernels (wgmma, wgmma.sp).

    Set TORCH_CUDA_ARCH_LIST (e.g. "8.0;9.0a") to build for other architectures (without 9.0a: no Hopper kernel).
    """
    from marlin_cli.kernel import build

    timer = Timer()
    path = build.build_kernels()
    if json_out:
        print_json({"library": str(path), "seconds": timer.seconds()})
    else:
        err_console.print(f"kernels built: {path} ({timer.seconds():.1f} s)")
