"""`marlin pack` on the CPU: each conversion's time for one or more checkouts of marlin, side by side.

python3 scripts/bench_pack.py WORK_DIR [TREE ...] [--shape llama-8b|small] [--blocks 1] [--rounds 3]

Builds a Llama-architecture model with random fp16 weights (by default one block of Llama-3-8B's shape, with the
MiniLM tokenizer's 30522-token embeddings) and its RTN exports (GPTQ, compressed-tensors, dense Marlin) with the first
TREE, then runs every conversion once per TREE per round, the trees alternating, and prints the pipeline's seconds
(the report's summary.seconds: start-up and imports left out), min and mean over the rounds. Each TREE is a checkout
of marlin (default: this one); the script says whether each later TREE wrote the first one's shards byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "llama-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8},
    "small": {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 4},
}
SOURCES = {"gptq": ["--format", "gptq"], "compressed-tensors": ["--format", "compressed-tensors"], "marlin": []}
CASES = {  # name: (source directory, pack flags)
    "dense -> marlin": ("model", []),
    "dense -> gptq": ("model", ["--format", "gptq"]),
    "dense -> 2:4": ("model", ["--sparse24"]),
    "gptq -> marlin, exact": ("gptq", []),
    "compressed-tensors -> marlin, exact": ("compressed-tensors", []),
    "gptq -> compressed-tensors, exact": ("gptq", ["--format", "compressed-tensors"]),
    "gptq -> marlin, --requantize --clip": ("gptq", ["--requantize", "--clip"]),
    "marlin -> 2:4": ("marlin", ["--sparse24"]),
}


def marlin(tree: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cli = [sys.executable, "-c", "from marlin_cli.cli.app import main; main()", *args, "--json"]
    done = subprocess.run(cli, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{tree}: marlin {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def build(work: Path, tree: Path, shape: str, blocks: int) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(ROOT))
    from marlin_cli.model.load import resolve

    config = LlamaConfig(vocab_size=30522, num_hidden_layers=blocks, **SHAPES[shape])
    torch.manual_seed(0)
    LlamaForCausalLM(config).half().save_pretrained(work / "model")
    AutoTokenizer.from_pretrained(resolve("minilm")).save_pretrained(work / "model")
    for name, flags in SOURCES.items():
        marlin(tree, "pack", str(work / "model"), str(work / name), *flags, "--device", "cpu", "--force")


def main(work: Path, trees: list[Path], shape: str, blocks: int, rounds: int) -> None:
    if not (work / "model").is_dir():
        build(work, trees[0], shape, blocks)
    seconds: dict[tuple[str, Path], list[float]] = {}
    shards: dict[tuple[str, Path], dict[str, str]] = {}
    for _ in range(rounds):
        for name, (source, flags) in CASES.items():
            for tree in trees:
                out = work / "out"
                report = marlin(tree, "pack", str(work / source), str(out), *flags, "--device", "cpu", "--force")
                seconds.setdefault((name, tree), []).append(report["summary"]["seconds"])
                digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.glob("*.safetensors")}
                shards.setdefault((name, tree), digests)
    print(f"marlin pack --device cpu, {shape} x {blocks} block(s), {rounds} rounds, {os.cpu_count()} CPUs")
    print("| conversion | " + " | ".join(f"{t.name} min / mean (s)" for t in trees) + " | same shards |")
    print("| --- |" + " --- |" * (len(trees) + 1))
    for name in CASES:
        times = [seconds[name, t] for t in trees]
        same = all(shards[name, t] == shards[name, trees[0]] for t in trees[1:])
        cells = " | ".join(f"{min(s):.2f} / {sum(s) / len(s):.2f}" for s in times)
        print(f"| {name} | {cells} | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("trees", type=Path, nargs="*", help="checkouts of marlin (default: this one)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    a = parser.parse_args()
    a.work_dir.mkdir(parents=True, exist_ok=True)
    main(a.work_dir, [t.resolve() for t in a.trees] or [ROOT], a.shape, a.blocks, a.rounds)
