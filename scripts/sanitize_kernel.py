"""A few small kernel launches for compute-sanitizer (memcheck, racecheck, synccheck) on the H200.

compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/sanitize_kernel.py [--kind dense|24|both]
compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_kernel.py [--kind dense|24|both]

Build the kernel first (any call of marlin_cli.kernel.ops.gemm on a GPU), so the sanitizer only sees launches.
The shapes cover every chunk height, strip width, group kind, act-order, ragged m and the split-k fixup, for the
sm_80 kernel (m <= 8, groups below 128 at m <= 16, or n too narrow for the wgmma tile) and the wgmma kernel (m > 8
on the H200), then the 2:4 kernels (wgmma.sp on the H200, mma.sp elsewhere); `--kind` runs one of the two (racecheck
takes minutes over both). tests/gpu/test_sm80_kernels.py runs them on a build without sm_90a, where every m takes the
sm_80 kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))

from gpu_helpers import dequantize_gpu, random_operands, random_operands24, rel_error  # noqa: E402

from marlin_cli.kernel import ops, reference  # noqa: E402

CASES = [  # m, k, n, group, act_order
    (1, 1024, 256, 128, False),  # short runs: chunks of <= 16 rows on 3-stage rings
    (1, 8192, 8512, 128, False),  # 8-row chunks, 64-column strips, runs of > 32 tiles: 4 stages
    (5, 512, 192, -1, True),  # 8-row chunks, 64-column strips, per-channel scales
    (16, 512, 192, 32, False),
    (12, 2048, 256, 32, False),  # 16-row chunks (groups of 32), 128-column strips (k-warp slices on Hopper), split k
    (9, 2048, 512, -1, True),  # wgmma kernel, 16 x 128 tiles, per-channel scales
    (16, 4096, 1024, 128, False),  # ... split k
    (12, 11008, 4096, 128, False),  # ... three blocks per SM (sm90_blocks_per_sm), split k
    (13, 512, 16384, 128, False),  # wgmma kernel, 16 x 256 tiles
    (17, 512, 192, -1, True),
    (24, 2048, 512, 128, False),  # wgmma kernel, 32-row chunks, 32 x 128 tiles, split k
    (32, 512, 16384, -1, True),  # ... 32 x 256 tiles, per-channel scales
    (20, 1024, 512, 32, False),  # groups of 32 from 17 rows: one 64-row chunk (warp-specialized kernel), 20 rows real
    (33, 1024, 512, 32, False),
    (64, 256, 1024, 64, False),  # warp-specialized kernel from 33 rows: 64 x 128 tiles (too few 256-column strips)
    (64, 2048, 256, 128, False),  # two strips in 8 parts each
    (64, 512, 16384, 128, False),  # 64 x 256 tiles
    (48, 2048, 5760, -1, False),  # 64 x 128 tiles on runs long enough to add their parts in the kernel
    (64, 4096, 22016, 128, False),  # ... 64 x 256 tiles
    (64, 28672, 8192, 128, False),  # 64 x 512 tiles (runs of 54 tiles), strips in parts
    (80, 384, 384, 128, True),  # 96 x 128 tiles
    (96, 4096, 22016, 128, False),  # 96 x 256 tiles on runs long enough to add their parts in the kernel
    (100, 384, 384, 128, True),  # 128 x 128 tiles
    (128, 2048, 128, 64, False),  # one strip in 8 parts
    (100, 2048, 5760, -1, False),  # 128 x 128 tiles on runs long enough to add their parts in the kernel
    (128, 4096, 22016, 128, False),  # ... 128 x 256 tiles
    (128, 1024, 8192, 32, False),  # 128 x 256 tiles, two scale rows per stage, split strips
    (200, 512, 512, -1, True),  # 256 x 128 tiles, per-channel scales
    (300, 1024, 256, 128, False),  # two 256-row chunks, strips in parts
    (256, 1024, 12288, -1, False),  # 256 x 128 tiles on runs long enough to add their parts in the kernel
    (300, 1024, 12288, 32, False),  # ... in two 256-row chunks
    (100, 14336, 4096, 32, False),  # 128 x 256 tiles on n = 4096 (12+ tiles an SM: sm90_cols128), 8-9 parts a strip
]
CASES24 = [  # m, k, n, group: the 2:4 kernel's chunk heights, strip widths and the split-k fixup
    (1, 1024, 256, 128),
    (8, 512, 128, -1),
    (16, 2048, 256, 32),  # wgmma.sp kernel, 16 x 128 tiles, 128-deep stages, split k
    (1, 11008, 4096, -1),  # ... 8 x 128 tiles (m <= 8) at three blocks per SM (sm90_blocks_per_sm), per channel
    (16, 11008, 4096, 32),  # ... 16 x 128 tiles at three blocks per SM
    (5, 8192, 4096, 32),  # ... 8 x 128 tiles at four blocks per SM, groups of 32
    (3, 4096, 6144, 64),  # ... at three blocks per SM on a tie with two
    (12, 1024, 16384, 32),  # 16 x 256 tiles, 256-deep stages: two passes of scale rows
    (8, 1024, 16384, 32),  # 8 x 256 tiles (m <= 8), the same stages
    (9, 2048, 512, -1),  # per-channel scales
    (24, 512, 384, 128),  # wgmma.sp kernel, 32-row chunks from 17 rows
    (32, 2048, 16384, -1),  # ... 32 x 256 tiles, per-channel scales
    (33, 512, 384, 128),  # 64-row chunks from 33 rows
    (64, 2048, 512, 128),  # wgmma.sp kernel, 64 x 128 tiles: four strips in 8 parts each
    (100, 512, 256, -1),  # warp-specialized 128 x 128 tiles (a row block per warpgroup), per-channel scales
    (300, 1024, 512, 32),  # three 128-row chunks, the last one's second row block empty, strips in parts
    (64, 512, 16384, 32),  # warp-specialized wgmma.sp kernel, 64 x 256 tiles, two scale rows per stage
    (48, 4096, 4096, 32),  # ... 64 x 256 tiles on n = 4096 (the one-block-per-SM width rule), strips in parts
    (64, 4096, 22016, 128),  # ... 64 x 256 tiles whose blocks add their strips' parts
    (100, 512, 16384, 32),  # 128 x 256 tiles, two scale rows per stage
    (256, 1024, 8192, -1),  # two 128-row chunks, per-channel scales, strips in parts
    (128, 4096, 22016, 128),  # 128 x 256 tiles whose blocks add their strips' parts, C through shared memory
    (200, 4096, 4096, 32),  # ... 128 x 128 tiles, two chunks side by side (the second 72 rows)
    (200, 11008, 4096, -1),  # ... 128 x 256 ones there (12+ tiles an SM: sm90_cols128), 8-9 parts a strip
    (80, 1024, 384, -1),  # 96 x 128 tiles (a row block of 48 per warpgroup, the second one half empty), per channel
    (5, 4096, 33792, -1),  # 8 x 512 tiles (m <= 16 on runs of 16 tiles), split strips' parts added in the kernel
    (16, 4096, 33792, 32),  # 16 x 512 tiles, the same runs
    (9, 4096, 22016, 32),  # 16 x 256 tiles (m = 9-16 on runs of 21 tiles), a strip per computing warpgroup
    (16, 4096, 22016, -1),
    (96, 4096, 22016, 32),  # 96 x 256 tiles whose blocks add their strips' parts
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=("dense", "24", "both"), default="both")
    kind = ap.parse_args().kind
    torch.backends.cuda.matmul.allow_tf32 = False
    worst = 0.0
    for m, k, n, group, act_order in CASES if kind != "24" else []:
        a, b, s = random_operands(m, k, n, group, seed=m)
        perm = torch.randperm(k, device="cuda").int() if act_order else None
        c = ops.gemm(a, b, s, perm)
        ref = (a if perm is None else a[:, perm.long()]).float() @ dequantize_gpu(b, s)
        err = rel_error(c, ref)
        worst = max(worst, err)
        print(f"m={m} k={k} n={n} g={group} act_order={act_order}: relative error {err:.2e}")
    for m, k, n, group in CASES24 if kind != "dense" else []:
        a, b24, meta, s = random_operands24(m, k, n, group, seed=m)
        c = ops.gemm24(a, ops.prepare24(b24, meta), s)
        err = rel_error(c, a.float() @ reference.dequantize24(b24, meta, s))
        worst = max(worst, err)
        print(f"2:4 m={m} k={k} n={n} g={group}: relative error {err:.2e}")
    torch.cuda.synchronize()
    return 0 if worst <= 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
