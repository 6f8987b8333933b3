"""How the tool runs a model's forward passes (calibration, the model check)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from marlin_cli.calib.capture import capture_inputs, move_outside, no_cache
from marlin_cli.model.load import Loaded, load_tensors

# Not cuDNN's attention, torch's first choice on Hopper: it builds a plan for every new sequence length, and
# calibration samples come in many lengths. The first pass of 128 samples over a Llama-3-70B-shaped block on the
# H200: 9.7 s with it, 0.94 s on the other backends (0.156 / 0.117 s once warm).
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextmanager
def inference() -> Iterator[None]:
    """No autograd, and scaled-dot-product attention on any backend but cuDNN's."""
    with torch.no_grad(), sdpa_kernel(BACKENDS):
        yield


def streamed_outputs(
    loaded: Loaded,
    blocks_name: str,
    samples: list[torch.Tensor],
    device: torch.device,
    on_block: Callable[[int, int], None] = lambda done, total: None,
) -> Iterator[Any]:
    """The model's outputs for each (1, T) token sample, computed block by block: `device` holds the tensors outside
    the blocks and one block at a time, each block read from `loaded.store` (when set) as its turn comes and dropped
    once every sample has gone through it. The model is used up."""
    model = loaded.model
    blocks = model.get_submodule(blocks_name)
    if loaded.store is not None:
        load_tensors(model, loaded.store, skip=f"{blocks_name}.")
    inputs = capture_inputs(model, blocks_name, blocks, samples, device)
    tupled = False  # some model classes return a block's hidden states in a tuple
    for b, block in enumerate(blocks):
        on_block(b, len(blocks))
        if loaded.store is not None:
            load_tensors(block, loaded.store, f"{blocks_name}.{b}.")
        block.to(device)
        for i in range(len(samples)):
            out = block(inputs.hidden[i], *inputs.args[i], **inputs.kwargs[i])
            tupled = isinstance(out, tuple)
            inputs.hidden[i] = out[0] if tupled else out
        block.to_empty(device="meta")
    on_block(len(blocks), len(blocks))

    # The rest of the model (final norm, head) through its own forward, each block standing in with the last
    # block's output for the sample: the model's code, not ours, says what follows the blocks.
    current: list[torch.Tensor] = []

    def replay(*args: Any, **kwargs: Any) -> Any:
        return (current[0],) if tupled else current[0]

    for block in blocks:
        block.forward = replay
    move_outside(model, blocks_name, device)
    extra = no_cache(model)
    for ids, hidden in zip(samples, inputs.hidden):
        current[:] = [hidden]
        yield model(input_ids=ids.to(device), **extra)
