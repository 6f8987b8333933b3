"""A/B of kernel variants in one process on the GPU: the current kernels against copies of `kernels/` with changes.

python3 scripts/ab_kernels.py DIR [DIR ...] [--m 9,16] [--sets 7b,70b] [--shapes 5120x13824,...] [--kind dense|24|both]
    [--group 128] [--alone]

Each DIR holds a full copy of the kernel sources (`kernels/*.cu *.cuh *.h bindings.cpp`) with the change under test.
Its sources are copied into the build cache with the op namespace renamed (marlin_cli -> marlin_cli_<DIR name>), all
variants are compiled in parallel for the GPU present, and every layer shape is timed for each build in one process:
the bench's timing (CUDA graphs over rotated weight copies, scripts/bench_kernel.py), rounds in alternating order,
since a layer's time drifts within a process with what ran before it. Outputs are checked against the current
kernels first (relative error above 5e-3 is reported: a variant that changes the summation order differs by ~1e-4).
Every build gets a workspace of its own, zeroed as ops.workspace makes it, so a variant may keep other contents there.
Prints the mean of the rounds per layer and summed per layer set, in microseconds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_kernel import SETS, dense_copies, make_spacer, sparse24_copies, time_alone_ms, time_ms  # noqa: E402

from marlin_cli.formats import marlin24  # noqa: E402
from marlin_cli.kernel import build, ops  # noqa: E402


def _library(name: str) -> Path:
    return build.cache_dir() / "ab" / name / f"marlin_ab_{name}.so"


def _build(args: tuple[str, str]) -> str:
    """Compile variant `name` from `src` (a copy of kernels/) with its op namespace renamed; returns the name."""
    src, name = args
    from torch.utils import cpp_extension

    work = _library(name).parent
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    for f in Path(src).iterdir():
        if f.suffix in (".cu", ".cuh", ".h", ".cpp"):
            (work / f.name).write_text(f.read_text().replace("marlin_cli", f"marlin_cli_{name}"))
    arches = build.arch_list()
    os.environ["TORCH_CUDA_ARCH_LIST"] = arches  # this process's own: cpp_extension turns it into -gencode flags
    cpp_extension.load(
        name=f"marlin_ab_{name}",
        sources=[str(work / s) for s in build.SOURCES],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=build.cuda_flags(arches),
        extra_include_paths=[str(work)],
        build_directory=str(work),
        is_python_module=False,
    )
    return name


def load_builds(dirs: list[Path]) -> dict[str, object]:
    """The current kernels and each variant directory's, compiled in parallel and loaded, by name ("current" first)."""
    names = [d.resolve().name for d in dirs]
    if len(set(names)) != len(names) or not all(n.isidentifier() for n in names):
        sys.exit("variant directories need distinct names that are identifiers (they name the op namespaces)")
    build.build_kernels()  # the current kernels, namespace marlin_cli
    with multiprocessing.get_context("spawn").Pool(len(names)) as pool:
        for name in pool.imap_unordered(_build, [(str(d), n) for d, n in zip(dirs, names)]):
            print(f"built {name}", flush=True)
    for name in names:
        torch.ops.load_library(str(_library(name)))
    return {"current": torch.ops.marlin_cli, **{n: getattr(torch.ops, f"marlin_cli_{n}") for n in names}}


def kernel_order24(ops_ns: object) -> bool:
    """Whether a build's 2:4 kernel reads its weights in formats.marlin24's kernel order on this GPU (builds from
    before that order have no gemm24_kernel_order and read them as stored; builds of perf-log mc1 and mc2 read 3-bit
    metadata in that order, which this tree does not write: compare those with scripts/bench_trees.py)."""
    order = getattr(ops_ns, "gemm24_kernel_order", None)
    return order is not None and bool(order(torch.cuda.current_device()))


def in_order(copies: list, kernel_order: bool) -> list:
    """2:4 weight copies (codes, metadata, scales; stored order) in the order a build reads."""
    return [(*marlin24.to_kernel_order(b, m), s) for b, m, s in copies] if kernel_order else copies


def launch(ops_ns: object, kind: str, a: torch.Tensor, weights: tuple, ws: torch.Tensor) -> torch.Tensor:
    """One product through a build's ops (torch.ops.marlin_cli or a variant's namespace)."""
    return ops_ns.gemm(a, *weights, None, ws) if kind == "dense" else ops_ns.gemm24(a, *weights, ws)


