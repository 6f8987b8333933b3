"""Where the quantizable work is: the repeated blocks of a model and the linear layers inside them."""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from marlin_cli.errors import ModelError

LINEAR_TYPES = (nn.Linear, Conv1D)  # Conv1D (GPT-2) stores its weight as (in, out)


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's repeated blocks: the ModuleList of identical modules holding the most linear-layer parameters."""
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0 or len({type(m) for m in module}) != 1:
            continue
        size = sum(m.weight.numel() for block in module for m in block.modules() if isinstance(m, LINEAR_TYPES))
        if size and (best is None or size > best[0]):
            best = (size, name, module)
    if best is None:
        raise ModelError(f"{type(model).__name__}: found no repeated block of linear layers to quantize")
    return best[1], best[2]


def outside_blocks(model: nn.Module, blocks_name: str) -> list[torch.Tensor]:
    """Every parameter and buffer not inside the blocks (embeddings, norms, head, rotary tables)."""
    prefix = blocks_name + "."
    return [t for name, t in [*model.named_parameters(), *model.named_buffers()] if not name.startswith(prefix)]


def find_linears(block: nn.Module) -> dict[str, nn.Module]:
    """Linear layers of a block, by name relative to the block, in definition order."""
    return {name: m for name, m in block.named_modules() if isinstance(m, LINEAR_TYPES)}


def weight_matrix(module: nn.Module) -> torch.Tensor:
    """The layer's weight as (N, K) = (out_features, in_features), a view where possible."""
    w = module.weight
    return w.T if isinstance(module, Conv1D) else w


def set_weight_matrix(module: nn.Module, w: torch.Tensor) -> None:
    """Replace the layer's weight values with an (N, K) matrix, keeping its dtype and device."""
    target = module.weight
    target.data.copy_(w.T if isinstance(module, Conv1D) else w)


def in_out(module: nn.Module) -> tuple[int, int]:
    n, k = weight_matrix(module).shape
    return k, n
