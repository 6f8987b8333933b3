"""`marlin inspect`: what a checkpoint holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from marlin_cli.cli.common import JsonOpt, err_console, print_json
from marlin_cli.errors import CheckpointError
from marlin_cli.io.checkpoint import Checkpoint


def describe(path: Path) -> dict[str, Any]:
    """Format, settings, layers and sizes of the checkpoint in `path`."""
    store = Checkpoint(path)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"{path / 'config.json'}: missing or not JSON") from None
    qc = config.get("quantization_config") or {}
    layers = qc.get("quantized_modules") or {}
    dtypes: dict[str, int] = {}
    for name in store.names():
        entry = store.entry(name)
        dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + 1
    return {
        "path": str(path),
        "architecture": (config.get("architectures") or ["?"])[0],
        "format": qc.get("format", qc.get("quant_method", "dense")),
        "bits": qc.get("bits"),
        "group_size": qc.get("group_size"),
        "act_order": qc.get("act_order"),
        "method": qc.get("method"),
        "quantized_layers": {name: {"in_features": k, "out_features": n} for name, (k, n) in layers.items()},
        "ignored_layers": qc.get("ignored_modules", {}),
        "tensors": len(store.names()),
        "tensor_dtypes": dtypes,
        "files": len(store.headers),
        "bytes": store.nbytes(),
    }


def inspect_command(
    ckpt: Annotated[Path, typer.Argument(help="Checkpoint directory.")],
    layers: Annotated[bool, typer.Option("--layers", help="List every quantized layer.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Show what a checkpoint holds: format, bits, group size, act-order, layers and sizes.

    Example: marlin inspect out/minilm-w4 --layers
    """
    info = describe(ckpt)
    if json_out:
        print_json(info)
        return
    table = Table(title=str(ckpt), show_header=False)
    for key in ("architecture", "format", "bits", "group_size", "act_order", "method", "tensors", "files"):
        table.add_row(key, str(info[key]))
    table.add_row("quantized layers", str(len(info["quantized_layers"])))
    table.add_row("kept layers", str(len(info["ignored_layers"])))
    table.add_row("size", f"{info['bytes'] / 1e6:.1f} MB")
    err_console.print(table)
    if layers:
        detail = Table("layer", "K x N")
        for name, shape in info["quantized_layers"].items():
            detail.add_row(name, f"{shape['in_features']} x {shape['out_features']}")
        err_console.print(detail)
