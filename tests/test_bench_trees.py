"""scripts/bench_trees.py on bench output written here in scripts/bench_kernel.py's --only-ours format: per-layer rows
and the sums table parse to (dense, 2:4) times, medians are taken per key over rounds, and the report sets later
trees' 2:4 times against the first tree's."""

from __future__ import annotations

from bench_trees import medians, parse_bench, report

HEAD = "  set      K      N    M cuBLAS us int4mm us  ours us alone us ideal us speedup %ideal   2:4 us /dense /cuBLAS"


def bench_output(dense: float, sparse: float) -> str:
    """One run over one 7B layer at M = 1 and 16 (the layer's times are the set's sums: one layer)."""
    rows = [
        f"   7b   4096  12288 {m:>4}       nan       n/a {dense + m:8.1f} {dense + m + 2:8.1f}      5.0"
        f"   nanx    60% {sparse + m:8.1f}  1.20x   nanx"
        for m in (1, 16)
    ]
    sums = [
        f"   7b {m:>4}      nan      n/a {dense + m:8.1f} {dense + m + 2:8.1f}      5.0   nanx    60%"
        f" {sparse + m:8.1f}  1.20x   nanx"
        for m in (1, 16)
    ]
    return "\n".join(
        [
            "NVIDIA H200, 132 SMs, torch 2.11.0, CUDA 12.8",
            "copy bandwidth (read + write): 4.26 TB/s",
            HEAD,
            *rows,
            "",
            "sums over each set's four layers (us), as in DESIGN.md 7",
            "  set    M   cuBLAS ...",
            *sums,
        ]
    )


def test_parse_bench_reads_layers_and_sums() -> None:
    parsed = parse_bench(bench_output(8.0, 6.5))
    assert parsed["layers"] == {("7b", 4096, 12288, 1): (9.0, 7.5), ("7b", 4096, 12288, 16): (24.0, 22.5)}
    assert parsed["sums"] == {("7b", 1): (9.0, 7.5), ("7b", 16): (24.0, 22.5)}


def test_medians_and_report_compare_each_tree_with_the_first() -> None:
    runs = {
        "a": [parse_bench(bench_output(8.0, s)) for s in (6.0, 7.0, 6.5)],
        "b": [parse_bench(bench_output(8.0, s)) for s in (5.0, 9.0, 5.5)],
    }
    assert medians([r["sums"] for r in runs["b"]])[("7b", 1)] == (9.0, 6.5)
    text = report(["a", "b"], runs)
    assert "9.0 / 7.5" in text and "9.0 / 6.5 -13.3%" in text  # M = 1: 2:4 7.5 in tree a, 6.5 in tree b
    assert "4096 x 12288" in text and "22.5" in text and "21.5 -4.4%" in text  # the layer at M = 16
