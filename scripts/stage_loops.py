"""The wgmma kernels' stage loops in SASS: how many instructions a stage runs, side by side for two builds.

python3 scripts/stage_loops.py OBJECT [OBJECT_B] [--match REGEX] [--cuobjdump PATH]

OBJECT: the kernel library the package builds, or an object with sm_90a code of kernels/marlin_sm90.cu or
kernels/marlin24_sm90.cu (compiled as scripts/check_meta_hazards.py shows). For each kernel with a loop around an
HGMMA it prints the loop's length, the stage's path through it (the loop less its longest forward branch: the end of
a column strip, entered once per strip) and the R2UR and HGMMA on that path, in instructions. R2UR copies a register
into the uniform file each time a wgmma descriptor or address computed in ordinary registers is used; a stage loop
that keeps those in uniform registers has none (perf-log o5). With OBJECT_B, kernels of the same name are printed
side by side.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from check_meta_hazards import functions, stage_loop

_BRANCH = re.compile(r"BRA (?:\S+, )?0x([0-9a-f]+)")
_ROW = "{:4d}  {:5d}  {:4d}  {:5d}"


def stage_path(body: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The loop body less the instructions its longest forward branch inside the loop jumps over."""
    end = body[-1][0]
    skip = (0, 0)
    for addr, text in body:
        m = _BRANCH.search(text)
        target = int(m.group(1), 16) if m else -1
        if addr < target <= end + 16 and target - addr > skip[1] - skip[0]:
            skip = (addr, target)
    return [(a, t) for a, t in body if not skip[0] < a < skip[1]]


def summary(obj: str, cuobjdump: str, match: str) -> dict[str, tuple[int, int, int, int]]:
    """Kernel name -> (loop length, stage path, R2UR on it, HGMMA on it)."""
    sass = subprocess.run([cuobjdump, "--dump-sass", obj], capture_output=True, text=True, check=True).stdout
    out = {}
    for name, instrs in functions(sass).items():
        body = stage_loop(instrs, "HGMMA") if re.search(match, name) else None
        if body is None:
            continue
        path = [t for _, t in stage_path(body)]
        out[name] = (
            len(body),
            len(path),
            sum(t.startswith("R2UR") for t in path),
            sum(t.startswith("HGMMA") for t in path),
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("objects", nargs="+", metavar="OBJECT", help="one build, or two to compare")
    ap.add_argument("--match", default="", help="only kernels whose mangled name matches this regular expression")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    if len(args.objects) > 2:
        ap.error("one OBJECT, or two to compare")
    builds = [summary(o, args.cuobjdump, args.match) for o in args.objects]
    if not builds[0]:
        print(f"{args.objects[0]}: no stage loop around an HGMMA (no sm_90a code of the wgmma kernels)")
        return 2
    head = "loop  stage  R2UR  HGMMA"
    print(f"{head}   {head if len(builds) > 1 else ''}  kernel")
    for name, row in sorted(builds[0].items()):
        cells = [row] + [b.get(name) for b in builds[1:]]
        text = "   ".join("    -      -     -      -" if c is None else _ROW.format(*c) for c in cells)
        print(f"{text}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
