"""Convert an already-quantized checkpoint (GPTQ, compressed-tensors pack-quantized) layer by layer, no calibration.

Symmetric 4-bit layers convert exactly (codes copied, scales unchanged); anything else needs `requantize`, which
re-quantizes the dequantized weights with RTN and reports the added error. With `sparse24`, one of our own dense
Marlin checkpoints is re-quantized to 2:4 (magnitude 2:4 + RTN of its dequantized weights). Reports progress, never
prints.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from marlin_cli import __version__
from marlin_cli.algo.result import QuantResult, relative_error
from marlin_cli.algo.rtn import rtn
from marlin_cli.algo.sparsegpt import magnitude_rtn
from marlin_cli.config import ActOrder, Method, QuantConfig, default_device
from marlin_cli.errors import CheckpointError, MarlinError, UsageError
from marlin_cli.formats import compressed_tensors, gptq, marlin, marlin24
from marlin_cli.io import checkpoint as ckpt
from marlin_cli.pipeline import (
    LayerReport,
    OutputFormat,
    Progress,
    ProgressFn,
    check_format,
    finish_checkpoint,
    pack_layer,
)
from marlin_cli.pipeline import quantization_config as make_config

GPTQ, COMPRESSED, MARLIN = "gptq", "compressed-tensors", "marlin"
# per source kind: the tensor that marks a quantized layer, the layer's tensors, and its scales
KEYS = {
    GPTQ: ("qweight", gptq.TENSORS, "scales"),
    COMPRESSED: ("weight_packed", compressed_tensors.TENSORS, "weight_scale"),
    MARLIN: ("B", ("B", "s", "perm"), "s"),
}


@dataclass
class RepackJob:
    source: Path
    output: Path
    format: OutputFormat = OutputFormat.MARLIN
    requantize: bool = False
    sparse24: bool = False  # re-quantize a dense Marlin checkpoint to 2:4
    group_size: int | None = None  # only with requantize or sparse24 (default 128); an exact copy keeps the source's
    clip: bool = False  # only with requantize or sparse24: squared-error clipping search of the RTN scales
    device: str | None = None  # where each layer is decoded and converted; default: cuda when present, else cpu
    max_shard_size: int = 5 * 10**9
    force: bool = False

    def __post_init__(self) -> None:
        check_format(self.format, QuantConfig(sparse24=self.sparse24), [])  # what the settings alone rule out, up front

    @property
    def new_group_size(self) -> int:
        """The group size of re-quantized layers."""
        return QuantConfig.group_size if self.group_size is None else self.group_size


@dataclass(frozen=True)
class Source:
    """What kind of quantized checkpoint a directory holds, and the per-layer settings that matter."""

    kind: str  # GPTQ, COMPRESSED or MARLIN
    bits: int
    sym: bool
    checkpoint_format: str  # GPTQ zero convention: "gptq" (v1) or "gptq_v2"
    group_size: int | None  # from the config (-1: one group per layer); None when it does not say


def _method(path: Path) -> tuple[str, dict[str, Any]]:
    """The checkpoint's quant_method ("" for a dense one) and its quantization config."""
    qc = _read(path / "config.json").get("quantization_config") or _read(path / "quantize_config.json")
    if not isinstance(qc, dict) or not qc:
        return "", {}
    return str(qc.get("quant_method", "gptq" if "bits" in qc else "")).lower(), qc


def is_export(path: Path) -> bool:
    """Whether `path` holds a GPTQ or compressed-tensors checkpoint (ours or another tool's), by its config."""
    return path.is_dir() and _method(path)[0] in (GPTQ, COMPRESSED)


def source_format(path: Path) -> Source | None:
    """The quantized format of the checkpoint in `path`, or None for a dense one; CheckpointError if unsupported."""
    method, qc = _method(path)
    if not method:
        return None
    if method == GPTQ:
        fmt = _field(path, qc, "checkpoint_format", str, "gptq")
        bits, sym, size = _field(path, qc, "bits", int, 4), _field(path, qc, "sym", bool, True), _group(path, qc)
        return Source(GPTQ, _bits(path, bits), sym, fmt, size)
    if method == COMPRESSED:
        if qc.get("format") != "pack-quantized":
            raise CheckpointError(
                f"{path}: compressed-tensors format {qc.get('format')!r}; only pack-quantized converts"
            )
        groups = qc.get("config_groups")
        weights = [g.get("weights") for g in groups.values() if isinstance(g, dict)] if isinstance(groups, dict) else []
        if not weights or not all(isinstance(w, dict) for w in weights):
            raise CheckpointError(f"{path}: compressed-tensors config_groups hold no weights scheme")
        if len({json.dumps(w, sort_keys=True) for w in weights}) != 1:
            raise CheckpointError(f"{path}: compressed-tensors config_groups must share one weights scheme")
        w = weights[0]
        size = -1 if w.get("strategy") == "channel" else _group(path, w)
        bits, sym = _field(path, w, "num_bits", int, 4), _field(path, w, "symmetric", bool, True)
        return Source(COMPRESSED, _bits(path, bits), sym, "", size)
    if method == "marlin":
        if qc.get("sparsity"):
            raise CheckpointError(f"{path}: already a {qc['sparsity']} sparse Marlin checkpoint; nothing to convert")
        return Source(MARLIN, 4, True, "", _group(path, qc))
    raise CheckpointError(f"{path}: quant_method {method!r} is not one marlin reads (gptq, compressed-tensors)")


