"""GPU tests: run on the H200; everywhere else they are skipped with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (run on the H200): torch.cuda.is_available() is False"
    from marlin_cli.kernel import build

    return build.kernel_problem()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        reason = reason or _skip_reason()
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _exact_fp32_matmul():
    """The float32 reference must not run in TF32 (10-bit mantissa): restore the flag afterwards."""
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
