"""`marlin quantize`: GPTQ (or RTN) a Hugging Face model into a Marlin-format checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from marlin_cli import __version__
from marlin_cli.cli.common import (
    DeviceOpt,
    ForceOpt,
    JsonOpt,
    OutputArg,
    ProgressView,
    ShardOpt,
    err_console,
    memory,
    note_kernel_build,
    print_json,
)

if TYPE_CHECKING:
    from marlin_cli.algo.gptq import Kernels
    from marlin_cli.pipeline import Job

FormatOpt = Annotated[
    str,
    typer.Option(
        "--format",
        help="Checkpoint format: marlin (ours, our kernel and MarlinLinear), gptq (qweight/qzeros/scales/g_idx, "
        "served by vLLM and read by transformers), compressed-tensors (pack-quantized, served by vLLM).",
    ),
]

EXAMPLES = (
    "Examples:  marlin quantize minilm out/minilm-w4  (bundled MiniLM, embedded calibration text)  |  "
    "marlin quantize ./llama out/llama-w4 --clip --act-order group  |  "
    "marlin quantize ./my-model out/w4 --calib data.jsonl --nsamples 256  |  "
    "marlin quantize ./llama out/llama-gptq --format gptq  (for vLLM)  |  "
    "marlin quantize ./llama out/llama-24 --sparse24  (2:4 sparse + 4-bit, SparseGPT)"
)


def quantize_command(
    model: Annotated[
        str, typer.Argument(help="Local model directory, hub id (owner/name), or 'minilm' (the bundled MiniLM).")
    ],
    output: OutputArg,
    preset: Annotated[
        str | None,
        typer.Option(help="Preset name (w4-g128, w4-g128-best, w4-channel, w4-g128-sparse24) or YAML file; flags win."),
    ] = None,
    group_size: Annotated[
        int | None,
        typer.Option("--group-size", help="Input channels per scale: -1 (per channel), 32, 64, 128. \\[default: 128]"),
    ] = None,
    act_order: Annotated[
        str | None,
        typer.Option(
            "--act-order",
            help="static: solve in descending-Hessian order, scales on the original groups (no run-time cost); "
            "group: groups follow that order and a K-permutation is stored; none: natural order. "
            "\\[default: static; none with --sparse24, which takes no other]",
        ),
    ] = None,
    clip: Annotated[
        bool | None,
        typer.Option(
            "--clip/--no-clip",
            help="Search shrunken scales by GPTQ's own error (with --act-order group or none each group's candidate "
            "scales run the solve over it: the most accurate recipe with --act-order group). \\[default: on; off "
            "with --method rtn and with --sparse24, where the search is slow on a CPU]",
        ),
    ] = None,
    damp: Annotated[
        float | None,
        typer.Option(
            help="Damping: fraction of the mean Hessian diagonal added to it, raised on failure. \\[default: 0.01]"
        ),
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(
            help="gptq (calibrated; SparseGPT with --sparse24), rtn (round to nearest, no calibration; with "
            "--sparse24 after magnitude 2:4 pruning) or magnitude (--sparse24 only: magnitude 2:4, then GPTQ; the "
            "baseline). \\[default: gptq]"
        ),
    ] = None,
    sparse24: Annotated[
        bool,
        typer.Option(
            "--sparse24",
            help="Prune to 2:4 sparsity (2 of every 4 consecutive input weights kept) while quantizing, and write the "
            "2:4 Marlin layout; layers it cannot take stay unquantized.",
        ),
    ] = False,
    calib: Annotated[
        str | None,
        typer.Option(
            help="Calibration text: 'embedded' (ships with marlin, offline; sampled by document, or by paragraph "
            "for a sentence-transformers model), a .txt/.jsonl/.parquet file, "
            "or a datasets hub name 'name[:config]:split:field'. \\[default: embedded]"
        ),
    ] = None,
    nsamples: Annotated[
        int | None,
        typer.Option(
            help="Calibration samples (documents or paragraphs, each truncated to --seqlen). \\[default: 128]"
        ),
    ] = None,
    seqlen: Annotated[
        int | None,
        typer.Option(
            help="Tokens per sample at most; capped by the model's maximum positions and, for a "
            "sentence-transformers model, its max_seq_length. \\[default: 2048]"
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for choosing the calibration samples. \\[default: 0]")] = None,
    device: DeviceOpt = None,
    max_shard_size: ShardOpt = "5GB",
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow the model's own Python code to run (off by default).")
    ] = False,
    revision: Annotated[str | None, typer.Option(help="Revision (branch, tag or commit) of a hub id MODEL.")] = None,
    output_format: FormatOpt = "marlin",
    force: ForceOpt = False,
    dry_run_: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print, from the config alone, the layers that would be quantized or kept and "
            "why, the output shards and the estimated peak memory; read no weights, write nothing.",
        ),
    ] = False,
    json_out: JsonOpt = False,
) -> None:
    """Quantize MODEL to 4-bit Marlin-format safetensors in OUTPUT, with GPTQ calibrated block by block
    (with --sparse24 also pruned to 2:4 by SparseGPT)."""
    from marlin_cli.config import CalibConfig, Method, QuantConfig, default_clip, read_preset
    from marlin_cli.io.checkpoint import parse_size
    from marlin_cli.pipeline import Job
    from marlin_cli.plan import dry_run

    given = {"group_size": group_size, "act_order": act_order, "clip": clip, "damp": damp, "method": method}
    given["sparse24"] = sparse24 or None  # the flag only turns it on; a preset may too
    settings: dict[str, Any] = read_preset(preset) if preset else {}
    settings.update({k: v for k, v in given.items() if v is not None})
    settings.setdefault("clip", default_clip(settings.get("method", "gptq"), settings.get("sparse24", False)))
    if Method(settings.get("method", "gptq")) is Method.RTN:  # a valid name: default_clip checked it
        if act_order is None:
            settings.pop("act_order", None)  # a preset's column order was for its calibrated solve
        flags = (("--calib", calib), ("--nsamples", nsamples), ("--seqlen", seqlen), ("--seed", seed), ("--damp", damp))
        if unused := [flag for flag, value in flags if value is not None]:
            err_console.print(f"note: {', '.join(unused)} unused: --method rtn does no calibration", highlight=False)
    sampling = {"source": calib, "nsamples": nsamples, "seqlen": seqlen, "seed": seed}
    job = Job(
        model=model,
        output=output,
        quant=QuantConfig(**settings),
        calib=CalibConfig(**{k: v for k, v in sampling.items() if v is not None}),
        device=device,
        max_shard_size=parse_size(max_shard_size),
        force=force,
        trust_remote_code=trust_remote_code,
        revision=revision,
        format=output_format,  # type: ignore[arg-type]  # validated by Job
    )
    if dry_run_:
        show_plan(dry_run(job), json_out)
    else:
        job.kernels = solver_kernels(job)
        run_job(job, json_out)


def solver_kernels(job: Job) -> Kernels | None:
    """GPTQ's column loop and clipping search on the CUDA kernels when the job runs on a GPU the kernels build for
    (built on first use, about a minute, then cached); None, the torch loops, otherwise (with a note when that GPU
    cannot take them)."""
    from marlin_cli.config import default_device
    from marlin_cli.kernel import ops

    device = default_device(job.device)
    if device.type != "cuda" or job.quant.block_size > ops.GPTQ_MAX_COLS:
        return None
    note_kernel_build(job.device)
    problem = ops.solver_problem(device)
    if problem is not None:
        note = f"note: GPTQ's column loop and clipping search run in torch, several times slower: {problem}"
        err_console.print(note, highlight=False)
        return None
    return ops.KERNELS


def show_plan(plan: dict[str, Any], json_out: bool) -> None:
    """The dry-run plan: JSON on stdout, or a table and summary lines on stderr."""
    if json_out:
        print_json(plan)
        return
    table = Table(title=f"{plan['model']} ({plan['architecture']}, {plan['blocks']}): dry run, nothing written")
    for col in ("layer", "K x N", "action", "why"):
        table.add_column(col, overflow="fold")
    for layer in plan["layers"]:
        shape = f"{layer['in_features']} x {layer['out_features']}"
        table.add_row(layer["name"], shape, layer["action"], layer["reason"] or "")
    err_console.print(table)
    err_console.print(
        f"{plan['shards']} shard(s), {plan['output_bytes'] / 1e9:.2f} GB; estimated peak memory: "
        f"GPU {plan['estimated_peak_gpu_gib']} GiB, host {plan['estimated_peak_host_gib']} GiB"
    )


def run_job(job: Any, json_out: bool, runner: Callable[..., dict[str, Any]] | None = None) -> None:
    """Run a quantize or pack job (`runner`, default the quantize pipeline) with progress bars, then print the
    summary (table, or JSON on stdout)."""
    from marlin_cli.pipeline import quantize
    from marlin_cli.repack import RepackJob

    source = job.source if isinstance(job, RepackJob) else job.model
    err_console.print(f"marlin {__version__}: {source} -> {job.output}", highlight=False, soft_wrap=True)
    with ProgressView(enabled=not json_out) as view:
        report = (runner or quantize)(job, view)
    if json_out:
        print_json(report)
        return
    q = report["quantization"]
    sparse = " 2:4 sparse" if q.get("sparse24") else ""
    table = Table(
        title=f"{job.output}: {q['method']}{sparse} 4-bit, group {q['group_size']}, {report.get('format', 'marlin')} "
        "format"
    )
    # with --sparse24 the RTN baseline is magnitude 2:4 + RTN, and calibrated runs also report magnitude 2:4 + GPTQ
    magnitude = any(layer.get("magnitude_error") is not None for layer in report["layers"])
    columns = ("error", "magnitude error", "RTN error") if magnitude else ("error", "RTN error")
    for col in ("layer", "shape (K x N)", "method", *columns, "note"):
        table.add_column(col, overflow="fold")
    keys = ("error", "magnitude_error", "rtn_error") if magnitude else ("error", "rtn_error")
    for layer in report["layers"]:
        errors = [f"{layer[k]:.4g}" if layer.get(k) is not None else "-" for k in keys]
        shape = f"{layer['in_features']} x {layer['out_features']}"
        table.add_row(layer["name"], shape, layer["method"] or "kept", *errors, layer["reason"] or "")
    err_console.print(table)
    s = report["summary"]
    ratio = f"{s['error_vs_rtn']:.3f}x RTN" if s["error_vs_rtn"] is not None else "n/a"
    if s.get("error_vs_magnitude") is not None:
        ratio += f", {s['error_vs_magnitude']:.3f}x magnitude 2:4"
    if "source_format" in report:  # a conversion: exact, or re-quantized with an added error
        ratio = f"{s['error_sum']:.4g} added by re-quantizing" if report["requantized"] else "0 (codes copied exactly)"
    err_console.print(
        f"{s['quantized']} layers quantized, {s['kept']} kept; summed error {ratio}; "
        f"{s['bytes'] / 1e6:.1f} MB written to {job.output} in {s['seconds']:.1f} s; peak memory {memory()}"
    )
