"""MarlinLinear, and the loader that runs a Marlin checkpoint inside its Hugging Face model class."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from marlin_cli.config import GROUP_SIZES
from marlin_cli.errors import CheckpointError
from marlin_cli.formats import marlin24
from marlin_cli.io.checkpoint import Checkpoint, check_dir, read_json_object
from marlin_cli.kernel import ops, reference
from marlin_cli.model.load import Loaded, load_tensors, skeleton, stored_keys


class MarlinLinear(nn.Module):
    """y = x @ dequant(B) + bias with a Marlin-packed 4-bit weight; the kernel on a GPU, the reference elsewhere.

    Dense layers hold `B` (and `perm` with act-order); 2:4 layers (`sparse24`) hold `B_24` and `B_meta` instead, on a
    GPU whose 2:4 kernels are the Hopper ones in those kernels' order (`prepare`, on every move and load); their state
    dict is always in the stored order.
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
        self._kernel_order = False  # B_24 and B_meta in formats.marlin24's kernel order, not as stored

    def prepare(self) -> None:
        """Put a 2:4 layer's B_24 and B_meta in the order the 2:4 kernel of their device reads (ops.prepare24), in
        place of the stored ones. Moves (`.to`, `.cuda`, `.cpu`) and state-dict loads call it, so that forward
        changes no state (CUDA graph capture, torch.compile)."""
        if self.sparse24 and self._kernel_order != ops.kernel_order24(self.B_24.device):
            convert = marlin24.from_kernel_order if self._kernel_order else marlin24.to_kernel_order
            self.B_24, self.B_meta = convert(self.B_24, self.B_meta)  # rebinds the buffers: one layer's copy at a time
            self._kernel_order = not self._kernel_order

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> MarlinLinear:
        super()._apply(fn, recurse)
        self.prepare()
        return self

    def _stored(self) -> tuple[torch.Tensor, torch.Tensor]:
        return marlin24.from_kernel_order(self.B_24, self.B_meta) if self._kernel_order else (self.B_24, self.B_meta)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._kernel_order:
            destination[prefix + "B_24"], destination[prefix + "B_meta"] = self._stored()

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        if self._kernel_order:  # back to the stored order first: the state dict may hold only some of the tensors
            self.B_24, self.B_meta = self._stored()
            self._kernel_order = False
        super()._load_from_state_dict(state_dict, prefix, *args)
        self.prepare()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.reshape(-1, self.in_features)
        a = a.to(torch.float16) if a.is_cuda else a
        if self.sparse24:
            y = ops.gemm24(a, ops.Weights24(self.B_24, self.B_meta, self._kernel_order), self.s)
        else:
            y = ops.gemm(a, self.B, self.s, self.perm)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K) float32 weight in the original input order, as a dense layer would hold it."""
        if self.sparse24:
            return reference.dequantize24(*self._stored(), self.s).T
        w = reference.dequantize(self.B, self.s)
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(0, self.perm.long(), w)
        return w.T


def quantization_config(path: Path) -> dict[str, Any]:
    """The checkpoint's quantization_config, checked field by field; CheckpointError naming the field otherwise."""
    check_dir(path)
    where = path / "config.json"
    if not where.is_file():
        raise CheckpointError(f"{path}: no config.json; give a checkpoint directory written by marlin quantize or pack")
    qc = read_json_object(where).get("quantization_config")
    if not isinstance(qc, dict):
        raise CheckpointError(f"{where}: no quantization_config, so not a quantized checkpoint")
    if qc.get("quant_method") != "marlin":
        raise CheckpointError(
            f"{where}: quant_method {qc.get('quant_method')!r}, not 'marlin'; `marlin pack {path} OUT` converts a "
            "GPTQ or compressed-tensors checkpoint to the Marlin format, which this reads"
        )
    problem = _config_problem(qc)
    if problem is not None:
        raise CheckpointError(f"{where}: quantization_config {problem}")
    return qc


def _config_problem(qc: dict[str, Any]) -> str | None:
    def whole(v: Any) -> bool:  # JSON true is not 1 and 128.0 is not 128 here
        return type(v) is int

    if qc.get("bits") != 4 or not whole(qc.get("bits")):
        return f"bits {qc.get('bits')!r}: the Marlin format stores 4-bit weights"
    if not whole(qc.get("group_size")) or qc["group_size"] not in GROUP_SIZES:
        return f"group_size {qc.get('group_size')!r} is not one of {GROUP_SIZES}"
    if not isinstance(qc.get("desc_act", False), bool):
        return f"desc_act {qc.get('desc_act')!r} is not true or false"
    modules = qc.get("quantized_modules")
    if not isinstance(modules, dict) or not all(
        isinstance(shape, list) and len(shape) == 2 and all(whole(v) and v > 0 for v in shape)
        for shape in modules.values()
    ):
        return "quantized_modules must map each layer name to [in_features, out_features] (positive integers)"
    return None


def quantized_skeleton(path: Path) -> Loaded:
    """The checkpoint's Hugging Face model class with MarlinLinear layers, its tensors allocated but not yet read
    (`load_tensors` reads them, a block at a time if need be); `Loaded.store` is the checkpoint."""
    qc = quantization_config(path)
    sparse = is_sparse24(path, qc)
    store = Checkpoint(path)
    config = AutoConfig.from_pretrained(path)
    model = skeleton(config)  # the stored tensors replace its own
    for name, (k, n) in qc["quantized_modules"].items():
        parent, _, attr = name.rpartition(".")
        old = model.get_submodule(name)
        groups = store.entry(f"{name}.s")["shape"][0]
        bias = getattr(old, "bias", None) is not None
        layer = MarlinLinear(k, n, groups, qc.get("desc_act", False), bias, sparse)
        setattr(model.get_submodule(parent), attr, layer)
    keys = set(model.state_dict())
    missing = [k for k in stored_keys(model) if k not in store.file_of]
    unexpected = [k for k in store.names() if k not in keys]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: tensors do not match the model (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    return Loaded(path=path, config=config, model=model.eval(), store=store)


def load_quantized(path: Path, device: str | torch.device = "cpu") -> PreTrainedModel:
    """Build the checkpoint's model class with MarlinLinear layers and load every tensor from disk, in the dtypes
    they are stored in."""
    loaded = quantized_skeleton(path)
    load_tensors(loaded.model, loaded.store)
    return loaded.model.to(device)  # MarlinLinear puts 2:4 weights in their kernels' order as they move


def is_sparse24(path: Path, qc: dict[str, Any]) -> bool:
    """Whether the checkpoint's quantized layers are 2:4 (sparsity "2:4"); CheckpointError for any other sparsity."""
    if qc.get("sparsity") not in (None, "2:4"):
        raise CheckpointError(
            f"{path / 'config.json'}: sparsity {qc['sparsity']!r} is not one marlin reads (null for dense, '2:4')"
        )
    if qc.get("sparsity") == "2:4" and qc.get("desc_act"):
        raise CheckpointError(f"{path / 'config.json'}: desc_act with sparsity '2:4': the 2:4 layout has no perm")
    return qc.get("sparsity") == "2:4"