def launcher(ops_ns: object, kind: str, a: torch.Tensor, copies: list, ws: torch.Tensor) -> Callable[[int], object]:
    """fn(i): the product with weight copy i, for time_ms."""
    return lambda i: launch(ops_ns, kind, a, copies[i], ws)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="copies of kernels/ with the change under test")
    parser.add_argument("--m", default="9,16")
    parser.add_argument("--sets", default="7b,70b")
    parser.add_argument("--shapes", default="", help="more layers as KxN,KxN (an extra set 'more')")
    parser.add_argument("--kind", choices=("dense", "24", "both"), default="both")
    parser.add_argument("--group", type=int, default=128, help="rows per scale group; -1: per channel")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15, help="graph replays per measurement")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="each launch after a tiny unrelated kernel (no early start from the previous product; its time "
        "subtracted), as the bench's 'alone' column",
    )
    args = parser.parse_args()
    builds = load_builds(args.dirs)
    names = list(builds)[1:]

    sets = {s: SETS[s] for s in args.sets.split(",") if s}
    if args.shapes:
        sets["more"] = tuple(tuple(int(v) for v in kn.split("x")) for kn in args.shapes.split(","))
    ms = [int(m) for m in args.m.split(",")]
    kinds = ["dense", "24"] if args.kind == "both" else [args.kind]
    torch.manual_seed(0)
    current_ws = ops.workspace(torch.device("cuda"))
    ws = {name: current_ws if name == "current" else torch.zeros_like(current_ws) for name in builds}
    spacer = make_spacer(args.reps) if args.alone else None
    times: dict[tuple, list[float]] = {}
    orders = {name: kernel_order24(ns) for name, ns in builds.items()}
    for set_name, shapes in sets.items():
        for k, n in shapes:
            group = k if args.group == -1 else args.group
            # rotated copies: dense (codes, scales), 2:4 (kept codes, metadata, scales) in each order a build reads
            stored24 = sparse24_copies(k, n, group=group) if "24" in kinds else []
            by_order = {order: in_order(stored24, order) for order in set(orders.values())}
            dense = dense_copies(k, n, group=group) if "dense" in kinds else []
            weights = {
                (kind, name): dense if kind == "dense" else by_order[orders[name]] for kind in kinds for name in builds
            }
            del stored24
            for m in ms:
                a = torch.randn(m, k, device="cuda").half()
                for kind in kinds:
                    copies = weights[kind, "current"]
                    ref = launch(builds["current"], kind, a, copies[0], ws["current"]).float()
                    for name in names:
                        out = launch(builds[name], kind, a, weights[kind, name][0], ws[name]).float()
                        err = ((out - ref).abs().max() / ref.abs().max()).item()
                        if err > 5e-3:
                            print(f"{name} differs from the current kernels: {kind} {k}x{n} m={m}, {err:.2e}")
                    order = list(builds)
                    for r in range(args.rounds):
                        for name in order if r % 2 == 0 else order[::-1]:
                            fn = launcher(builds[name], kind, a, weights[kind, name], ws[name])
                            t = (
                                time_ms(fn, len(copies), args.reps)
                                if spacer is None
                                else time_alone_ms(fn, len(copies), args.reps, spacer)
                            )
                            times.setdefault((kind, set_name, k, n, m, name), []).append(t * 1e3)
            del weights, by_order, dense
            torch.cuda.empty_cache()

    def mean(key: tuple) -> float:
        return sum(times[key]) / len(times[key])

    for kind in kinds:
        alone = ", each launch alone" if args.alone else ""
        print(f"\n{kind}: us, mean of {args.rounds} rounds in alternating order{alone}")
        print(f"{'set':>6} {'K':>6} {'N':>6} {'M':>5} " + " ".join(f"{b:>10}" for b in builds))
        for set_name, shapes in sets.items():
            for m in ms:
                for k, n in shapes:
                    row = " ".join(f"{mean((kind, set_name, k, n, m, b)):10.1f}" for b in builds)
                    print(f"{set_name:>6} {k:>6} {n:>6} {m:>5} {row}")
                sums = " ".join(f"{sum(mean((kind, set_name, k, n, m, b)) for k, n in shapes):10.1f}" for b in builds)
                print(f"{set_name:>6} {'sum':>6} {'':>6} {m:>5} {sums}")


if __name__ == "__main__":
    main()
