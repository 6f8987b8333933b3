"""End to end on a GPU: build a Llama-architecture model with random fp16 weights (2048 wide, 4 blocks), quantize it
with the CLI (blocks on the GPU) as dense and as 2:4, verify every layer through the CUDA kernels and run
--model-check.

Run on a GPU machine: python3 scripts/gpu_e2e.py TOKENIZER_DIR WORK_DIR [BLOCKS]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


def marlin(*args: str) -> tuple[float, dict]:
    start = time.perf_counter()
    cli = [sys.executable, "-c", "from marlin_cli.cli.app import main; main()"]  # this interpreter, with its torch
    done = subprocess.run([*cli, *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"marlin {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return time.perf_counter() - start, json.loads(done.stdout)


def main(tokenizer_dir: Path, work: Path, blocks: int) -> None:
    config = LlamaConfig(
        vocab_size=30522,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=blocks,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).half().save_pretrained(work / "model")
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(work / "model")
    recipes = {"default": [], "group-clip": ["--act-order", "group", "--clip"], "sparse24": ["--sparse24"]}
    for name, flags in recipes.items():
        out = work / name
        seconds, report = marlin("quantize", str(work / "model"), str(out), *flags)
        s = report["summary"]
        print(
            f"quantize {name}: {seconds:.1f} s wall ({s['seconds']} s in the pipeline), {s['quantized']} layers, "
            f"error {s['error_vs_rtn']:.3f}x RTN on the calibration data, device {report['device']}"
        )
        seconds, checks = marlin("verify", str(out), "--model-check")
        kernels = {layer["kernel"] for layer in checks["layers"]}
        worst = max(layer["error"] for layer in checks["layers"])
        print(
            f"verify {name}: passed={checks['passed']} kernels={kernels} worst rel. error {worst:.2e} "
            f"model check {checks['model_check']} ({seconds:.1f} s)"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4)
