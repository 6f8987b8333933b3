"""`marlin pack`: convert an fp16/bf16/fp32 checkpoint to the Marlin format with round-to-nearest (no calibration)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from marlin_cli.cli.common import DeviceOpt, ForceOpt, JsonOpt, OutputArg, ShardOpt
from marlin_cli.cli.quantize import run_job
from marlin_cli.config import Method, QuantConfig
from marlin_cli.io.checkpoint import parse_size
from marlin_cli.pipeline import Job


def pack_command(
    input: Annotated[Path, typer.Argument(help="Model directory with fp16/bf16/fp32 safetensors.")],
    output: OutputArg,
    group_size: Annotated[int, typer.Option("--group-size", help="Input channels per scale: -1, 32, 64 or 128.")] = 128,
    clip: Annotated[bool, typer.Option("--clip/--no-clip", help="Search shrunken scales by squared error.")] = False,
    device: DeviceOpt = None,
    max_shard_size: ShardOpt = "5GB",
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Repack INPUT into 4-bit Marlin-format safetensors in OUTPUT by round-to-nearest, with no calibration.

    Example: marlin pack ./my-model out/my-model-rtn --group-size 64
    """
    job = Job(
        model=str(input),
        output=output,
        quant=QuantConfig(group_size=group_size, clip=clip, method=Method.RTN),
        device=device,
        max_shard_size=parse_size(max_shard_size),
        force=force,
    )
    run_job(job, json_out)
