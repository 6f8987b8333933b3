"""The quantize driver: load -> capture -> solve -> pack -> write, block by block. Reports progress, never prints."""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from marlin_cli import __version__
from marlin_cli.algo.gptq import Kernels, gptq
from marlin_cli.algo.hessian import Hessian, weighted_error
from marlin_cli.algo.result import QuantResult, relative_error
from marlin_cli.algo.rtn import rtn
from marlin_cli.algo.scales import FP16_MAX, LARGEST_WEIGHT, absmax
from marlin_cli.algo.sparsegpt import magnitude_gptq, magnitude_rtn, sparsegpt
from marlin_cli.calib.capture import BlockInputs, capture_inputs, group_hessian, input_groups, run_block
from marlin_cli.calib.data import load_texts, token_samples
from marlin_cli.config import ActOrder, CalibConfig, Method, QuantConfig, default_device
from marlin_cli.errors import ModelError, NumericalError, UsageError
from marlin_cli.formats import compressed_tensors, marlin, marlin24
from marlin_cli.formats import gptq as gptq_format
from marlin_cli.io import checkpoint as ckpt
from marlin_cli.model.layout import (
    find_blocks,
    find_linears,
    in_out,
    outside_blocks,
    set_weight_matrix,
    weight_matrix,
)
from marlin_cli.model.load import (
    calibration_length,
    load_tensors,
    open_model,
    open_tokenizer,
    resolve,
    sentence_model_length,
)
from marlin_cli.model.run import inference


@dataclass
class Progress:
    stage: str
    done: int
    total: int
    detail: str = ""


ProgressFn = Callable[[Progress], None]


def host_memory(peak: bool) -> int:
    """This process's resident host memory in bytes, now or at its peak. On Linux from /proc/self/status (VmRSS,
    VmHWM), which start afresh with the process's program: getrusage's peak survives exec, so a marlin started by a
    large process (a test runner, a conversion script) would report that process's peak as its own."""
    field = "VmHWM:" if peak else "VmRSS:"
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    # elsewhere, the peak so far (ru_maxrss: bytes on macOS, KiB on other systems)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def peak_memory() -> dict[str, float | None]:
    """This process's peak resident host memory and the peak GPU memory torch allocated (None without a GPU), GiB."""
    gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {
        "peak_host_gib": round(host_memory(peak=True) / 2**30, 2),
        "peak_gpu_gib": None if gpu is None else round(gpu, 2),
    }


class OutputFormat(str, Enum):
    MARLIN = "marlin"  # ours: .B/.s/.perm (DESIGN.md 3.1)
    GPTQ = "gptq"  # qweight/qzeros/scales/g_idx, v1 zeros (DESIGN.md 3.3); vLLM serves it through its Marlin path
    COMPRESSED = "compressed-tensors"  # pack-quantized (DESIGN.md 3.4); vLLM serves it directly


def output_format(value: str) -> OutputFormat:
    """The --format value as an OutputFormat; UsageError naming the choices otherwise."""
    try:
        return OutputFormat(value)
    except ValueError:
        choices = "|".join(f.value for f in OutputFormat)
        raise UsageError(f"--format {value!r} is not one of {choices}") from None


@dataclass
class Job:
    """One `marlin quantize` (or RTN `marlin pack`) run."""

    model: str
    output: Path
    quant: QuantConfig
    calib: CalibConfig = field(default_factory=CalibConfig)
    device: str | None = None  # default: cuda when present, else cpu
    max_shard_size: int = 5 * 10**9
    force: bool = False
    trust_remote_code: bool = False
    revision: str | None = None
    format: OutputFormat = OutputFormat.MARLIN
    # The solve's column loop and clipping search on the job's device (algo.gptq.Kernels); None runs them in torch. The
    # CLI passes the CUDA kernels' (kernel.ops.KERNELS) when they build for the device.
    kernels: Kernels | None = None

    def __post_init__(self) -> None:
        self.format = output_format(self.format)
        check_format(self.format, self.quant, [])  # what the settings alone rule out, before a model is opened


