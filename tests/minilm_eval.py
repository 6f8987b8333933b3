"""Held-out accuracy of quantized MiniLM checkpoints: per-layer output error and sentence-embedding cosine.

Held-out data: the embedded corpus's held-out tenth (never used for calibration), split into paragraphs.
Layer error: tr(dW H dW^T) with H from the original model's inputs to that layer on the held-out text, i.e. the squared
output error of the layer on those inputs. Embedding: mean of the last hidden state over the mask, L2-normalised.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer, BertModel

from marlin_cli.algo.hessian import Hessian, weighted_error
from marlin_cli.calib.data import embedded_texts, paragraphs
from marlin_cli.model.layout import LINEAR_TYPES
from marlin_cli.model.load import resolve
from marlin_cli.nn import MarlinLinear, load_quantized

NTEXTS = 256
MAX_TOKENS = 128
BATCH = 32
KINDS = tuple(__import__("os").environ.get("EVAL_KINDS", "prose,code").split(","))


def heldout_texts() -> list[str]:
    return paragraphs(embedded_texts("heldout", KINDS))[:NTEXTS]


class Reference:
    """The original model, its held-out layer Hessians and embeddings, computed once."""

    def __init__(self) -> None:
        path = resolve("minilm")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = BertModel.from_pretrained(path).eval()
        self.texts = heldout_texts()
        self.linears = {
            n: m for n, m in self.model.named_modules() if isinstance(m, LINEAR_TYPES) and n.startswith("encoder.")
        }
        self.hessians = {n: Hessian(m.in_features) for n, m in self.linears.items()}
        self.mask = torch.ones(0, dtype=torch.bool)
        hooks = [
            m.register_forward_pre_hook(lambda mod, a, n=n: self.hessians[n].add(a[0][self.mask]))
            for n, m in self.linears.items()
        ]
        self.embeddings = self.embed(self.model)
        for h in hooks:
            h.remove()

    @torch.no_grad()
    def embed(self, model: torch.nn.Module) -> torch.Tensor:
        out = []
        for i in range(0, len(self.texts), BATCH):
            enc = self.tokenizer(
                self.texts[i : i + BATCH], truncation=True, max_length=MAX_TOKENS, padding=True, return_tensors="pt"
            )
            self.mask = enc["attention_mask"].bool()  # padding tokens stay out of the Hessians
            hidden = model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            out.append(torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=1))
        return torch.cat(out)

    def evaluate(self, checkpoint: Path) -> dict:
        """Per-layer held-out errors and the mean embedding cosine of a checkpoint."""
        quantized = load_quantized(checkpoint)
        return self.score(
            {n: m.dequantized_weight() for n, m in quantized.named_modules() if isinstance(m, MarlinLinear)}
        )

    def score(self, weights: dict[str, torch.Tensor]) -> dict:
        """Per-layer held-out errors and the mean embedding cosine of quantized layer weights (name -> (N, K)) put
        into the original model."""
        dense = BertModel.from_pretrained(resolve("minilm")).eval()
        errors = {}
        with torch.no_grad():
            for name, wq in weights.items():
                errors[name] = weighted_error(self.linears[name].weight.float() - wq, self.hessians[name].matrix)
                dense.get_submodule(name).weight.copy_(wq)
        cosine = (self.embed(dense) * self.embeddings).sum(1)
        return {"errors": errors, "cosine": float(cosine.mean())}
