"""Time GPTQ on the GPU on Llama-sized layers: Hessian accumulation over 262,144 tokens, then the solve (plain and
with --clip), in one process. Prints a table next to the reference figures of DESIGN.md section 7.

Run on a GPU machine: python3 scripts/bench_gptq.py
"""

from __future__ import annotations

import time

import torch

from marlin_cli.algo.gptq import gptq
from marlin_cli.algo.hessian import Hessian
from marlin_cli.config import QuantConfig

TOKENS = 262_144
CHUNK = 8192  # tokens per Hessian update, as the pipeline feeds one sample of 8192 tokens or several smaller ones
# (K, N): in_features, out_features; reference seconds (Hessian, solve, solve with clipping) from DESIGN.md 7
SHAPES = {
    (4096, 4096): (0.2, 1.0, 2.0),
    (4096, 11008): (0.2, 1.0, 2.9),
    (11008, 4096): (1.3, 2.7, 5.0),
    (28672, 8192): (8.4, 7.9, 16.6),
}


def timed(fn) -> tuple[float, object]:  # noqa: ANN001
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def bench_shape(k: int, n: int, dev: torch.device) -> tuple[float, float, float]:
    """Seconds for the Hessian over TOKENS tokens, the solve, and the solve with clipping."""
    gen = torch.Generator(device=dev).manual_seed(0)
    mix = torch.randn(k, 64, device=dev, generator=gen) / 8  # correlated channels, like real activations
    x = torch.randn(CHUNK, k, device=dev, generator=gen) + torch.randn(CHUNK, 64, device=dev, generator=gen) @ mix.T
    x = x.half()
    w = torch.randn(n, k, device=dev, generator=gen) * 0.02
    h = Hessian(k, dev)
    t_h, _ = timed(lambda: [h.add(x) for _ in range(TOKENS // CHUNK)])
    t_s, _ = timed(lambda: gptq(w, h.matrix, QuantConfig()))
    t_c, _ = timed(lambda: gptq(w, h.matrix, QuantConfig(clip=True)))
    return t_h, t_s, t_c


def main() -> None:
    dev = torch.device("cuda")
    bench_shape(1024, 1024, dev)  # warm-up: CUDA context, cuSOLVER handles
    print(f"{'K x N':>14} {'hessian s':>10} {'ref':>5} {'solve s':>8} {'ref':>5} {'clip s':>7} {'ref':>5}")
    for (k, n), (ref_h, ref_s, ref_c) in SHAPES.items():
        t_h, t_s, t_c = bench_shape(k, n, dev)
        print(f"{k:>6} x {n:<6} {t_h:10.2f} {ref_h:5.1f} {t_s:8.2f} {ref_s:5.1f} {t_c:7.2f} {ref_c:5.1f}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
