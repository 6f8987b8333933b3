"""Where one kernel's warps wait, by region of its SASS: Nsight Compute's warp samples summed per region.

python3 scripts/warp_samples.py CSV [CSV ...] [--min 1.0] [--reasons 5]

CSV: the source page of an ncu report, per SASS instruction (perf-log pr2), e.g.
    ncu -k regex:gemm24_sm90_kernel --launch-skip 2 --launch-count 1 --section SourceCounters \\
        --warp-sampling-interval 0 -o /tmp/r python3 scripts/profile_kernel.py 1 4096 22016 --sparse24
    ncu -i /tmp/r.ncu-rep --page source --csv --print-source sass > /tmp/r.csv
A region is a run of consecutive instructions that executed equally often: the block's set-up (once per warp), a
stage loop's body (once per stage), a strip's end. Each region at least --min percent of the kernel's samples is
printed with its instructions, its first instruction, its share and the share of its most frequent stall reasons
("selected": the warp issued).
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

_SAMPLES = "Warp Stall Sampling (All Samples)"
_EXECUTED = "Instructions Executed"


@dataclass
class Region:
    first: int  # index of its first instruction
    count: int  # instructions
    executed: int  # times each of them executed
    text: str  # its first instruction
    samples: int = 0
    reasons: Counter = field(default_factory=Counter)


def regions(path: Path) -> tuple[str, int, list[Region]]:
    """The kernel's name, its samples and its regions, from ncu's source page in CSV."""
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3 or len(rows[0]) < 2 or _SAMPLES not in rows[1]:
        raise SystemExit(f"{path}: not an ncu source page with warp samples (see --help for how to write one)")
    kernel, header, data = rows[0][1], rows[1], rows[2:]
    at = {name: i for i, name in enumerate(header)}
    stalls = [n for n in header if n.startswith("stall_") and not n.endswith("(Not Issued)")]
    out: list[Region] = []
    for i, row in enumerate(data):
        executed = int(row[at[_EXECUTED]] or 0)
        if not out or out[-1].executed != executed:
            out.append(Region(i, 0, executed, row[at["Source"]].strip()))
        r = out[-1]
        r.count += 1
        r.samples += int(row[at[_SAMPLES]] or 0)
        r.reasons.update({n.removeprefix("stall_"): int(row[at[n]] or 0) for n in stalls})
    return kernel, sum(r.samples for r in out), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", type=Path)
    parser.add_argument("--min", type=float, default=1.0, help="smallest share of the samples printed, percent")
    parser.add_argument("--reasons", type=int, default=5, help="stall reasons printed per region")
    args = parser.parse_args()
    for path in args.csv:
        kernel, total, found = regions(path)
        print(f"{path}: {kernel}\n  {total} samples, {sum(r.count for r in found)} instructions")
        print(f"  {'first':>5} {'instr':>5} {'executed':>9} {'share':>6}  stall reasons (share of all samples)")
        per = 100 / max(total, 1)  # percent per sample (a page with no samples prints zeros)
        for r in found:
            share = per * r.samples
            if share < args.min:
                continue
            why = " ".join(f"{n} {per * v:.1f}" for n, v in r.reasons.most_common(args.reasons) if v)
            print(f"  {r.first:5d} {r.count:5d} {r.executed:9d} {share:5.1f}%  {why}  | {r.text[:48]}")


if __name__ == "__main__":
    main()
