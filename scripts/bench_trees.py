"""Our kernels in several checkouts of marlin side by side on the GPU: `scripts/bench_kernel.py --only-ours` of each.

python3 scripts/bench_trees.py TREE [TREE ...] [--rounds 3] [--m 1,8,16,128] [--sets 7b,70b] [--log FILE]

Each TREE is a checkout (`.` for this one). Unlike scripts/ab_kernels.py, whose variants run this checkout's Python
code, every tree runs its own, so trees that lay out the weights differently for their kernels (the kernel order, the
bindings' checks) compare too. Every tree's kernels are built first (`marlin build-kernels`, one process per tree, in
parallel: the build cache is keyed by the sources, so trees share it); then each round runs every tree's bench once,
each in a process of its own, the trees' order rotating from round to round, since a layer's time drifts with what ran
before it. Prints, per layer set and M, the median over the rounds of each tree's dense and 2:4 sums (microseconds)
and each later tree's 2:4 sum against the first tree's, then the same per layer for the 2:4 kernel. --log keeps every
bench's output.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

BUILD = "from marlin_cli.cli.app import main; main()"  # `marlin build-kernels` with the tree's own package

Key = tuple  # (set, M) for sums, (set, K, N, M) for layers


def parse_bench(text: str) -> dict[str, dict[Key, tuple[float, float]]]:
    """bench_kernel.py's output as {"sums": {(set, M): (dense us, 2:4 us)}, "layers": {(set, K, N, M): (dense,
    2:4)}}: the per-layer rows (set K N M cuBLAS int4mm ours alone ideal speedup %ideal 2:4 ...) and the rows of the
    sums table after its title (set M cuBLAS int4mm ours alone ideal speedup %ideal 2:4 ...)."""
    out: dict[str, dict[Key, tuple[float, float]]] = {"sums": {}, "layers": {}}
    in_sums = False
    for line in text.splitlines():
        if line.startswith("sums over"):
            in_sums = True
            continue
        f = line.split()
        if len(f) < 12 or not f[1].isdigit():  # headers, the device and bandwidth lines
            continue
        if in_sums:
            out["sums"][(f[0], int(f[1]))] = (float(f[4]), float(f[9]))
        else:
            out["layers"][(f[0], int(f[1]), int(f[2]), int(f[3]))] = (float(f[6]), float(f[11]))
    return out


def medians(runs: list[dict[Key, tuple[float, float]]]) -> dict[Key, tuple[float, float]]:
    """Per key (7B set first), the median dense and 2:4 times over the runs that have it."""
    out = {}
    for key in sorted({key for run in runs for key in run}, key=lambda k: (k[0] != "7b", k[1:])):
        have = [run[key] for run in runs if key in run]
        out[key] = (statistics.median(d for d, _ in have), statistics.median(s for _, s in have))
    return out


def report(trees: list[str], runs: dict[str, list[dict]]) -> str:
    """The tables of medians over each tree's runs: sums as dense / 2:4, layers as 2:4; later trees' 2:4 times also
    against the first tree's."""
    lines = []
    for part, title in (("sums", "dense / 2:4 sums over each set's four layers"), ("layers", "2:4 per layer")):
        med = {t: medians([run[part] for run in runs[t]]) for t in trees}
        rounds = min(len(runs[t]) for t in trees)
        heads = "".join(f"  {'tree ' + str(i + 1):>22}" for i in range(len(trees)))
        lines += [f"\n{title}, us, median of {rounds} rounds", f"{'set':>4} {'K x N':>13} {'M':>4}{heads}"]
        for key, (_, base) in med[trees[0]].items():
            cells = []
            for t in trees:
                dense, sparse = med[t].get(key, (float("nan"), float("nan")))
                cell = f"{dense:.1f} / {sparse:.1f}" if part == "sums" else f"{sparse:.1f}"
                cells.append(f"  {cell + ('' if t == trees[0] else f' {100 * (sparse / base - 1):+.1f}%'):>22}")
            shape = f"{key[1]} x {key[2]}" if part == "layers" else ""
            lines.append(f"{key[0]:>4} {shape:>13} {key[-1]:>4}{''.join(cells)}")
    lines.append("\n" + "\n".join(f"tree {i + 1}: {t}" for i, t in enumerate(trees)))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--m", default="1,8,16,128")
    parser.add_argument("--sets", default="7b,70b")
    parser.add_argument("--log", type=Path, help="append every bench's output here")
    args = parser.parse_args()
    trees = [str(t.resolve()) for t in args.trees]
    for t in trees:
        if not (Path(t) / "scripts" / "bench_kernel.py").is_file():
            sys.exit(f"error: {t} is not a checkout of marlin (no scripts/bench_kernel.py)")
    builds = [subprocess.Popen([sys.executable, "-c", BUILD, "build-kernels"], cwd=t) for t in trees]
    for t, p in zip(trees, builds):
        if p.wait() != 0:
            sys.exit(f"error: building the kernels of {t} failed (exit code {p.returncode})")
    bench = ["scripts/bench_kernel.py", "--only-ours", "--m", args.m, "--sets", args.sets]
    runs: dict[str, list[dict]] = defaultdict(list)
    for r in range(args.rounds):
        for t in trees[r % len(trees) :] + trees[: r % len(trees)]:
            done = subprocess.run([sys.executable, *bench], cwd=t, capture_output=True, text=True)
            if args.log:
                with args.log.open("a") as f:
                    f.write(f"=== round {r + 1}, {t}\n{done.stdout}{done.stderr}")
            if done.returncode != 0:
                sys.exit(f"error: the bench of {t} failed (exit code {done.returncode}):\n{done.stderr[-2000:]}")
            parsed = parse_bench(done.stdout)
            runs[t].append(parsed)
            bw = [line for line in done.stdout.splitlines() if line.startswith("copy bandwidth")]
            print(f"round {r + 1}, {t}: {bw[0] if bw else ''}", flush=True)
    print(report(trees, runs))


if __name__ == "__main__":
    main()
