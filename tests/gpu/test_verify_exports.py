"""`verify` of GPTQ and compressed-tensors exports on the GPU: every layer through the CUDA kernel, as `marlin pack`
converts it, against the float32 product of the export's own dequantized weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_helpers import EXPORT_SHAPES, write_export

from marlin_cli.verify import TOLERANCE, verify_checkpoint

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("act_order", [False, True], ids=["natural", "act-order"])
@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
def test_exports_verify_through_the_kernel(fmt: str, group: int, act_order: bool, tmp_path: Path) -> None:
    path = tmp_path / "export"
    write_export(path, fmt, group, act_order)
    checks = verify_checkpoint(path, "cuda")
    assert len(checks) == len(EXPORT_SHAPES)
    for check in checks:
        assert check.kernel == "cuda" and check.passed, check
        assert 0 < check.error <= TOLERANCE
