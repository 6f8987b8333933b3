"""MarlinLinear, and the loader that runs a Marlin checkpoint inside its Hugging Face model class."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, PreTrainedModel

from marlin_cli.errors import CheckpointError
from marlin_cli.io.checkpoint import Checkpoint
from marlin_cli.kernel import ops, reference


class MarlinLinear(nn.Module):
    """y = x @ dequant(B) + bias with a Marlin-packed 4-bit weight; the kernel on a GPU, the reference elsewhere.

    Dense layers hold `B` (and `perm` with act-order); 2:4 layers (`sparse24`) hold `B_24` and `B_meta` instead.
    """

    def __init__(
        self, in_features: int, out_features: int, groups: int, act_order: bool, bias: bool, sparse24: bool = False
    ) -> None:
        super().__init__()
        if sparse24 and act_order:
            raise ValueError("the 2:4 layout stores no act-order permutation")
        self.in_features, self.out_features, self.sparse24 = in_features, out_features, sparse24
        if sparse24:
            self.register_buffer("B_24", torch.empty(in_features // 32, 2 * out_features, dtype=torch.int32))
            self.register_buffer("B_meta", torch.empty(in_features // 32, 2 * out_features, dtype=torch.int16))
        else:
            self.register_buffer("B", torch.empty(in_features // 16, 2 * out_features, dtype=torch.int32))
        self.register_buffer("s", torch.empty(groups, out_features, dtype=torch.float16))
        self.perm: torch.Tensor | None
        self.bias: torch.Tensor | None
        self.register_buffer("perm", torch.empty(in_features, dtype=torch.int32) if act_order else None)
        self.register_buffer("bias", torch.empty(out_features) if bias else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.in_features)
        a = a.to(torch.float16) if a.is_cuda else a
        y = ops.gemm24(a, self.B_24, self.B_meta, self.s) if self.sparse24 else ops.gemm(a, self.B, self.s, self.perm)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 weight in the original input order, as a dense layer would hold it."""
        if self.sparse24:
            return reference.dequantize24(self.B_24, self.B_meta, self.s).T
        w = reference.dequantize(self.B, self.s)
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(0, self.perm.long(), w)
        return w.T


def quantization_config(path: Path) -> dict[str, Any]:
    """The checkpoint's quantization_config; CheckpointError if it is not a Marlin checkpoint."""
    try:
        qc = json.loads((path / "config.json").read_text())["quantization_config"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        raise CheckpointError(f"{path / 'config.json'}: missing or without a quantization_config") from None
    if (
        not isinstance(qc, dict)
        or qc.get("quant_method") != "marlin"
        or not isinstance(qc.get("quantized_modules"), dict)
    ):
        raise CheckpointError(
            f"{path / 'config.json'}: quantization_config is not a Marlin one (quant_method 'marlin')"
        )
    return qc


def load_quantized(path: Path, device: str | torch.device = "cpu") -> PreTrainedModel:
    """Build the checkpoint's model class with MarlinLinear layers and load every tensor from disk."""
    qc = quantization_config(path)
    sparse = is_sparse24(path, qc)
    store = Checkpoint(path)
    config = AutoConfig.from_pretrained(path)
    archs = getattr(config, "architectures", None) or []
    cls = getattr(transformers, archs[0], None) if archs else None
    model = cls(config) if cls is not None else AutoModel.from_config(config)
    for name, (k, n) in qc["quantized_modules"].items():
        parent, _, attr = name.rpartition(".")
        old = model.get_submodule(name)
        groups = store.entry(f"{name}.s")["shape"][0]
        bias = getattr(old, "bias", None) is not None
        layer = MarlinLinear(k, n, groups, qc.get("desc_act", False), bias, sparse)
        setattr(model.get_submodule(parent), attr, layer)
    state = {name: store.tensor(name) for name in store.names()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    model.tie_weights()
    tied = {k for k in missing if _is_tied(model, k, state)}
    if set(missing) - tied or unexpected:
        raise CheckpointError(
            f"{path}: tensors do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    return model.to(device).eval()


def _is_tied(model: nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    """A missing key is fine when the parameter shares storage with one that was loaded (tied embeddings)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    if key not in params:
        return False
    ptr = params[key].data_ptr()
    return any(params[k].data_ptr() == ptr for k in state if k in params and k != key)


def is_sparse24(path: Path, qc: dict[str, Any]) -> bool:
    """Whether the checkpoint's quantized layers are 2:4 (sparsity "2:4"); CheckpointError for any other sparsity."""
    if qc.get("sparsity") not in (None, "2:4"):
        raise CheckpointError(
            f"{path / 'config.json'}: sparsity {qc['sparsity']!r} is not one marlin reads (null for dense, '2:4')"
        )
    if qc.get("sparsity") == "2:4" and qc.get("desc_act"):
        raise CheckpointError(f"{path / 'config.json'}: desc_act with sparsity '2:4': the 2:4 layout has no perm")
    return qc.get("sparsity") == "2:4"
