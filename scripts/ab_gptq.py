"""A/B of GPTQ column-loop kernel variants (kernels/gptq.cu) in one process on the GPU.

python3 scripts/ab_gptq.py DIR [DIR ...] [--rounds 3]

Each DIR holds a full copy of the kernel sources with the change under test, built as `scripts/ab_kernels.py` builds
them (op namespace renamed). Cases: a plain solve's launches (one pass over K in 128-column blocks, the rows of the
layer, U of the whole layer, so most of U comes from DRAM as in the solve) on Llama-sized layers, and one launch of
--clip's search (2^17 rows of one 128-column group, U of the group). Outputs are first checked bit for bit against the
current kernels. Two diagnostic cases repeat one block's launch (its U rows then come from L2 or, at K = 128, fit
L1), to tell U's reads from the loop's own latency. Prints milliseconds, the mean of the rounds, run in alternating
order.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from ab_kernels import load_builds  # noqa: E402

from marlin_cli.algo.gptq import SEARCH_ROWS, inverse_cholesky  # noqa: E402

COLS = 128
# (name, rows n, K, one block): a solve pass is K / 128 launches over the layer (the search's, one launch with
# K = 128); "one block" repeats the first block's launch K / 128 times, so its U rows come from L2 after the first
CASES = (
    ("solve 4096x4096", 4096, 4096, False),
    ("4096x4096 block 0", 4096, 4096, True),
    ("4096 rows, K 128", 4096, 128, True),
    ("solve 4096x11008", 11008, 4096, False),
    ("solve 11008x4096", 4096, 11008, False),
    ("solve 28672x8192", 8192, 28672, False),
    ("search g128", SEARCH_ROWS["cuda"], COLS, False),
)


def problem(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights (n, k), U of a correlated Hessian (k, k) and per-row scales, float32 on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(2 * k, k, device="cuda", generator=gen)
    x = x + torch.randn(2 * k, 16, device="cuda", generator=gen) @ torch.randn(16, k, device="cuda", generator=gen)
    upper = inverse_cholesky(x.T @ x / (2 * k), 0.01)[0].contiguous()
    w = torch.randn(n, k, device="cuda", generator=gen)
    return w, upper, w.abs().amax(1) / 7.5


def run_pass(ns: object, w: torch.Tensor, upper: torch.Tensor, s: torch.Tensor, out: tuple, one: bool) -> None:
    codes, errors = out
    blocks = w.shape[1] // COLS
    for c0 in [0] * blocks if one else range(0, blocks * COLS, COLS):
        ns.gptq_block(w, upper, s, 1, 0, codes, errors, 0, c0, c0 + COLS, c0 + COLS, None, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    builds = load_builds(args.dirs)
    names = list(builds)[1:]

    times: dict[tuple[str, str], list[float]] = {}
    for case, n, k, one in CASES:
        w0, upper, s = problem(n, k)
        outs = {}
        for name, ns in builds.items():  # correctness: every build's codes, errors and weights, poisoned first
            w = w0.clone()
            out = (torch.full((n, k), 0xEE, dtype=torch.uint8, device="cuda"), torch.full_like(w, float("nan")))
            run_pass(ns, w, upper, s, out, one)
            outs[name] = (*out, w)
        for name in names:  # bit for bit, unwritten (poisoned) entries included
            try:
                for a, b in zip(outs[name], outs["current"]):
                    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
            except AssertionError:
                print(f"{name} differs from the current kernels on {case}")
        del outs
        w = w0.clone()
        out = (torch.empty((n, k), dtype=torch.uint8, device="cuda"), torch.empty_like(w))
        order = list(builds)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                run_pass(builds[name], w, upper, s, out, one)  # warm
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                run_pass(builds[name], w, upper, s, out, one)
                end.record()
                end.synchronize()
                times.setdefault((case, name), []).append(start.elapsed_time(end))
        del w0, w, upper, out
        torch.cuda.empty_cache()

    print(f"\nms per solve pass (K / 128 launches) or search launch, mean of {args.rounds} rounds")
    print(f"{'case':>18} " + " ".join(f"{b:>10}" for b in builds))
    for case, *_ in CASES:
        row = " ".join(f"{sum(times[(case, b)]) / len(times[(case, b)]):10.3f}" for b in builds)
        print(f"{case:>18} {row}")


if __name__ == "__main__":
    main()
