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

from marlin_cli.algo.hessian import weighted_error  # noqa: E402
from marlin_cli.calib.data import load_texts, token_samples  # noqa: E402
from marlin_cli.cli.app import app  # noqa: E402
from marlin_cli.model.load import resolve  # noqa: E402
from marlin_cli.nn import MarlinLinear, load_quantized  # noqa: E402

OURS = {"default": [], "no-clip": ["--no-clip"], "clip+group": ["--act-order", "group"]}
NSAMPLES, SEQLEN = 128, 256  # quantize's defaults for this model (--seqlen capped by its max_seq_length)

Weights = dict[str, torch.Tensor]


def marlin(*args: str) -> float:
    """Run the CLI in this process; its wall time."""
    from typer.testing import CliRunner

    started = time.perf_counter()
    result = CliRunner().invoke(app, list(args))
    if result.exit_code != 0:
        sys.exit(f"marlin {' '.join(args)} exited {result.exit_code}: {result.output[-2000:]}")
    return time.perf_counter() - started


def checkpoint_weights(path: Path) -> Weights:
    model = load_quantized(path)
    return {n: m.dequantized_weight() for n, m in model.named_modules() if isinstance(m, MarlinLinear)}


def peer_weights(names: list[str]) -> tuple[Weights, float]:
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


def score(reference: Reference, weights: Weights) -> tuple[float, float]:
    """Summed held-out error and mean embedding cosine of `weights` put into the original model."""
    model = BertModel.from_pretrained(resolve("minilm")).eval()
    total = 0.0
    with torch.no_grad():
        for name, wq in weights.items():
            total += weighted_error(reference.linears[name].weight.float() - wq, reference.hessians[name].matrix)
            model.get_submodule(name).weight.copy_(wq)
    return total, float((reference.embed(model) * reference.embeddings).sum(1).mean())


def main(recipes: list[str]) -> None:
    reference = Reference()
    rows: list[tuple[str, Weights, float | None]] = []
    with tempfile.TemporaryDirectory() as tmp:
        marlin("pack", "minilm", f"{tmp}/rtn")
        rows.append(("RTN (marlin pack)", checkpoint_weights(Path(tmp, "rtn")), None))
        for recipe in recipes:
            seconds = marlin("quantize", "minilm", f"{tmp}/{recipe}", *OURS[recipe])
            rows.append((f"marlin quantize {' '.join(OURS[recipe]) or '(default)'}",
                         checkpoint_weights(Path(tmp, recipe)), seconds))  # fmt: skip
    weights, seconds = peer_weights(list(rows[0][1]))
    rows.append(("llm-compressor default (W4A16, static)", weights, seconds))
    scored = [(label, *score(reference, w), s) for label, w, s in rows]
    rtn = scored[0][1]
    print(f"\nMiniLM, 4-bit g128, {len(reference.texts)} held-out paragraphs\n")
    print("| recipe | error vs RTN | embedding cosine | wall time (s) |\n| --- | --- | --- | --- |")
    for label, error, cosine, s in scored:
        print(f"| {label} | {error / rtn:.4f} | {cosine:.4f} | {'' if s is None else f'{s:.1f}'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default=",".join(OURS), help=f"ours to run, of {', '.join(OURS)}")
    args = parser.parse_args()
    unknown = set(args.recipes.split(",")) - set(OURS)
    if unknown:
        parser.error(f"unknown recipes {sorted(unknown)}; choose from {', '.join(OURS)}")
    main(args.recipes.split(","))
