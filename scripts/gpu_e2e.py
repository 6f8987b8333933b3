"""End to end on a GPU: build a Llama-architecture model with random fp16 weights, quantize it with the CLI (blocks
on the GPU) as dense and as 2:4, verify every layer through the CUDA kernels and run --model-check. Prints each
run's wall time, the pipeline's time per block in the layer solves, the peak memory against `--dry-run`'s estimate.
With --conversions, also times `marlin pack` of a GPTQ export and of a dense Marlin checkpoint (both RTN) with
--device cpu and cuda, and says whether both wrote the same shards.

Shapes: `small` (2048 wide, 5632 FFN, default 4 blocks) or `llama-70b` (Llama-3-70B's blocks: 8192 wide, 28672
FFN, 64 heads, 8 KV heads; 2 blocks are about 3.5 GB of fp16 weights).

Run on a GPU machine: python3 scripts/gpu_e2e.py TOKENIZER_DIR WORK_DIR [--shape S] [--blocks N] [--recipes R,...]
[--conversions]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

SHAPES = {
    "small": {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4},
    "llama-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8},
}
RECIPES = {
    "default": [],
    "no-clip": ["--no-clip"],
    "group-clip": ["--act-order", "group", "--clip"],
    "sparse24": ["--sparse24"],
}
CONVERSIONS = {  # name: (source: the model quantized by RTN to this format, pack flags)
    "gptq, exact": ("gptq", []),
    "gptq, --requantize --group-size 64 --clip": ("gptq", ["--requantize", "--group-size", "64", "--clip"]),
    "marlin, --sparse24": ("marlin", ["--sparse24"]),
    "marlin, --sparse24 --clip": ("marlin", ["--sparse24", "--clip"]),
}


def marlin(*args: str) -> tuple[float, dict]:
    start = time.perf_counter()
    cli = [sys.executable, "-c", "from marlin_cli.cli.app import main; main()"]  # this interpreter, with its torch
    done = subprocess.run([*cli, *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"marlin {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - start, json.loads(done.stdout)


def conversions(work: Path) -> None:
    for fmt in dict.fromkeys(source for source, _ in CONVERSIONS.values()):
        marlin("quantize", str(work / "model"), str(work / f"rtn-{fmt}"), "--method", "rtn", "--format", fmt)
    for name, (source, flags) in CONVERSIONS.items():
        seconds, errors, shards = {}, {}, {}
        for device in ("cpu", "cuda"):
            out = work / f"pack-{device}"
            args = ("pack", str(work / f"rtn-{source}"), str(out), *flags, "--device", device, "--force")
            seconds[device], report = marlin(*args)
            errors[device] = report["summary"]["error_sum"]
            shards[device] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("*.safetensors")}
        print(
            f"pack {name}: {seconds['cpu']:.1f} s on the CPU ({torch.get_num_threads()} threads), "
            f"{seconds['cuda']:.1f} s on the GPU (wall); added error {errors['cpu']:.6g} / {errors['cuda']:.6g}; "
            f"the same shards: {shards['cpu'] == shards['cuda']}"
        )


def main(tokenizer_dir: Path, work: Path, shape: str, blocks: int, recipes: list[str], convert: bool) -> None:
    config = LlamaConfig(vocab_size=30522, num_hidden_layers=blocks, max_position_embeddings=4096, **SHAPES[shape])
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.device("cuda"):  # initialising billions of weights on the CPU takes minutes
        model = LlamaForCausalLM(config).half()
    model.save_pretrained(work / "model")
    del model
    torch.cuda.empty_cache()
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(work / "model")
    print(f"model: {shape}, {blocks} blocks, built and saved in {time.perf_counter() - start:.1f} s")
    for name in recipes:
        flags = RECIPES[name]
        _, plan = marlin("quantize", str(work / "model"), str(work / name), *flags, "--dry-run")
        seconds, report = marlin("quantize", str(work / "model"), str(work / name), *flags)
        s = report["summary"]
        solves = sum(layer["seconds"] or 0 for layer in report["layers"]) / blocks
        print(
            f"quantize {name}: {seconds:.1f} s wall ({s['seconds']} s in the pipeline, {solves:.2f} s per block in "
            f"the layer solves and their reports), {s['quantized']} layers, error {s['error_vs_rtn']:.3f}x RTN on "
            f"the calibration data; peak GPU {s['peak_gpu_gib']} GiB (estimate {plan['estimated_peak_gpu_gib']}), "
            f"host {s['peak_host_gib']} GiB (estimate {plan['estimated_peak_host_gib']}); device {report['device']}"
        )
        seconds, checks = marlin("verify", str(work / name), "--model-check")
        kernels = {layer["kernel"] for layer in checks["layers"]}
        worst = max(layer["error"] for layer in checks["layers"])
        print(
            f"verify {name}: passed={checks['passed']} kernels={kernels} worst rel. error {worst:.2e} "
            f"model check {checks['model_check']} ({seconds:.1f} s)"
        )
    if convert:
        conversions(work)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer_dir", type=Path)
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--blocks", type=int, default=None, help="default: 4 (small), 2 (llama-70b)")
    parser.add_argument(
        "--recipes", default=",".join(RECIPES), help=f"comma-separated, of {', '.join(RECIPES)} (or empty)"
    )
    parser.add_argument("--conversions", action="store_true", help="time marlin pack on the CPU and the GPU too")
    a = parser.parse_args()
    names = [n for n in a.recipes.split(",") if n]
    if unknown := set(names) - set(RECIPES):
        parser.error(f"unknown recipes {sorted(unknown)}")
    main(a.tokenizer_dir, a.work_dir, a.shape, a.blocks or (4 if a.shape == "small" else 2), names, a.conversions)
