"""Shared fixtures: tiny real Hugging Face models saved to disk, and a CLI runner that keeps the real exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (gptq_reference, minilm_eval, tiny_models)
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "scripts"))  # the measuring scripts some tests check

from tiny_models import make_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = make_tiny(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    return get


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """Run `marlin ARGS...` in-process through its real entry point; returns (exit code, stdout, stderr)."""
    from marlin_cli.cli.app import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["marlin", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run
