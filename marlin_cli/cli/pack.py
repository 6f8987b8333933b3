"""`marlin pack`: convert a checkpoint to 4-bit: an fp16/bf16/fp32 model by round-to-nearest (no calibration), or a
GPTQ / compressed-tensors checkpoint by copying its codes exactly (or re-quantizing with --requantize)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from marlin_cli.cli.common import DeviceOpt, ForceOpt, JsonOpt, OutputArg, ShardOpt
from marlin_cli.cli.quantize import FormatOpt, run_job
from marlin_cli.config import Method, QuantConfig
from marlin_cli.errors import UsageError
from marlin_cli.io.checkpoint import parse_size
from marlin_cli.pipeline import Job, OutputFormat
from marlin_cli.pipeline import output_format as parse_format
from marlin_cli.repack import RepackJob, repack, source_format


def pack_command(
    input: Annotated[
        Path, typer.Argument(help="Model directory: fp16/bf16/fp32 safetensors, GPTQ, or compressed-tensors.")
    ],
    output: OutputArg,
    group_size: Annotated[
        int,
        typer.Option("--group-size", help="Input channels per scale: -1, 32, 64 or 128 (dense input, --requantize)."),
    ] = 128,
    clip: Annotated[bool, typer.Option("--clip/--no-clip", help="Search shrunken scales by squared error.")] = False,
    requantize: Annotated[
        bool,
        typer.Option(
            "--requantize",
            help="For GPTQ / compressed-tensors input that cannot convert exactly (asymmetric, not 4-bit, other "
            "group sizes): re-quantize the dequantized weights with RTN and report the added error.",
        ),
    ] = False,
    output_format: FormatOpt = OutputFormat.MARLIN.value,
    device: DeviceOpt = None,
    max_shard_size: ShardOpt = "5GB",
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Repack INPUT into 4-bit safetensors in OUTPUT, with no calibration.

    A dense model is quantized by round-to-nearest. A GPTQ (v1 or v2 zeros, with or without desc_act) or
    compressed-tensors pack-quantized checkpoint is converted with its codes and scales copied exactly when it is
    symmetric 4-bit; anything else is refused unless --requantize is given.

    Examples: marlin pack ./my-model out/my-model-rtn --group-size 64  |  marlin pack ./llama-gptq out/llama-marlin
    """
    source = source_format(input) if (input / "config.json").is_file() else None
    if source is not None:
        job: Job | RepackJob = RepackJob(
            source=input,
            output=output,
            format=parse_format(output_format),
            requantize=requantize,
            group_size=QuantConfig(group_size=group_size).group_size,
            max_shard_size=parse_size(max_shard_size),
            force=force,
        )
    elif requantize:
        raise UsageError(f"--requantize: {input} is not a GPTQ or compressed-tensors checkpoint; leave it out")
    else:
        job = Job(
            model=str(input),
            output=output,
            quant=QuantConfig(group_size=group_size, clip=clip, method=Method.RTN),
            device=device,
            max_shard_size=parse_size(max_shard_size),
            force=force,
            format=output_format,  # type: ignore[arg-type]  # validated by Job
        )
    run_job(job, json_out, repack if source is not None else None)