@dataclass
class LayerReport:
    name: str
    in_features: int
    out_features: int
    status: str  # "quantized" or "kept"
    reason: str | None = None  # why kept, why it fell back to RTN, or what else the user should know
    method: str | None = None
    error: float | None = None  # ||X (W - Wq)^T||^2 / ||X W^T||^2 on the calibration inputs (weights only for RTN)
    rtn_error: float | None = None  # the same for RTN (with sparse24: magnitude 2:4 + RTN) on the same data
    magnitude_error: float | None = None  # sparse24 with calibration: the same for the magnitude 2:4 + GPTQ baseline
    damp: float | None = None
    seconds: float = 0.0

    def note(self, text: str) -> None:
        """Add `text` to the reason, after what it already says."""
        self.reason = f"{self.reason}; {text}" if self.reason else text


def quantize(job: Job, on_progress: ProgressFn = lambda p: None) -> dict[str, Any]:
    """Run the job and write the checkpoint; returns the report (also written as quantization_report.json)."""
    started = time.perf_counter()
    source = resolve(job.model, job.revision, job.trust_remote_code)
    ckpt.check_output(job.output, job.force, [source])
    on_progress(Progress("load", 0, 1, str(source)))
    loaded = open_model(source, job.trust_remote_code, job.revision, lazy=True)
    model = loaded.model
    blocks_name, blocks = find_blocks(model)
    if loaded.store is not None:
        load_tensors(model, loaded.store, skip=f"{blocks_name}.")  # embeddings, norms, head: blocks come one by one
    plan = plan_layers(blocks_name, blocks, job.quant)
    kept = [r.name for r in plan.values() if r.status == "kept"]
    check_format(job.format, job.quant, [find_linears(b) for b in blocks], kept)
    if not any(r.status == "quantized" for r in plan.values()):
        reasons = sorted({r.reason for r in plan.values() if r.reason})
        layout = "2:4 Marlin layout" if job.quant.sparse24 else "Marlin format"
        raise ModelError(f"{source}: no layer has a shape the {layout} accepts ({'; '.join(reasons)})")
    on_progress(Progress("load", 1, 1, str(source)))

    device = default_device(job.device)
    # the dtypes to write back; not the tensors themselves, which on a CPU would keep the originals of the float
    # copies below alive for the whole run
    dtypes = {k: v.dtype for k, v in model.state_dict().items() if not k.startswith(f"{blocks_name}.")}
    outside = set(dtypes)  # dtypes takes the blocks' names too as they come
    if device.type == "cpu":  # half-precision matmuls on the CPU are slow or missing
        for t in outside_blocks(model, blocks_name):
            if t.is_floating_point():
                t.data = t.data.float()

    inputs, tokens = None, 0
    if job.quant.method is not Method.RTN:
        inputs, tokens = _calibration_inputs(
            job, source, loaded.config, model, blocks_name, blocks, device, on_progress
        )

    quantized = packed_layers(plan)
    tied = tied_names(model)
    solved: list[str] = []
    total = sum(r.status == "quantized" for r in plan.values())

    def on_layer(name: str) -> None:
        solved.append(name)
        on_progress(Progress("layers", len(solved), total, name))

    # Shards are written as they fill, block by block: the host never holds the whole output.
    with ckpt.staging_dir(job.output, job.force) as tmp, inference():
        writer = ckpt.ShardWriter(tmp, job.output, job.max_shard_size)

        def keep(tensors: dict[str, torch.Tensor]) -> None:
            """Into the checkpoint as they were, in their original dtypes."""
            for name, t in tensors.items():
                if name not in tied:
                    writer.add(name, t.to(dtypes[name]))

        keep({k: v for k, v in model.state_dict().items() if k in outside})
        for b, block in enumerate(blocks):
            on_progress(Progress("quantize", b, len(blocks), f"block {b + 1}/{len(blocks)}"))
            prefix = f"{blocks_name}.{b}"
            if loaded.store is not None:
                load_tensors(block, loaded.store, f"{prefix}.")
            originals = {f"{prefix}.{k}": v for k, v in block.state_dict().items()}
            dtypes.update({k: v.dtype for k, v in originals.items()})
            block.to(device)
            if device.type == "cpu":
                block.float()
            packed: dict[str, torch.Tensor] = {}
            _quantize_block(prefix, block, inputs, job, plan, packed, on_layer)
            block.to_empty(device="meta")  # done: its outputs feed the next block, its tensors go to the writer
            keep({k: v for k, v in originals.items() if k.removesuffix(".weight") not in quantized})
            for name, t in packed.items():
                writer.add(name, t)
        on_progress(Progress("quantize", len(blocks), len(blocks), "done"))

        report = {
            "marlin_cli_version": __version__,
            "model": job.model,
            "source": str(source),
            "format": job.format.value,
            "quantization": job.quant.to_dict(),
            "calibration": {**job.calib.to_dict(), "tokens": tokens} if inputs is not None else None,
            "device": str(device),
            "layers": [asdict(r) for r in plan.values()],
        }
        on_progress(Progress("write", 0, 1, str(job.output)))
        _write(job, loaded, model, writer, plan, report, started)
    on_progress(Progress("write", 1, 1, str(job.output)))
    return report


