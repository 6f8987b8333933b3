"""The sm_80-class kernels (mma.sync, mma.sp) on the H200, for every batch size: what A100-class GPUs run.

On Hopper the wgmma kernels take the dense m > 8 and every 2:4 m, so the sm_80-class kernels' larger chunks (and the
mma.sp kernel altogether) would go untested here. A library built without sm_90a (TORCH_CUDA_ARCH_LIST=9.0) holds no
wgmma kernels, and its host code sends every m to the sm_80-class ones. scripts/sanitize_kernel.py's shapes (every
chunk height, strip width, group kind, act-order, ragged m and split k of both kernels) run on that build against the
float32 reference at the script's tolerance (2e-3, the one tests/gpu/test_kernel.py states), in a subprocess: its own
build, cached under its own hash, and its own op registration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sanitize_kernel.py"


def test_sm80_kernels_take_every_m() -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the kernels need compute capability 8.0")
    major, minor = torch.cuda.get_device_capability()
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=f"{major}.{minor}")  # 9.0, not 9.0a: no wgmma kernels
    run = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=1200)
    print("\n".join(run.stdout.splitlines()[-3:]))
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "2:4 m=256" in run.stdout, run.stdout[-2000:]
