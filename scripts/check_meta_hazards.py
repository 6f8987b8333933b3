"""How soon the 2:4 wgmma kernels rewrite a wgmma.sp group's metadata register while the group may still run.

python3 scripts/check_meta_hazards.py OBJECT [--min 65] [--cuobjdump PATH]

OBJECT: the kernel library the package builds, or an object with sm_90a code of kernels/marlin24_sm90.cu, e.g.
    nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DMARLIN_SM90A -c kernels/marlin24_sm90.cu -o /tmp/m.o
(scripts/compile_kernels.sh checks its object so, without a GPU). cuobjdump and the nvdisasm it runs come from the
CUDA toolkit or from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels that the test extra installs.

ptxas keeps the fragment registers of a warpgroup MMA group in flight until a wait retires it, but not the sparse
metadata register: it may rewrite that once the HGMMA.SP has issued, and the hardware reads it later. Rewrites 20
and 57 instructions after the issue gave wrong outputs (perf-log s15, s17); 65 or more never have. For each kernel
with a stage loop of HGMMA.SP this walks the loop three times in program order, tracks the groups in flight (a group
ends at the HGMMA marked gsb0, WARPGROUP.DEPBAR gsb0, N leaves N) and reports every write to a metadata register of a
group in flight with its distance in instructions from the issue. Exit 1 if one is nearer than --min, 2 if OBJECT
holds no such loop (no sm_90a code of the 2:4 kernels), 3 if cuobjdump is missing or fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_NO_DEST = ("ST", "BRA", "SYNCS", "WARPGROUP", "BAR", "RED", "NOP", "DEPBAR", "EXIT", "RET", "CALL", "ARRIVES")


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Function name -> its instructions as (address, text without predicate guard)."""
    out = {}
    for part in sass.split("Function : ")[1:]:
        name, body = part.split("\n", 1)
        instrs = []
        for line in body.splitlines():
            m = _INSTR.match(line)
            if m:
                instrs.append((int(m.group(1), 16), re.sub(r"^@!?U?P\w+\s+", "", m.group(2))))
        out[name.strip()] = instrs
    return out


def _regs(token: str, count: int = 1) -> set[int]:
    m = re.match(r"R(\d+)", token)
    return {int(m.group(1)) + i for i in range(count)} if m else set()


def stage_loop(instrs: list[tuple[int, str]], op: str = "HGMMA.SP") -> list[tuple[int, str]] | None:
    """The body of the first backward branch around an instruction starting with `op` (the stage loop), or None."""
    first = next((i for i, (_, t) in enumerate(instrs) if t.startswith(op)), None)
    if first is None:
        return None
    index = {a: i for i, (a, _) in enumerate(instrs)}
    for i in range(first + 1, len(instrs)):
        m = re.search(r"BRA (?:\S+, )?0x([0-9a-f]+)", instrs[i][1])
        target = index.get(int(m.group(1), 16)) if m else None
        if target is not None and target <= first:
            return instrs[target : i + 1]
    return None


def rewrites(body: list[tuple[int, str]]) -> list[tuple[int, str, int]]:
    """(address, instruction, distance) of each write to the metadata register of a group in flight."""
    pending: list[set[tuple[int, int]]] = []
    current: set[tuple[int, int]] = set()  # (register, position of its HGMMA.SP)
    found, pos = [], 0
    for _ in range(3):  # the loop's back edge carries groups: walk it until the pattern repeats
        for addr, text in body:
            pos += 1
            op, _, rest = text.partition(" ")
            args = [a.strip() for a in rest.split(",")]
            if op.startswith("HGMMA"):
                if ".SP" in op:
                    current |= {(r, pos) for r in _regs(args[4])}
                if "gsb0" in text:
                    pending.append(current)
                    current = set()
                continue
            m = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x(\d+)", text)
            if m:
                del pending[: max(0, len(pending) - int(m.group(1)))]
                continue
            if op.startswith(_NO_DEST) or not args[0].startswith("R"):
                continue
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            dest = _regs(args[0], width)
            for group in [*pending, current]:
                found += [(addr, text, pos - at) for r, at in group if r in dest]
    return found


def toolkit_binary(name: str) -> str | None:
    """A CUDA tool on PATH, else in the toolkit torch's extension builder would find (CUDA_HOME, CUDA_PATH, nvcc's
    folder on PATH, /usr/local/cuda), else from the nvidia-cuda-* wheels (nvidia/cu*/bin)."""
    found = shutil.which(name)
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    bin_dirs = [Path(h) / "bin" for h in homes if h] + ([Path(nvcc).parent] if nvcc else [])
    for bin_dir in [*bin_dirs, Path("/usr/local/cuda/bin")]:
        if (bin_dir / name).is_file():
            return str(bin_dir / name)
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        for path in sorted(Path(root).glob(f"cu*/bin/{name}"), reverse=True):
            return str(path)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("object")
    ap.add_argument("--min", type=int, default=65, help="nearest rewrite accepted, in instructions (default 65)")
    ap.add_argument("--cuobjdump", default=toolkit_binary("cuobjdump"))
    args = ap.parse_args()
    if args.cuobjdump is None:
        print("cuobjdump not found: install the CUDA toolkit's, or pip install -e '.[test]'", file=sys.stderr)
        return 3
    env = dict(os.environ)
    nvdisasm = toolkit_binary("nvdisasm") or str(Path(args.cuobjdump).with_name("nvdisasm"))
    env["PATH"] = os.pathsep.join([str(Path(nvdisasm).parent), env.get("PATH", "")])  # cuobjdump runs nvdisasm
    sass = subprocess.run(
        [args.cuobjdump, "--dump-sass", "-arch", "sm_90a", args.object], capture_output=True, text=True, env=env
    )
    if sass.returncode != 0:
        print(f"{args.cuobjdump} failed on {args.object}: {sass.stderr.strip()}", file=sys.stderr)
        return 3
    worst, loops = None, 0
    for name, instrs in sorted(functions(sass.stdout).items()):
        body = stage_loop(instrs)
        if body is None:
            continue
        loops += 1
        found = rewrites(body)
        near = min((d for _, _, d in found), default=None)
        print(f"{'none' if near is None else near:>5}  {name}")
        for addr, text, dist in sorted(set(found), key=lambda f: f[2])[:2]:
            print(f"       {addr:#06x} {text}  ({dist} instructions after its HGMMA.SP)")
        if near is not None and (worst is None or near < worst):
            worst = near
    if loops == 0:
        print(f"{args.object}: no stage loop of HGMMA.SP (no sm_90a code of the 2:4 wgmma kernels)")
        return 2
    nearest = "none while a group runs" if worst is None else f"{worst} instructions"
    print(f"nearest rewrite: {nearest} (accepted from {args.min})")
    return 1 if worst is not None and worst < args.min else 0


if __name__ == "__main__":
    sys.exit(main())