def tied_names(model: nn.Module) -> set[str]:
    """Names of parameters that are another's (tied weights: a head that shares the embedding): stored once, under
    the first name; loaders re-tie them."""
    first: set[int] = set()
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied.add(name)
        first.add(id(p))
    return tied


def plan_layers(blocks_name: str, blocks: nn.ModuleList, cfg: QuantConfig) -> dict[str, LayerReport]:
    """Every block linear, marked quantized or kept (with the reason) before any work."""
    plan = {}
    for b, block in enumerate(blocks):
        for name, module in find_linears(block).items():
            k, n = in_out(module)
            full = f"{blocks_name}.{b}.{name}"
            problem = (marlin24 if cfg.sparse24 else marlin).shape_problem(k, n, cfg.group_size)
            plan[full] = LayerReport(full, k, n, "kept" if problem else "quantized", reason=problem)
        for name, param in block.named_parameters():
            if param.dim() == 3:  # MoE experts fused into one (experts, ., .) tensor, as transformers 5 stores them
                shape = tuple(param.shape)
                reason = f"{shape[0]} fused experts {shape}: not Linear layers, kept in the original dtype"
                full = f"{blocks_name}.{b}.{name}"
                plan[full] = LayerReport(full, shape[2], shape[1], "kept", reason=reason)
    return plan


def _calibration_inputs(
    job: Job,
    source: Path,
    config: Any,
    model: nn.Module,
    blocks_name: str,
    blocks: nn.ModuleList,
    device: torch.device,
    on_progress: ProgressFn,
) -> tuple[BlockInputs, int]:
    tokenizer = open_tokenizer(source)
    seqlen = calibration_length(job.calib.seqlen, config, source)
    # a sentence-transformers model embeds sentences and paragraphs, not documents
    by_paragraph = job.calib.source == "embedded" and sentence_model_length(source) is not None
    unit = " paragraphs" if by_paragraph else ""
    what = f"{job.calib.nsamples} samples of at most {seqlen} tokens from {job.calib.source}{unit}"
    on_progress(Progress("calibrate", 0, 1, what))
    texts = load_texts(job.calib.source, by_paragraph)
    samples = token_samples(texts, tokenizer, job.calib.nsamples, seqlen, job.calib.seed)
    with inference():
        inputs = capture_inputs(model, blocks_name, blocks, samples, device)
    on_progress(Progress("calibrate", 1, 1, what))
    return inputs, sum(s.numel() for s in samples)


