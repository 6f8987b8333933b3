"""Benchmark the Marlin kernels against cuBLAS fp16 and torch's int4 kernel on the H200 (issues 3 and 4).

python3 scripts/bench_kernel.py [--sets 7b,70b] [--m 1,8,16,32,64,128,256] [--reps 200]

Prints the measured copy bandwidth, then per layer and per layer set (times summed over the set's four shapes, as in
DESIGN.md 7): cuBLAS fp16, torch._weight_int4pack_mm, ours (dense), our speedup over cuBLAS, our fraction of the
memory-bound ideal (packed B + scales + A + C bytes over the measured bandwidth), then our 2:4 kernel on the same
shapes and its speedups over our dense kernel and over cuBLAS. Weights are rotated over enough copies that every
launch reads them from HBM rather than the 60 MB L2. Times are medians of CUDA-event timings.

"ours" times launches back to back, so on the H200 each one starts while the previous drains (programmatic
dependent launch; a kernel of a real model gets that only after a kernel that allows it). "alone" is our dense kernel
after a one-element torch kernel that does not allow it, less that kernel's own time: what it costs in isolation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from marlin_cli.kernel import ops  # noqa: E402

SETS = {
    "7b": ((4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)),
    "70b": ((8192, 10240), (8192, 8192), (8192, 57344), (28672, 8192)),
}
GROUP = 128
L2_BYTES = 60 * 2**20
ROTATE_BYTES = 4 * L2_BYTES  # every pass over the copies touches 4x the L2


def time_ms(fn, copies: int, reps: int) -> float:
    """Time of one fn(i) launch, i rotating over the copies: a CUDA graph of >= 32 launches (no host gaps between
    them), replayed `reps` times between CUDA events; the median replay over its launch count."""
    launches = copies * max(1, -(-32 // copies))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (library handles, workspaces) outside the capture
        for i in range(min(copies, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(i % copies)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches)
    del graph
    return statistics.median(times)


Spacer = tuple[torch.Tensor, float]


def make_spacer(reps: int) -> Spacer:
    """A one-element tensor whose add_ (a tiny unrelated kernel) goes before each launch in the "alone" timing, and
    that add's time in ms."""
    x = torch.zeros(1, device="cuda")
    return x, time_ms(lambda i: x.add_(1.0), 1, reps)


