"""Imports point one way (DESIGN.md 2): algo and formats use only torch and the leaf modules; only verify, nn and the
GPU tests reach the kernel; nothing but cli prints."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "marlin_cli"
LEAVES = {"marlin_cli.config", "marlin_cli.errors", "marlin_cli.grid"}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "marlin_cli":
            found.update(f"marlin_cli.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("marlin_cli")}


def modules(sub: str) -> list[Path]:
    return sorted((PACKAGE / sub).rglob("*.py"))


@pytest.mark.parametrize("sub", ["algo", "formats"])
def test_pure_layers_import_only_leaves(sub: str) -> None:
    for path in modules(sub):
        bad = {m for m in imports(path) if m not in LEAVES and not m.startswith(f"marlin_cli.{sub}")}
        assert not bad, f"{path.name} imports {bad}"


def test_only_verify_and_nn_reach_the_kernel() -> None:
    allowed = {PACKAGE / "verify.py", PACKAGE / "nn.py"}
    for path in PACKAGE.rglob("*.py"):
        if path in allowed or path.parent.name in ("kernel", "cli"):
            continue
        assert not any(m.startswith("marlin_cli.kernel") for m in imports(path)), path


def test_only_the_cli_prints() -> None:
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "cli":
            continue
        calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        assert not any(isinstance(c.func, ast.Name) and c.func.id == "print" for c in calls), path


def test_the_command_line_starts_without_torch() -> None:
    """`marlin --help` and `--version` answer in about 0.4 s: the commands import torch and transformers (about 7 s
    on a 2-core CPU) only when they run."""
    code = "import sys, marlin_cli.cli.app; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]", f"importing the CLI loads {out.stdout.strip()}"
