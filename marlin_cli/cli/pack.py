"""`marlin pack`: convert a checkpoint to 4-bit: an fp16/bf16/fp32 model by round-to-nearest (no calibration), or a
GPTQ / compressed-tensors checkpoint by copying its codes exactly (or re-quantizing with --requantize); with
--sparse24, a dense model or our own dense Marlin checkpoint to the 2:4 layout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from marlin_cli.cli.common import DeviceOpt, ForceOpt, JsonOpt, OutputArg, ShardOpt
from marlin_cli.cli.quantize import FormatOpt, run_job
from marlin_cli.errors import UsageError


def pack_command(
    input: Annotated[
        Path,
        typer.Argument(
            help="Model directory: fp16/bf16/fp32 safetensors, GPTQ, compressed-tensors, or (--sparse24) a dense "
            "Marlin checkpoint."
        ),
    ],
    output: OutputArg,
    group_size: Annotated[
        int | None,
        typer.Option(
            "--group-size",
            help="Input channels per scale: -1, 32, 64 or 128 (dense input, --requantize, --sparse24). "
            "\\[default: 128]",
        ),
    ] = None,
    clip: Annotated[
        bool,
        typer.Option(
            "--clip/--no-clip", help="Search shrunken scales by squared error (dense input, --requantize, --sparse24)."
        ),
    ] = False,
    requantize: Annotated[
        bool,
        typer.Option(
            "--requantize",
            help="For GPTQ / compressed-tensors input that cannot convert exactly (asymmetric, not 4-bit, other "
            "group sizes): re-quantize the dequantized weights with RTN and report the added error.",
        ),
    ] = False,
    sparse24: Annotated[
        bool,
        typer.Option(
            "--sparse24",
            help="Prune to 2:4 (2 of every 4 input weights kept) and write the 2:4 Marlin layout: a dense model by "
            "magnitude + RTN (or --calib), a dense Marlin checkpoint by magnitude + RTN of its dequantized weights.",
        ),
    ] = False,
    calib: Annotated[
        str | None,
        typer.Option(
            help="With --sparse24 and a dense model: calibrate (SparseGPT) on this text, as `marlin quantize --calib` "
            "('embedded', a .txt/.jsonl/.parquet file, or a datasets hub name)."
        ),
    ] = None,
    output_format: FormatOpt = "marlin",
    device: DeviceOpt = None,
    max_shard_size: ShardOpt = "5GB",
    force: ForceOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Repack INPUT into 4-bit safetensors in OUTPUT, with no calibration (unless --sparse24 --calib).

    A dense model is quantized by round-to-nearest. A GPTQ (v1 or v2 zeros, with or without desc_act) or
    compressed-tensors pack-quantized checkpoint is converted with its codes and scales copied exactly when it is
    symmetric 4-bit; anything else is refused unless --requantize is given.

    With --sparse24 a dense model is pruned to 2:4 by magnitude and rounded to nearest, or with --calib pruned and
    quantized by SparseGPT; one of marlin's own dense checkpoints is re-quantized to 2:4 from its dequantized weights.

    Examples: marlin pack ./my-model out/my-model-rtn --group-size 64  |  marlin pack ./llama-gptq out/llama-marlin  |
    marlin pack ./my-model out/my-model-24 --sparse24 --calib embedded
    """
    from marlin_cli.config import CalibConfig, Method, QuantConfig
    from marlin_cli.io.checkpoint import parse_size
    from marlin_cli.pipeline import Job
    from marlin_cli.pipeline import output_format as parse_format
    from marlin_cli.repack import RepackJob, repack, source_format

    source = source_format(input) if (input / "config.json").is_file() else None
    if calib is not None and not sparse24:
        raise UsageError("--calib without --sparse24: calibrated dense quantization is `marlin quantize`")
    if calib is not None and source is not None:
        raise UsageError(
            f"--calib: {input} is already quantized; calibrated 2:4 needs the original model: "
            "run `marlin pack --sparse24 --calib` or `marlin quantize --sparse24` on that"
        )
    if source is not None:
        job: Job | RepackJob = RepackJob(
            source=input,
            output=output,
            format=parse_format(output_format),
            requantize=requantize,
            sparse24=sparse24,
            group_size=None if group_size is None else QuantConfig(group_size=group_size).group_size,
            clip=clip,
            device=device,
            max_shard_size=parse_size(max_shard_size),
            force=force,
        )
    elif requantize:
        raise UsageError(f"--requantize: {input} is not a GPTQ or compressed-tensors checkpoint; leave it out")
    else:
        job = Job(
            model=str(input),
            output=output,
            quant=QuantConfig(
                group_size=QuantConfig.group_size if group_size is None else group_size,
                clip=clip,
                method=Method.GPTQ if calib else Method.RTN,
                sparse24=sparse24,
            ),
            calib=CalibConfig(source=calib or "embedded"),
            device=device,
            max_shard_size=parse_size(max_shard_size),
            force=force,
            format=output_format,  # type: ignore[arg-type]  # validated by Job
        )
    run_job(job, json_out, repack if source is not None else None)