def time_alone_ms(fn, copies: int, reps: int, spacer: Spacer) -> float:
    """time_ms of fn(i), each launch after the spacer's add (no early start from the previous launch), the add's
    time subtracted."""
    x, t = spacer
    return time_ms(lambda i: (x.add_(1.0), fn(i)), copies, reps) - t


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 4 GiB device-to-device copy (fp32 elements, 16-byte vector access).

    Timed two ways, best kept: each copy alone between CUDA events (median of 10), and a CUDA graph of 8 copies.
    """
    src = torch.empty(2**30, dtype=torch.float32, device="cuda")
    src.uniform_(-1.0, 1.0)
    dst = torch.empty_like(src)
    moved = 2 * src.numel() * src.element_size()
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    plain = moved / (statistics.median(times) * 1e-3)
    graphed = moved / (time_ms(lambda i, s=src, d=dst: d.copy_(s), 8, 5) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    print(f"copy of 4 GiB, read + write: {plain / 1e12:.2f} TB/s alone, {graphed / 1e12:.2f} TB/s in a graph")
    return max(plain, graphed)


def n_copies(bytes_per_copy: int) -> int:
    return max(2, -(-ROTATE_BYTES // bytes_per_copy))


def dense_copies(k: int, n: int, device: str = "cuda", group: int = GROUP) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rotated copies of a random k x n Marlin weight: (packed codes, fp16 scales of groups of `group` rows; k: per
    channel)."""
    copies = n_copies(k * n // 2 + (k // group) * n * 2)
    return [
        (
            torch.randint(-(2**31), 2**31 - 1, (k // 16, 2 * n), device=device, dtype=torch.int64).int(),
            ((torch.rand(k // group, n, device=device) + 0.5) / 64).half(),
        )
        for _ in range(copies)
    ]


def sparse24_copies(
    k: int, n: int, device: str = "cuda", group: int = GROUP
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Rotated copies of a random k x n 2:4 weight: (kept codes (K/32, 2N) int32, metadata (K/32, 2N) int16, scales
    as in dense_copies); the metadata's values do not change the work."""
    copies = n_copies(k * n * 3 // 8 + (k // group) * n * 2)
    return [
        (
            torch.randint(-(2**31), 2**31 - 1, (k // 32, 2 * n), device=device, dtype=torch.int64).int(),
            torch.full((k // 32, 2 * n), 0x4444, dtype=torch.int16, device=device),
            ((torch.rand(k // group, n, device=device) + 0.5) / 64).half(),
        )
        for _ in range(copies)
    ]


def tinygemm_weights(k: int, n: int) -> tuple[list[torch.Tensor], torch.Tensor] | None:
    """Rotated copies of a weight in torch's tinygemm int4 layout, or None where this torch build lacks it."""
    codes = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.int32)
    packed = None
    for arg in ((codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8), codes):  # newer torch: uint8 (N, K/2)
        try:
            packed = torch._convert_weight_to_int4pack(arg, 8)
            break
        except (RuntimeError, TypeError, AttributeError):
            continue
    if packed is None:
        return None
    scales_zeros = (torch.rand(k // GROUP, n, 2, device="cuda") / 64).bfloat16()
    return [packed.clone() for _ in range(n_copies(k * n // 2))], scales_zeros


def bench_layer(
    k: int, n: int, ms: list[int], reps: int, bw: float, spacer: Spacer, only_ours: bool = False
) -> list[dict]:
    """spacer: make_spacer's, for the "alone" timing."""
    dev = "cuda"
    b_bytes = k * n // 2
    s_bytes = (k // GROUP) * n * 2
    dense = dense_copies(k, n)
    copies_h = n_copies(k * n * 2)
    ws = [] if only_ours else [torch.randn(n, k, device=dev).half() for _ in range(copies_h)]  # Linear weight (N, K)
    tiny = None if only_ours else tinygemm_weights(k, n)
    sparse = [(ops.prepare24(b24, meta), s24) for b24, meta, s24 in sparse24_copies(k, n)]
    rows = []
    for m in ms:
        a = torch.randn(m, k, device=dev).half()
        t_cublas = (
            float("nan") if only_ours else time_ms(lambda i, a=a: torch.nn.functional.linear(a, ws[i]), copies_h, reps)
        )
        t_ours = time_ms(lambda i, a=a: ops.gemm(a, *dense[i]), len(dense), reps)
        t_alone = time_alone_ms(lambda i, a=a: ops.gemm(a, *dense[i]), len(dense), reps, spacer)
        t_24 = time_ms(lambda i, a=a: ops.gemm24(a, *sparse[i]), len(sparse), reps)
        t_tiny = None
        if tiny is not None:
            a16 = a.bfloat16()  # tinygemm's CUDA path takes bf16 activations and scales
            try:
                t_tiny = time_ms(
                    lambda i, a16=a16, t=tiny: torch._weight_int4pack_mm(a16, t[0][i], GROUP, t[1]), len(tiny[0]), reps
                )
            except (RuntimeError, TypeError) as exc:
                print(f"  torch._weight_int4pack_mm: {str(exc).splitlines()[0][:80]}")
                tiny = None
        ideal = (b_bytes + s_bytes + 2 * m * k + 2 * m * n) / bw * 1e3
        rows.append(
            {
                "k": k,
                "n": n,
                "m": m,
                "cublas": t_cublas,
                "tiny": t_tiny,
                "ours": t_ours,
                "alone": t_alone,
                "ideal": ideal,
                "24": t_24,
            }
        )
    return rows


def fmt_us(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms * 1e3:8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="7b,70b")
    parser.add_argument("--m", default="1,8,16,32,64,128,256")
    parser.add_argument("--reps", type=int, default=15, help="graph replays per measurement")
    parser.add_argument("--bandwidth", type=float, default=0.0, help="TB/s to use instead of measuring it")
    parser.add_argument("--only-ours", action="store_true", help="skip cuBLAS and torch's int4 kernel")
    args = parser.parse_args()
    ms = [int(x) for x in args.m.split(",")]
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}, CUDA {torch.version.cuda}")
    bw = args.bandwidth * 1e12 if args.bandwidth else copy_bandwidth()
    print(f"copy bandwidth (read + write): {bw / 1e12:.2f} TB/s")
    ops.gemm(
        torch.randn(1, 128, device="cuda").half(),
        torch.zeros(8, 128, dtype=torch.int32, device="cuda"),
        torch.ones(1, 64, dtype=torch.float16, device="cuda"),
    )  # build and load before timing
    spacer = make_spacer(args.reps)
    header = (
        f"{'set':>5} {'K':>6} {'N':>6} {'M':>4} {'cuBLAS us':>9} {'int4mm us':>9} {'ours us':>8} {'alone us':>8} "
        f"{'ideal us':>8} {'speedup':>7} {'%ideal':>6} {'2:4 us':>8} {'/dense':>6} {'/cuBLAS':>7}"
    )
    summary = []
    for name in args.sets.split(","):
        rows = []
        for k, n in SETS[name]:
            rows += bench_layer(k, n, ms, args.reps, bw, spacer, args.only_ours)
        print(header)
        for r in rows:
            print(
                f"{name:>5} {r['k']:>6} {r['n']:>6} {r['m']:>4} {fmt_us(r['cublas']):>9} {fmt_us(r['tiny']):>9} "
                f"{fmt_us(r['ours']):>8} {fmt_us(r['alone']):>8} {fmt_us(r['ideal']):>8} "
                f"{r['cublas'] / r['ours']:>6.2f}x "
                f"{100 * r['ideal'] / r['ours']:>5.0f}% {fmt_us(r['24'])} {r['ours'] / r['24']:>5.2f}x "
                f"{r['cublas'] / r['24']:>6.2f}x",
                flush=True,
            )
        for m in ms:
            sel = [r for r in rows if r["m"] == m]
            tot = {key: sum(r[key] for r in sel) for key in ("cublas", "ours", "alone", "ideal", "24")}
            tiny = None if any(r["tiny"] is None for r in sel) else sum(r["tiny"] for r in sel)
            summary.append((name, m, tot, tiny))
    print("\nsums over each set's four layers (us), as in DESIGN.md 7")
    print(
        f"{'set':>5} {'M':>4} {'cuBLAS':>8} {'int4mm':>8} {'ours':>8} {'alone':>8} {'ideal':>8} {'speedup':>7} "
        f"{'%ideal':>6} "
        f"{'2:4':>8} {'/dense':>6} {'/cuBLAS':>7}"
    )
    for name, m, tot, tiny in summary:
        print(
            f"{name:>5} {m:>4} {fmt_us(tot['cublas'])} {fmt_us(tiny)} {fmt_us(tot['ours'])} {fmt_us(tot['alone'])} "
            f"{fmt_us(tot['ideal'])} "
            f"{tot['cublas'] / tot['ours']:>6.2f}x {100 * tot['ideal'] / tot['ours']:>5.0f}% {fmt_us(tot['24'])} "
            f"{tot['ours'] / tot['24']:>5.2f}x {tot['cublas'] / tot['24']:>6.2f}x"
        )


if __name__ == "__main__":
    main()
