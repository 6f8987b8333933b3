"""How the tool runs a model's forward passes (calibration, the model check)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

# Not cuDNN's attention, torch's first choice on Hopper: it builds a plan for every new sequence length, and
# calibration samples come in many lengths. The first pass of 128 samples over a Llama-3-70B-shaped block on the
# H200: 9.7 s with it, 0.94 s on the other backends (0.156 / 0.117 s once warm).
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@contextmanager
def inference() -> Iterator[None]:
    """No autograd, and scaled-dot-product attention on any backend but cuDNN's."""
    with torch.no_grad(), sdpa_kernel(BACKENDS):
        yield
