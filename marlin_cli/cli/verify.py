"""`marlin verify`: check every quantized layer of a checkpoint; exit 1 if any fails."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from marlin_cli.cli.common import (
    DeviceOpt,
    JsonOpt,
    ProgressView,
    Timer,
    err_console,
    flagged,
    note_kernel_build,
    print_json,
)
from marlin_cli.errors import CheckpointError, UsageError, VerificationFailed


def verify_command(
    ckpt: Annotated[
        Path,
        typer.Argument(help="Checkpoint directory written by quantize or pack: Marlin, GPTQ or compressed-tensors."),
    ],
    device: DeviceOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the random activations.")] = 0,
    model_check_: Annotated[
        bool,
        typer.Option(
            "--model-check",
            help="Also run held-out text through the original and the quantized model, block by block: "
            "per-token KL divergence and top-1 agreement (cosine of hidden states for encoders).",
        ),
    ] = False,
    original: Annotated[
        Path | None,
        typer.Option(help="Original model for --model-check. \\[default: the source recorded in the report]"),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Check each quantized layer: tensors against the config, scales finite and positive, then the layer's product
    on random activations through the kernel against the float32 reference. Exit 0 only if every layer passes.

    A GPTQ or compressed-tensors export's layers run through the kernel as `marlin pack` would convert them, against
    the export's own dequantized weights.

    Example: marlin verify out/minilm-w4 --json
    """
    from marlin_cli.repack import is_export
    from marlin_cli.verify import TOLERANCE, checksum_problems, model_check, verify_checkpoint

    if original is not None and not model_check_:
        raise UsageError(f"--original {original}: it is the model --model-check compares with; add --model-check")
    if model_check_ and is_export(ckpt):
        raise UsageError(
            f"--model-check runs the model on MarlinLinear layers, which read the Marlin format, not {ckpt}'s: "
            f"`marlin pack {ckpt} OUT` converts it exactly, then `marlin verify OUT --model-check`"
        )
    timer = Timer()
    note_kernel_build(device)
    with ProgressView(enabled=not json_out) as view:
        checks = verify_checkpoint(ckpt, device, seed, view)
        tampered = checksum_problems(ckpt, view)
        whole = model_check(ckpt, original or recorded_source(ckpt), device, on_progress=view) if model_check_ else None
    failed = [c for c in checks if not c.passed]
    if json_out:
        print_json(
            {
                "checkpoint": str(ckpt),
                "passed": not failed and not tampered,
                "checksum_problems": tampered,
                "model_check": asdict(whole) if whole else None,
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
            result = flagged("ok", "green") if c.passed else flagged("FAIL", "red", c.problem or "")
            table.add_row(c.name, f"{c.in_features} x {c.out_features}", str(c.groups), c.kernel, err, result)
        err_console.print(table)
        if whole is not None and whole.kind == "logits":
            err_console.print(
                f"model check vs {whole.original}: {whole.tokens} tokens, KL {whole.kl:.4g} nats/token, "
                f"top-1 agreement {whole.top1:.2%}"
            )
        elif whole is not None:
            err_console.print(
                f"model check vs {whole.original}: {whole.tokens} tokens, hidden-state cosine {whole.cosine:.4f}"
            )
    for problem in tampered:
        err_console.print(flagged("FAIL", "red", problem), highlight=False, soft_wrap=True)
    if tampered:
        raise VerificationFailed(f"the shards' checksums do not check out ({len(tampered)} problem(s)): {tampered[0]}")
    if failed:
        raise VerificationFailed(
            f"{len(failed)} of {len(checks)} layers failed verification (first: {failed[0].name}: {failed[0].problem})"
        )


def recorded_source(ckpt: Path) -> Path:
    """The model a checkpoint was made from, as its report records it."""
    from marlin_cli.io.checkpoint import REPORT

    try:
        return Path(json.loads((ckpt / REPORT).read_text())["source"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{ckpt / REPORT}: no recorded source model; pass --original") from None