def _quantize_block(
    prefix: str,
    block: nn.Module,
    inputs: BlockInputs | None,
    job: Job,
    plan: dict[str, LayerReport],
    packed: dict[str, torch.Tensor],
    on_layer: Callable[[str], None],
) -> None:
    """Quantize one block in true-sequential order; then replace `inputs` by the quantized block's outputs."""
    cfg = job.quant
    linears = find_linears(block)
    groups = input_groups(block, linears, inputs) if inputs is not None else [[n] for n in linears]
    unreached = [n for n in linears if not any(n in g for g in groups)]
    for group in groups + [[n] for n in unreached]:
        todo = [n for n in group if plan[f"{prefix}.{n}"].status == "quantized"]
        if not todo:
            continue
        hessian = None
        if inputs is not None and group[0] not in unreached:
            k, _ = in_out(linears[group[0]])
            hessian = group_hessian(block, linears[group[0]], k, inputs)
        for name in todo:
            report = plan[f"{prefix}.{name}"]
            if inputs is not None and hessian is None:
                report.note("not reached by the calibration data: RTN")
            result = _solve(linears[name], hessian, cfg, report, job.kernels)
            packed.update(pack_layer(job.format, f"{prefix}.{name}", result, cfg.sparse24))
            on_layer(f"{prefix}.{name}")
    if inputs is not None:
        for i in range(len(inputs.hidden)):
            inputs.hidden[i] = run_block(block, inputs, i)


def _solve(
    module: nn.Module, hessian: Hessian | None, cfg: QuantConfig, report: LayerReport, kernels: Kernels | None
) -> QuantResult:
    """Quantize one layer, write its dequantized weights back (later layers calibrate on them) and fill `report`."""
    started = time.perf_counter()
    w = weight_matrix(module).float()
    if float(absmax(w.reshape(-1), 0)) > LARGEST_WEIGHT:  # e.g. bf16 outliers: the layer is still stored, and says so
        report.note(f"weights beyond {LARGEST_WEIGHT:.3g} saturate: fp16 scales are clamped to {FP16_MAX:g}")
    baseline = (magnitude_rtn if cfg.sparse24 else rtn)(w, cfg.group_size, cfg.clip and hessian is None)
    result = baseline
    if hessian is not None:
        if hessian.tokens < w.shape[1]:  # H = (2/n) sum x x^T has rank at most n
            report.note(
                f"{hessian.tokens} calibration tokens, fewer than its {w.shape[1]} inputs: give more "
                "(--calib, --nsamples)"
            )
        try:
            result = _calibrated(cfg, kernels)(w, hessian.matrix, cfg)
        except NumericalError as e:
            report.note(f"{e}: RTN")
    report.method = method_name(cfg) if result is not baseline else "rtn"
    report.damp = result.damp if result is not baseline else None
    dequantized = result.weight().contiguous()  # laid out as w: reading both in order, not one across (CPU: 3x)
    if hessian is not None:
        # the solves bring their own weighted errors (QuantResult.weighted_error): one N x K x K product fewer each
        def error_of(r: QuantResult, r_weight: torch.Tensor) -> float:
            if r.weighted_error is not None:
                return r.weighted_error
            return weighted_error(w - r_weight, hessian.matrix, tf32=True)

        total = weighted_error(w, hessian.matrix, tf32=True)
        report.error = error_of(result, dequantized) / total
        # RTN's error is the result's own where the solve fell back to it
        report.rtn_error = report.error if result is baseline else error_of(baseline, baseline.weight()) / total
        if result is not baseline and report.method == "sparsegpt":  # the baseline SparseGPT must beat
            magnitude = magnitude_gptq(w, hessian.matrix, cfg, kernels)
            report.magnitude_error = error_of(magnitude, magnitude.weight()) / total
    else:
        report.error = report.rtn_error = relative_error(w, dequantized)
    set_weight_matrix(module, dequantized)
    report.seconds = round(time.perf_counter() - started, 4)
    return result


def _calibrated(
    cfg: QuantConfig, kernels: Kernels | None
) -> Callable[[torch.Tensor, torch.Tensor, QuantConfig], QuantResult]:
    """The calibrated solver of `cfg` (with `kernels` for its loops): GPTQ, SparseGPT (sparse24) or the magnitude 2:4
    baseline."""
    if cfg.method is Method.MAGNITUDE:
        return partial(magnitude_gptq, kernels=kernels)
    return partial(sparsegpt if cfg.sparse24 else gptq, kernels=kernels)


def method_name(cfg: QuantConfig) -> str:
    """What the report calls the method of `cfg`: gptq, sparsegpt, magnitude or rtn."""
    return "sparsegpt" if cfg.sparse24 and cfg.method is Method.GPTQ else cfg.method.value


