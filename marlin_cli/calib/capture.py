"""Run a model block by block: capture the first block's inputs, then each block's layer inputs through hooks."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from marlin_cli.algo.hessian import Hessian
from marlin_cli.model.layout import outside_blocks


class _Stop(Exception):
    """Raised inside a hook once it has what it needs, so the rest of the forward pass is skipped."""


@dataclass
class BlockInputs:
    """What the first block receives for each calibration sample: hidden states and the other arguments."""

    hidden: list[torch.Tensor] = field(default_factory=list)
    args: list[tuple[Any, ...]] = field(default_factory=list)
    kwargs: list[dict[str, Any]] = field(default_factory=list)


def move_outside(model: nn.Module, blocks_name: str, device: torch.device) -> None:
    """The tensors outside the blocks (embeddings, final norm, head) to `device`."""
    for t in outside_blocks(model, blocks_name):
        t.data = t.data.to(device)


def capture_inputs(
    model: nn.Module, blocks_name: str, blocks: nn.ModuleList, samples: list[torch.Tensor], device: torch.device
) -> BlockInputs:
    """Run the model up to its first block for every (1, T) token sample; only non-block weights visit `device`."""
    captured = BlockInputs()

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        captured.hidden.append(hidden)
        captured.args.append(args[1:])
        captured.kwargs.append(kwargs)
        raise _Stop

    extra = no_cache(model)
    move_outside(model, blocks_name, device)
    handle = blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for ids in samples:
            try:
                model(input_ids=ids.to(device), **extra)
            except _Stop:
                pass
    finally:
        handle.remove()
        move_outside(model, blocks_name, torch.device("cpu"))
    return captured


def no_cache(model: nn.Module) -> dict[str, bool]:
    """Forward arguments that keep a decoder from building a key/value cache nobody reads."""
    return {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}


def run_block(block: nn.Module, inputs: BlockInputs, i: int) -> torch.Tensor:
    """The block's output hidden states for sample i."""
    out = block(inputs.hidden[i], *inputs.args[i], **inputs.kwargs[i])
    return out[0] if isinstance(out, tuple) else out


@contextmanager
def _pre_hooks(modules: dict[str, nn.Module], fn: Any) -> Iterator[None]:
    handles = [
        m.register_forward_pre_hook(lambda mod, args, name=name: fn(name, args[0])) for name, m in modules.items()
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def input_groups(block: nn.Module, linears: dict[str, nn.Module], inputs: BlockInputs) -> list[list[str]]:
    """Layers grouped by the input tensor they read (e.g. q/k/v; gate/up), groups in execution order.

    Layers the forward pass never reaches (unused experts, say) are left out.
    """
    seen: list[tuple[torch.Tensor, list[str]]] = []  # holding the tensors keeps their identities unique

    def record(name: str, x: torch.Tensor) -> None:
        for tensor, names in seen:
            if tensor is x:
                names.append(name)
                return
        seen.append((x, [name]))

    with _pre_hooks(linears, record):
        run_block(block, inputs, 0)
    return [names for _, names in seen]


# Inputs gathered before one Hessian update. Every update reads and writes all of H (K x K float32: 3.3 GB at K =
# 28672), which for samples of a few hundred tokens costs more than their product does.
BATCH_TOKENS = 8192


def group_hessian(block: nn.Module, layer: nn.Module, columns: int, inputs: BlockInputs) -> Hessian:
    """Hessian of `layer`'s input over every sample; each forward pass stops once the layer's input is seen."""
    hessian = Hessian(columns, device=inputs.hidden[0].device)
    pending: list[torch.Tensor] = []

    def update() -> None:
        if pending:
            hessian.add(torch.cat(pending))
            pending.clear()

    def add(name: str, x: torch.Tensor) -> None:
        pending.append(x.reshape(-1, x.shape[-1]))
        if sum(p.shape[0] for p in pending) >= BATCH_TOKENS:
            update()
        raise _Stop

    with _pre_hooks({"layer": layer}, add):
        for i in range(len(inputs.hidden)):
            try:
                run_block(block, inputs, i)
            except _Stop:
                pass
    update()
    return hessian
