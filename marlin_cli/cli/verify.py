"""`marlin verify`: check every quantized layer of a checkpoint; exit 1 if any fails."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from marlin_cli.cli.common import DeviceOpt, JsonOpt, Timer, err_console, print_json
from marlin_cli.errors import VerificationFailed
from marlin_cli.verify import TOLERANCE, verify_checkpoint


def verify_command(
    ckpt: Annotated[Path, typer.Argument(help="Marlin checkpoint directory (as written by quantize or pack).")],
    device: DeviceOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the random activations.")] = 0,
    json_out: JsonOpt = False,
) -> None:
    """Check each quantized layer: tensors against the config, scales finite and positive, then the layer's product
    on random activations through the kernel against the float32 reference. Exit 0 only if every layer passes.

    Example: marlin verify out/minilm-w4 --json
    """
    timer = Timer()
    checks = verify_checkpoint(ckpt, device, seed)
    failed = [c for c in checks if not c.passed]
    if json_out:
        print_json(
            {
                "checkpoint": str(ckpt),
                "passed": not failed,
                "tolerance": TOLERANCE,
                "seconds": timer.seconds(),
                "layers": [asdict(c) for c in checks],
            }
        )
    else:
        table = Table(title=f"{ckpt}: {len(checks) - len(failed)}/{len(checks)} layers pass")
        for col in ("layer", "K x N", "groups", "kernel", "rel. error", "result"):
            table.add_column(col, overflow="fold")
        for c in checks:
            err = f"{c.error:.2e}" if c.error is not None else "-"
            result = "[green]ok[/]" if c.passed else f"[red]FAIL[/] {c.problem}"
            table.add_row(c.name, f"{c.in_features} x {c.out_features}", str(c.groups), c.kernel, err, result)
        err_console.print(table)
    if failed:
        raise VerificationFailed(
            f"{len(failed)} of {len(checks)} layers failed verification (first: {failed[0].name}: {failed[0].problem})"
        )
