"""`verify` of GPTQ and compressed-tensors exports on the GPU: every layer through the CUDA kernel, as `marlin pack`
converts it, against the float32 product of the export's own dequantized weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from marlin_cli.formats import compressed_tensors, gptq
from marlin_cli.verify import TOLERANCE, verify_checkpoint

pytestmark = pytest.mark.gpu

SHAPES = [(256, 512), (512, 1024), (1024, 256)]  # (K, N); N = 1024 lets the batch-33 product take 256 columns


def write_export(path: Path, fmt: str, group: int, act_order: bool) -> None:
    """Random codes, positive scales and (act_order) a shuffled g_idx for each shape, written as `fmt` prescribes."""
    gen = torch.Generator().manual_seed(group + act_order)
    tensors = {}
    for i, (k, n) in enumerate(SHAPES):
        groups = 1 if group == -1 else k // group
        codes = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.uint8)
        scales = (torch.rand(groups, n, generator=gen) + 0.5) / 64
        perm = torch.randperm(k, generator=gen) if act_order else None
        if perm is not None:  # stored rows sorted by group, as from_natural makes them
            perm = perm.reshape(groups, -1).sort(1).values.reshape(-1)
        layer = gptq.Layer(codes, scales.half().float(), perm)
        packed = gptq.to_gptq(layer) if fmt == "gptq" else compressed_tensors.to_compressed(layer)
        tensors |= {f"layers.{i}.proj.{name}": t for name, t in packed.items()}
    path.mkdir()
    save_file(tensors, path / "model.safetensors")
    if fmt == "gptq":
        qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": act_order, "sym": True}
    else:
        weights = {"num_bits": 4, "symmetric": True, "strategy": "channel" if group == -1 else "group"}
        weights |= {"group_size": group} if group != -1 else {}
        groups = {"group_0": {"targets": ["Linear"], "weights": weights}}
        qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": groups}
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "quantization_config": qc}))


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
def test_exports_verify_through_the_kernel(fmt: str, group: int, act_order: bool, tmp_path: Path) -> None:
    path = tmp_path / "export"
    write_export(path, fmt, group, act_order)
    checks = verify_checkpoint(path, "cuda")
    assert len(checks) == len(SHAPES)
    for check in checks:
        assert check.kernel == "cuda" and check.passed, check
        assert 0 < check.error <= TOLERANCE
