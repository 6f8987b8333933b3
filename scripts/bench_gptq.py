"""Time GPTQ on the GPU on Llama-sized layers: Hessian accumulation over 262,144 tokens (from float32 inputs and from
fp16 ones), then the solve (plain, with --clip, and SparseGPT's 2:4 solve), its column loop in torch and on the CUDA
kernel (kernels/gptq.cu), and `--clip --act-order group` on the kernel (its search runs the loop on every candidate
scale of every group), in one process. Prints a table next to the reference figures of DESIGN.md section 7, and
how many codes the two loops give alike.

Run on a GPU machine: python3 scripts/bench_gptq.py
"""

from __future__ import annotations

import time

import torch

from marlin_cli.algo.gptq import gptq
from marlin_cli.algo.hessian import Hessian, weighted_error
from marlin_cli.algo.rtn import rtn
from marlin_cli.algo.sparsegpt import sparsegpt
from marlin_cli.config import QuantConfig
from marlin_cli.kernel import ops

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


def bench_shape(k: int, n: int, dev: torch.device) -> list[float]:
    """Seconds for the Hessian over TOKENS tokens (from float32, then from fp16 inputs), then the solve, the solve
    with clipping and SparseGPT's solve, each on the torch loop and on the kernel, the solve with clipping and
    act-order group on the kernel, then the report's two
    Hessian-weighted products (the weights' own and RTN's error, in TF32; GPTQ's comes with its solve); then how far
    the reported RTN error is from its float64 value (relative); last, the fraction of codes both loops give alike
    (default settings)."""
    gen = torch.Generator(device=dev).manual_seed(0)
    mix = torch.randn(k, 64, device=dev, generator=gen) / 8  # correlated channels, like real activations
    x = torch.randn(CHUNK, k, device=dev, generator=gen) + torch.randn(CHUNK, 64, device=dev, generator=gen) @ mix.T
    x = x.half()
    w = torch.randn(n, k, device=dev, generator=gen) * 0.02
    times = []
    for inputs in (x.float(), x):  # float32 inputs (a float32 model), then fp16 ones as the pipeline feeds them
        h = Hessian(k, dev)
        times.append(timed(lambda inputs=inputs, h=h: [h.add(inputs) for _ in range(TOKENS // CHUNK)])[0])
    results = []
    for cfg in (QuantConfig(), QuantConfig(clip=True)):
        for kernels in (None, ops.KERNELS):
            t, r = timed(lambda cfg=cfg, kernels=kernels: gptq(w, h.matrix, cfg, kernels=kernels))
            times.append(t)
            results.append(r)
    group_clip = QuantConfig(clip=True, act_order="group")
    times.append(timed(lambda: gptq(w, h.matrix, group_clip, kernels=ops.KERNELS))[0])
    for kernels in (None, ops.KERNELS):  # SparseGPT: 2:4 pruning in the same loop
        times.append(timed(lambda kernels=kernels: sparsegpt(w, h.matrix, QuantConfig(sparse24=True), kernels))[0])
    deltas = (w, w - rtn(w, 128).weight())  # the report's products, as in the pipeline
    t, (total, rtn_err) = timed(lambda: [weighted_error(d, h.matrix, tf32=True) for d in deltas])
    times.append(t)
    exact = [weighted_error(d.double(), h.matrix.double()) for d in deltas]
    off = abs(rtn_err / total / (exact[1] / exact[0]) - 1)  # the reported RTN error's, against float64
    return [*times, off, (results[0].codes == results[1].codes).float().mean().item()]


def main() -> None:
    dev = torch.device("cuda")
    bench_shape(1024, 1024, dev)  # warm-up: CUDA context, cuSOLVER handles, the kernels' build
    head = ("H fp32 in", "fp16 in", "ref", "solve torch", "kernel", "ref", "clip torch", "kernel", "ref", "clip+group")
    head += ("2:4 torch", "kernel", "report")
    print(f"{'K x N':>14} " + " ".join(f"{h:>11}" for h in head) + f" {'report off':>11} {'same codes':>11}")
    for (k, n), (ref_h, ref_s, ref_c) in SHAPES.items():
        t_h32, t_h, t_s, t_sk, t_c, t_ck, t_g, t_p, t_pk, t_r, off, same = bench_shape(k, n, dev)
        row = (t_h32, t_h, ref_h, t_s, t_sk, ref_s, t_c, t_ck, ref_c, t_g, t_p, t_pk, t_r)
        print(f"{k:>6} x {n:<6} " + " ".join(f"{v:11.3f}" for v in row) + f" {off:11.1e} {same:11.4%}")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