def _pack_marlin(result: QuantResult) -> dict[str, torch.Tensor]:
    out = {"B": marlin.pack_weight(result.codes), "s": marlin.pack_scales(result.scales)}
    if result.perm is not None:
        out["perm"] = result.perm.to(torch.int32)
    return out


def _layer(result: QuantResult) -> gptq_format.Layer:
    return gptq_format.Layer(result.codes, result.scales, result.perm)


# One packing step for every output format: per-layer tensors, named relative to the layer.
PACKERS: dict[OutputFormat, Callable[[QuantResult], dict[str, torch.Tensor]]] = {
    OutputFormat.MARLIN: _pack_marlin,
    OutputFormat.GPTQ: lambda r: gptq_format.to_gptq(_layer(r), "gptq"),
    OutputFormat.COMPRESSED: lambda r: compressed_tensors.to_compressed(_layer(r)),
}


def pack_layer(fmt: OutputFormat, name: str, result: QuantResult, sparse24: bool = False) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of one quantized layer in `fmt` (the 2:4 layout when `sparse24`), named
    `<name>.<tensor>`, on the CPU. Packs on the result's device: a Llama-3-70B-shaped block's seven layers took
    1.13 s on the CPU, 0.27 s on the H200."""
    tensors = marlin24.pack(result.codes, result.scales) if sparse24 else PACKERS[OutputFormat(fmt)](result)
    return {f"{name}.{key}": t.cpu() for key, t in tensors.items()}


def check_format(
    fmt: OutputFormat, cfg: QuantConfig, linears: list[dict[str, nn.Module]], kept: list[str] | None = None
) -> None:
    """Refuse, before any work, settings that `fmt` cannot carry; `kept`: block layers that stay unquantized."""
    if cfg.sparse24 and fmt is not OutputFormat.MARLIN:
        raise UsageError(
            f"--format {fmt.value} with --sparse24: that format has no 2:4 layout (its readers take dense 4-bit "
            "weights); 2:4 checkpoints are written in the marlin format (leave --format out) and run on MarlinLinear"
        )
    if fmt is OutputFormat.GPTQ and kept:
        # GPTQ loaders expect qweight for every linear layer of a block; a dense one there would not load
        raise UsageError(
            f"--format gptq needs every block layer quantized, but {len(kept)} cannot be ({kept[0]}, ...); "
            "use --format compressed-tensors (which lists them as ignored) or marlin"
        )
    if fmt is not OutputFormat.COMPRESSED:
        return
    if cfg.act_order is ActOrder.GROUP:
        raise UsageError(
            "--format compressed-tensors with --act-order group: compressed-tensors (0.20 and later) no longer reads "
            "actorder 'group' (weight_g_idx); quantize with --act-order static (same accuracy gain, no permutation), "
            "convert a desc_act checkpoint with --requantize (RTN in the natural order), or use --format gptq, whose "
            "desc_act layout vLLM still serves"
        )
    conv = sorted({type(m).__name__ for block in linears for m in block.values() if not isinstance(m, nn.Linear)})
    if conv:
        raise UsageError(
            f"--format compressed-tensors targets torch Linear layers, but this model's layers are {', '.join(conv)} "
            "(weights stored transposed); use --format gptq or marlin"
        )


def quantization_config(
    cfg: QuantConfig,
    plan: dict[str, LayerReport],
    fmt: OutputFormat = OutputFormat.MARLIN,
    ignore: list[str] | None = None,
) -> dict[str, Any]:
    """The `quantization_config` entry of config.json for `fmt`; `ignore`: unquantized Linear modules."""
    if fmt is OutputFormat.GPTQ:
        return {
            "quant_method": "gptq",
            "checkpoint_format": "gptq",  # v1 zeros (stored minus one), what every GPTQ reader takes
            "bits": cfg.bits,
            "group_size": cfg.group_size,
            "desc_act": cfg.act_order is ActOrder.GROUP,  # True: g_idx is not monotone
            "sym": True,
            "static_groups": False,
            "true_sequential": True,
            "lm_head": False,
        }
    if fmt is OutputFormat.COMPRESSED:
        weights = {
            "num_bits": cfg.bits,
            "type": "int",
            "symmetric": True,
            "strategy": "channel" if cfg.group_size == -1 else "group",
            "group_size": None if cfg.group_size == -1 else cfg.group_size,
            "actorder": {ActOrder.STATIC: "weight", ActOrder.GROUP: "group"}.get(cfg.act_order),
            "dynamic": False,
            "observer": "minmax",
        }
        return {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None}},
            "ignore": sorted(ignore or []),
        }
    return _marlin_config(cfg, plan)


def _marlin_config(cfg: QuantConfig, plan: dict[str, LayerReport]) -> dict[str, Any]:
    quantized = {r.name: [r.in_features, r.out_features] for r in plan.values() if r.status == "quantized"}
    return {
        "quant_method": "marlin",
        "format": "marlin_24" if cfg.sparse24 else "marlin",
        "sparsity": "2:4" if cfg.sparse24 else None,  # 2:4: every quantized layer is stored as .B_24/.B_meta/.s
        "bits": cfg.bits,
        "group_size": cfg.group_size,
        "desc_act": cfg.act_order is ActOrder.GROUP,  # True: the checkpoint stores a K-permutation per layer
        "act_order": cfg.act_order.value,
        "method": cfg.method.value,
        "sym": True,
        "quantized_modules": quantized,  # name -> [in_features, out_features]
        "ignored_modules": {r.name: r.reason for r in plan.values() if r.status == "kept"},
    }


def packed_layers(plan: dict[str, LayerReport]) -> set[str]:
    """Names of the layers whose weight the checkpoint stores quantized."""
    return {r.name for r in plan.values() if r.status == "quantized"}


def _write(
    job: Job,
    loaded: Any,
    model: nn.Module,
    writer: ckpt.ShardWriter,
    plan: dict[str, LayerReport],
    report: dict[str, Any],
    started: float,
) -> None:
    """The model's config with the quantization_config and the summary of the layers, then finish_checkpoint."""
    with ckpt.writing(job.output):
        loaded.config.save_pretrained(writer.directory)  # transformers' own serialization of the config
    config = json.loads((writer.directory / "config.json").read_text())
    done = packed_layers(plan)
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in done]
    config["quantization_config"] = quantization_config(job.quant, plan, job.format, ignore)
    quantized = [r for r in plan.values() if r.status == "quantized"]
    err = sum(r.error or 0 for r in quantized)
    rtn_err = sum(r.rtn_error or 0 for r in quantized)
    magnitude_err = sum(r.magnitude_error or 0 for r in quantized)
    summary = {
        "quantized": len(quantized),
        "kept": len(plan) - len(quantized),
        "error_sum": err,
        "rtn_error_sum": rtn_err,
        "error_vs_rtn": err / rtn_err if rtn_err else None,
        "error_vs_magnitude": err / magnitude_err if magnitude_err else None,
    }
    finish_checkpoint(writer, job.output, job.format, config, loaded.path, report, summary, started)


def finish_checkpoint(
    writer: ckpt.ShardWriter,
    output: Path,
    fmt: OutputFormat,
    config: dict[str, Any],
    source: Path,
    report: dict[str, Any],
    summary: dict[str, Any],
    started: float,
) -> None:
    """Into the writer's directory: the last shard and the index, config.json (`config`, holding the
    quantization_config; for GPTQ also quantize_config.json), the source's tokenizer and generation files, and the
    report with its files and `summary`, to which bytes, seconds and peak memory are added."""
    sums = writer.finish()
    tmp = writer.directory
    with ckpt.writing(output):
        ckpt.write_json(tmp / "config.json", config)
        if fmt is OutputFormat.GPTQ:  # older GPTQ readers look here instead of config.json
            ckpt.write_json(tmp / "quantize_config.json", config["quantization_config"])
        report["files"] = {"shards": sums, "copied": ckpt.copy_side_files(source, tmp)}
        seconds = round(time.perf_counter() - started, 2)
        report["summary"] = {**summary, "bytes": writer.total_bytes, "seconds": seconds, **peak_memory()}
        ckpt.write_json(tmp / ckpt.REPORT, report)
