"""MiniLM quantized by llm-compressor's default GPTQ recipe and by ours, on the same calibration samples, measured
with the same held-out metric (tests/minilm_eval.py): issue 2's default figures side by side.

llm-compressor pins its own transformers, so run this in a separate environment that has it (and datasets):
python3 scripts/compare_peer.py [--recipes default,no-clip,clip+group]

Its recipe: `GPTQModifier(targets="Linear", scheme="W4A16", ignore=["pooler.dense"])` (4-bit symmetric, group 128,
static act-order, damping 0.01, no clipping search), one-shot on our 128 calibration paragraphs of at most 256 tokens
(what `marlin quantize minilm` samples with seed 0). Its weights come back fake-quantized on the same grid as ours
(scale absmax / 7.5, codes -8..7), so both are scored on the dequantized weights. RTN is `marlin pack minilm`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from minilm_eval import Reference  # noqa: E402
from transformers import AutoTokenizer, BertModel  # noqa: E402

from marlin_cli.calib.data import load_texts, token_samples  # noqa: E402
from marlin_cli.cli.app import app  # noqa: E402
from marlin_cli.model.load import resolve  # noqa: E402

OURS = {"default": [], "no-clip": ["--no-clip"], "clip+group": ["--act-order", "group"]}
NSAMPLES, SEQLEN = 128, 256  # quantize's defaults for this model (--seqlen capped by its max_seq_length)


def marlin(*args: str) -> float:
    """Run the CLI in this process; its wall time."""
    from typer.testing import CliRunner

    started = time.perf_counter()
    result = CliRunner().invoke(app, list(args))
    if result.exit_code != 0:
        sys.exit(f"marlin {' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return time.perf_counter() - started


def peer_weights(names: list[str]) -> tuple[dict[str, torch.Tensor], float]:
    """llm-compressor's default GPTQ on our calibration samples: the fake-quantized weights, and its wall time."""
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.gptq import GPTQModifier

    path = resolve("minilm")
    samples = token_samples(load_texts("embedded", by_paragraph=True), AutoTokenizer.from_pretrained(path),
                            NSAMPLES, SEQLEN, seed=0)  # fmt: skip
    ids = [s[0].tolist() for s in samples]
    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(i) for i in ids]})
    model = BertModel.from_pretrained(path).eval()
    recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["pooler.dense"])
    started = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe, num_calibration_samples=NSAMPLES, max_seq_length=SEQLEN)
    seconds = time.perf_counter() - started
    return {n: model.get_submodule(n).weight.detach().float().clone() for n in names}, seconds


def main(recipes: list[str]) -> None:
    reference = Reference()
    rows: list[tuple[str, dict, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        marlin("pack", "minilm", f"{tmp}/rtn")
        rows.append(("RTN (marlin pack)", reference.evaluate(Path(tmp, "rtn")), None))
        for recipe in recipes:
            seconds = marlin("quantize", "minilm", f"{tmp}/{recipe}", *OURS[recipe])
            label = f"marlin quantize {' '.join(OURS[recipe]) or '(default)'}"
            rows.append((label, reference.evaluate(Path(tmp, recipe)), seconds))
    weights, seconds = peer_weights(list(rows[0][1]["errors"]))
    rows.append(("llm-compressor default (W4A16, static)", reference.score(weights), seconds))
    rtn = sum(rows[0][1]["errors"].values())
    print(f"\nMiniLM, 4-bit g128, {len(reference.texts)} held-out paragraphs\n")
    print("| recipe | error vs RTN | embedding cosine | wall time (s) |\n| --- | --- | --- | --- |")
    for label, got, s in rows:
        error = sum(got["errors"].values()) / rtn
        print(f"| {label} | {error:.4f} | {got['cosine']:.4f} | {'' if s is None else f'{s:.1f}'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(OURS), help=f"ours to run, of {', '.join(OURS)}")
    args = parser.parse_args()
    unknown = set(args.recipes.split(",")) - set(OURS)
    if unknown:
        parser.error(f"unknown recipes {sorted(unknown)}; choose from {', '.join(OURS)}")
    main(args.recipes.split(","))