def _field(path: Path, qc: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """qc[key] when it has the JSON type `kind`, `default` when absent or null; CheckpointError otherwise."""
    value = qc.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointError(f"{path}: quantization_config {key} is {value!r}, not a {kind.__name__}")
    return value


def _bits(path: Path, bits: int) -> int:
    if bits not in (2, 3, 4, 8):
        raise CheckpointError(f"{path}: quantization_config bits {bits} is not one of 2, 3, 4, 8")
    return bits


def _group(path: Path, qc: dict[str, Any]) -> int | None:
    """The config's group_size: -1 (per channel) or positive; None when it does not say."""
    size = _field(path, qc, "group_size", int, None)
    if size is not None and size != -1 and size <= 0:
        raise CheckpointError(f"{path}: quantization_config group_size {size} is neither -1 nor positive")
    return size


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not valid JSON") from None
    return data if isinstance(data, dict) else {}


def repack(job: RepackJob, on_progress: ProgressFn = lambda p: None) -> dict[str, Any]:
    """Convert the checkpoint; returns the report (also written as quantization_report.json)."""
    started = time.perf_counter()
    ckpt.check_output(job.output, job.force, [job.source])
    src = source_format(job.source)
    if src is None:
        raise UsageError(f"{job.source}: not a GPTQ, compressed-tensors or Marlin checkpoint")
    if (src.kind == MARLIN) != job.sparse24:
        raise CheckpointError(
            f"{job.source}: already a Marlin checkpoint; nothing to convert (--sparse24 re-quantizes it to 2:4)"
            if src.kind == MARLIN
            else f"{job.source}: a {src.kind} checkpoint; --sparse24 takes a dense fp16/bf16 model or marlin's own "
            "dense Marlin checkpoint: convert it with `marlin pack` first, then run `marlin pack --sparse24` on that"
        )
    if not (job.requantize or job.sparse24):
        given = [flag for flag, on in (("--group-size", job.group_size is not None), ("--clip", job.clip)) if on]
        if given:
            raise UsageError(
                f"{' and '.join(given)}: {job.source} converts exactly, its codes and scales copied as they are; "
                f"to apply {'them' if len(given) > 1 else 'it'}, add --requantize (RTN of its dequantized weights)"
            )
    device = default_device(job.device)
    store = ckpt.Checkpoint(job.source)
    _, suffixes, scales = KEYS[src.kind]
    prefixes = quantized_layers(store, src)
    plan: dict[str, LayerReport] = {}
    converted: list[tuple[str, int, int, bool]] = []  # (layer, K, scale groups, permuted) of each converted layer
    source_names = {f"{p}.{s}" for p in prefixes for s in suffixes}
    # Each layer is written as soon as it is converted: the host holds one shard, not the whole checkpoint.
    with ckpt.staging_dir(job.output, job.force) as tmp:
        writer = ckpt.ShardWriter(tmp, job.output, job.max_shard_size)
        for i, prefix in enumerate(prefixes):
            on_progress(Progress("layers", i, len(prefixes), prefix))
            tensors = layer_tensors(store, src, prefix, device)
            report, result, weight = _convert(src, prefix, tensors, job)
            plan[prefix] = report
            if result is None:
                check_format(job.format, QuantConfig(sparse24=job.sparse24), [], [prefix])  # gptq: no dense layers
                writer.add(f"{prefix}.weight", weight.to("cpu", tensors[scales].dtype))
                continue
            if result.perm is not None:
                # the checkpoint will be act-order group: refuse a format without it now, not after every layer
                check_format(job.format, QuantConfig(act_order=ActOrder.GROUP), [])
            converted.append((prefix, result.codes.shape[0], result.scales.shape[0], result.perm is not None))
            _check_group(job, src, converted)
            for name, t in pack_layer(job.format, prefix, result, job.sparse24).items():
                writer.add(name, t)
        on_progress(Progress("layers", len(prefixes), len(prefixes), "done"))
        if not converted:
            raise CheckpointError(f"{job.source}: no layer has a shape the Marlin format accepts")
        cfg = _settings(job, src, converted)
        if cfg.act_order is ActOrder.GROUP and job.format is OutputFormat.MARLIN:
            # desc_act applies to every layer of a Marlin checkpoint: the others get the identity permutation
            for prefix, k, _, permuted in converted:
                if not permuted:
                    writer.add(f"{prefix}.perm", torch.arange(k, dtype=torch.int32))
        others = [n for n in store.names() if n not in source_names]
        for name in others:
            writer.add(name, store.tensor(name))
        kept = [p for p, r in plan.items() if r.status == "kept"]
        matrices = [
            n.removesuffix(".weight") for n in others if n.endswith(".weight") and len(store.entry(n)["shape"]) == 2
        ]
        report = {
            "marlin_cli_version": __version__,
            "model": str(job.source),
            "source": str(job.source),
            "source_format": asdict(src),
            "format": job.format.value,
            "quantization": cfg.to_dict(),
            "requantized": job.requantize or job.sparse24,
            "layers": [asdict(r) for r in plan.values()],
        }
        on_progress(Progress("write", 0, 1, str(job.output)))
        _write(job, writer, make_config(cfg, plan, job.format, sorted(kept + matrices)), plan, report, started)
    on_progress(Progress("write", 1, 1, str(job.output)))
    return report


def _convert(
    src: Source, prefix: str, tensors: dict[str, torch.Tensor], job: RepackJob
) -> tuple[LayerReport, QuantResult | None, torch.Tensor]:
    """One layer: its report, our QuantResult (None when its shape stays dense) and its dequantized (N, K) weight."""
    started = time.perf_counter()
    weight = dequantize(src, prefix, tensors)
    n, k = weight.shape
    report = LayerReport(prefix, k, n, "quantized")
    requantize = job.requantize or job.sparse24
    if requantize:
        g = job.new_group_size
    else:
        groups = tensors["scales"].shape[0] if src.kind == GPTQ else tensors["weight_scale"].shape[1]
        g = group_size(src, prefix, k, groups or 1)
    problem = (marlin24 if job.sparse24 else marlin).shape_problem(k, n, g)
    if problem is not None and (requantize or "group size" not in problem):
        report.status, report.reason = "kept", f"{problem}: stored dequantized"
        return report, None, weight
    if problem is not None:
        raise CheckpointError(f"{prefix}: {problem}; re-quantize with --requantize (and --group-size)")
    if requantize:
        # weight is (K, N) in memory, as result.weight() is (a cheap error); RTN and the 2:4 mask read (N, K) rows
        result = (magnitude_rtn if job.sparse24 else rtn)(weight.contiguous(), g, job.clip)
        report.method = "rtn"
        report.error = report.rtn_error = relative_error(weight, result.weight())
    else:
        try:
            result = exact(src, prefix, tensors)
        except MarlinError as e:
            raise CheckpointError(f"{job.source}: {e}") from None
        if not torch.equal(result.weight(), weight):  # the conversion must not change a single weight
            raise CheckpointError(f"{prefix}: converted weights differ from the source's; this is a bug, report it")
        report.method, report.error, report.rtn_error = "copied", 0.0, None
    report.seconds = round(time.perf_counter() - started, 4)
    return report, result, weight


def quantized_layers(store: ckpt.Checkpoint, src: Source) -> list[str]:
    """The names of the checkpoint's quantized layers (those with a qweight, weight_packed or B tensor), sorted."""
    marker = KEYS[src.kind][0]
    prefixes = sorted(n.removesuffix(f".{marker}") for n in store.names() if n.endswith(f".{marker}"))
    if not prefixes:
        raise CheckpointError(f"{store.path}: quantization_config says {src.kind}, but no tensor ends in .{marker}")
    return prefixes


def layer_tensors(
    store: ckpt.Checkpoint, src: Source, prefix: str, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor]:
    """A quantized layer's stored tensors by suffix (qweight, scales, ...) on `device`; CheckpointError without its
    scales or with damaged ones."""
    marker, suffixes, scales = KEYS[src.kind]
    if f"{prefix}.{scales}" not in store.file_of:
        raise CheckpointError(f"tensor {prefix}.{scales} is missing: {prefix}.{marker} cannot be read without it")
    for name, dtypes in ((f"{prefix}.{marker}", ("I32",)), (f"{prefix}.{scales}", ("F16", "BF16", "F32"))):
        entry = store.entry(name)
        if entry["dtype"] not in dtypes or len(entry["shape"]) != 2:
            raise CheckpointError(f"tensor {name} is {entry['dtype']} {entry['shape']}, not a 2-D {'/'.join(dtypes)}")
    tensors = {s: store.tensor(f"{prefix}.{s}").to(device) for s in suffixes if f"{prefix}.{s}" in store.file_of}
    problem = scales_problem(f"{prefix}.{scales}", tensors[scales])
    if problem is not None:
        raise CheckpointError(f"{store.path}: {problem}: the checkpoint is damaged; re-export it")
    return tensors


def scales_problem(tensor: str, s: torch.Tensor) -> str | None:
    """Symmetric 4-bit scales, and an asymmetric format's, are finite and positive: a zero, negative or NaN one is
    damage, whatever it computes."""
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        return f"tensor {tensor} has scales that are not finite and positive"
    return None


def exact(src: Source, prefix: str, tensors: dict[str, torch.Tensor]) -> QuantResult:
    """A symmetric 4-bit GPTQ or compressed-tensors layer's codes, scales and permutation, copied exactly;
    MarlinError naming what else it is."""
    if src.kind == GPTQ:
        layer = gptq.from_gptq(tensors, prefix, src.bits, src.checkpoint_format)
    else:
        layer = compressed_tensors.from_compressed(tensors, prefix, src.bits, src.sym)
    return QuantResult(layer.codes, layer.scales, layer.perm)


def dequantize(src: Source, prefix: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """The layer's dequantized (N, K) float32 weight in the original input order."""
    if src.kind == GPTQ:
        return gptq.dequantize(tensors, prefix, src.bits, src.checkpoint_format)
    if src.kind == COMPRESSED:
        return compressed_tensors.dequantize(tensors, prefix, src.bits)
    perm = tensors["perm"].long() if "perm" in tensors else None
    return QuantResult(marlin.unpack_weight(tensors["B"]), marlin.unpack_scales(tensors["s"]).float(), perm).weight()


def group_size(src: Source, prefix: str, k: int, groups: int) -> int:
    """The layer's group size: the config's when it agrees with the scales, else what the scales imply."""
    if src.group_size is not None:
        if groups != (1 if src.group_size in (-1, k) else k // src.group_size):
            raise CheckpointError(
                f"{prefix}: {groups} scale groups disagree with the config's group_size {src.group_size}"
            )
        return -1 if src.group_size == k else src.group_size
    return implied_group(k, groups)


def implied_group(k: int, groups: int) -> int:
    """The group size of a layer of K input channels stored with `groups` scale rows when no config says it."""
    return -1 if groups == 1 else k // groups


def _check_group(job: RepackJob, src: Source, converted: list[tuple[str, int, int, bool]]) -> None:
    """A checkpoint's config holds one group size: when an exact copy's source config does not say it, the last
    converted layer (layer, K, scale groups, permuted) must imply the first one's, refused at that layer, not after
    all of them."""
    if job.requantize or job.sparse24 or src.group_size is not None:
        return
    (first, k0, g0, _), (last, k, g, _) = converted[0], converted[-1]
    if implied_group(k, g) != implied_group(k0, g0):
        raise CheckpointError(
            f"{job.source}: {last} has group size {implied_group(k, g)} but {first} has {implied_group(k0, g0)}; "
            "a checkpoint holds one group size: re-quantize with --requantize (and --group-size)"
        )


def _settings(job: RepackJob, src: Source, converted: list[tuple[str, int, int, bool]]) -> QuantConfig:
    """The one group size (_check_group saw to it) and the act-order of the converted layers (layer, K, scale groups,
    permuted)."""
    if job.requantize or job.sparse24:
        size = job.new_group_size
    elif src.group_size is not None:
        size = src.group_size
    else:
        _, k, groups, _ = converted[0]
        size = implied_group(k, groups)
    return QuantConfig(
        group_size=size,
        act_order=ActOrder.GROUP if any(permuted for *_, permuted in converted) else ActOrder.NONE,
        method=Method.RTN if job.requantize or job.sparse24 else Method.GPTQ,
        sparse24=job.sparse24,
    )


def _write(
    job: RepackJob,
    writer: ckpt.ShardWriter,
    qc: dict[str, Any],
    plan: dict[str, LayerReport],
    report: dict[str, Any],
    started: float,
) -> None:
    """The source's config with `qc` and the summary of the layers, then finish_checkpoint."""
    config = {**_read(job.source / "config.json"), "quantization_config": qc}
    quantized = [r for r in plan.values() if r.status == "quantized"]
    err = sum(r.error or 0 for r in quantized)
    summary = {
        "quantized": len(quantized),
        "kept": len(plan) - len(quantized),
        "error_sum": err,  # added by --requantize (0 for an exact conversion)
        "rtn_error_sum": err if report["requantized"] else None,
        "error_vs_rtn": None,
    }
    finish_checkpoint(writer, job.output, job.format, config, job.source, report, summary, started)
