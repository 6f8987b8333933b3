r"""Launch one GEMM a few times, for ncu to profile one launch (the figures in docs/perf-log.md, w1 and s13).

Stall reasons of the wgmma kernel on the 8192 x 57344 layer of Llama-3-70B at M = 64, on the H200:

  M='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  M=$M,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active
  M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum
  ncu --kernel-name regex:gemm_sm90 --launch-skip 2 --launch-count 1 --metrics "$M" \
    python3 scripts/profile_kernel.py 64 8192 57344

(`--kernel-name regex:gemm_kernel` selects the sm_80 kernel, which runs for m <= 32; `--sparse24` launches the 2:4
product instead, `regex:gemm24_sm90` its wgmma.sp kernels; add `--section SourceCounters --warp-sampling-interval 0`
for the stalls per instruction, which `scripts/warp_samples.py` sums by region of the SASS.) The kernel is built on the
first call, before the launches ncu sees.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from gpu_helpers import random_operands, random_operands24  # noqa: E402

from marlin_cli.kernel import ops  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("m", type=int)
    parser.add_argument("k", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("--group", type=int, default=128, help="group size, -1 for per-channel scales")
    parser.add_argument("--launches", type=int, default=4, help="calls of the kernel (profile one after the first)")
    parser.add_argument("--sparse24", action="store_true", help="the 2:4 product on a random 2:4 layer")
    args = parser.parse_args()
    if args.sparse24:
        a, b24, meta, s24 = random_operands24(args.m, args.k, args.n, args.group)
        launch = functools.partial(ops.gemm24, a, ops.prepare24(b24, meta), s24)
    else:
        a, b, s = random_operands(args.m, args.k, args.n, args.group)
        launch = functools.partial(ops.gemm, a, b, s)
    for _ in range(args.launches):
        launch()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
