"""`marlin inspect`: what a checkpoint holds."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from marlin_cli.cli.common import JsonOpt, err_console, print_json
from marlin_cli.errors import CheckpointError

if TYPE_CHECKING:
    from marlin_cli.io.checkpoint import Checkpoint


def describe(path: Path) -> dict[str, Any]:
    """Format, settings, layers and sizes of the checkpoint in `path`."""
    from marlin_cli.io.checkpoint import Checkpoint, read_json_object
    from marlin_cli.nn import quantization_config

    store = Checkpoint(path)
    config = read_json_object(path / "config.json")
    qc = config.get("quantization_config") or read_json_object(path / "quantize_config.json", missing_ok=True)
    if not isinstance(qc, dict):
        raise CheckpointError(f"{path / 'config.json'}: quantization_config is not an object")
    layers = {}
    if qc.get("quant_method") == "marlin":
        qc = quantization_config(path)  # validated field by field
        layers = qc["quantized_modules"]
    settings = _settings(qc, store)
    dtypes: dict[str, int] = {}
    for name in store.names():
        entry = store.entry(name)
        dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + 1
    archs = config.get("architectures")
    ignored = qc.get("ignored_modules") or {k: "ignored" for k in _strings(qc.get("ignore"))}
    quantized = {name: {"in_features": k, "out_features": n} for name, (k, n) in layers.items()} or (
        _layers_from_tensors(store, settings)
    )
    if settings["group_size"] is None and quantized and not layers:  # an export whose config does not say it
        settings["scale_group_sizes"] = _scale_group_sizes(store, quantized)
    return {
        "path": str(path),
        "architecture": archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else "?",
        **settings,
        "quantized_layers": quantized,
        "ignored_layers": ignored if isinstance(ignored, dict) else {},
        "tensors": len(store.names()),
        "tensor_dtypes": dtypes,
        "files": len(store.headers),
        "bytes": store.nbytes(),
    }


def _strings(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _settings(qc: dict[str, Any], store: Checkpoint) -> dict[str, Any]:
    """format, bits, group_size, act_order, method (and sparsity) of a Marlin, GPTQ or compressed-tensors config."""
    method = qc.get("quant_method")
    if method == "gptq" or (method is None and "bits" in qc and "desc_act" in qc):
        return {
            "format": f"gptq ({qc.get('checkpoint_format', 'gptq')} zeros, sym {qc.get('sym')})",
            "bits": qc.get("bits"),
            "group_size": qc.get("group_size"),
            "act_order": "desc_act" if qc.get("desc_act") else "none",
            "method": "gptq",
        }
    if method == "compressed-tensors":
        groups = qc.get("config_groups")
        first = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
        w = (first.get("weights") if isinstance(first, dict) else None) or {}
        w = w if isinstance(w, dict) else {}
        return {
            "format": f"compressed-tensors ({qc.get('format')}, symmetric {w.get('symmetric')})",
            "bits": w.get("num_bits"),
            "group_size": -1 if w.get("strategy") == "channel" else w.get("group_size"),
            "act_order": w.get("actorder") or "none",
            "method": None,
        }
    return {
        "format": qc.get("format", method or "dense"),
        "sparsity": qc.get("sparsity"),  # "2:4" for the 2:4 Marlin layout
        "bits": qc.get("bits"),
        "group_size": qc.get("group_size"),
        "act_order": qc.get("act_order"),
        "method": qc.get("method"),
    }


# A 2:4 checkpoint's `method` names the dense recipe it extends; say how its mask was chosen.
_SPARSE24_METHODS = {
    "gptq": "gptq (SparseGPT: 2:4 mask by saliency, pruning and rounding errors propagated)",
    "magnitude": "magnitude (2:4 mask by magnitude, then GPTQ)",
    "rtn": "rtn (2:4 mask by magnitude, then round to nearest)",
}


def _layers_from_tensors(store: Checkpoint, settings: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Quantized layers of a GPTQ (qweight (K*bits/32, N)) or compressed-tensors (weight_packed (N, K*bits/32))
    checkpoint, read from the tensor headers."""
    bits = settings.get("bits")
    per_word = 32 // bits if bits in (2, 4, 8) and type(bits) is int else 8
    layers = {}
    for name in store.names():
        shape = store.entry(name)["shape"]
        if name.endswith(".qweight"):
            layers[name.removesuffix(".qweight")] = {"in_features": shape[0] * per_word, "out_features": shape[1]}
        elif name.endswith(".weight_packed"):
            layers[name.removesuffix(".weight_packed")] = {"in_features": shape[1] * per_word, "out_features": shape[0]}
    return layers


def _scale_group_sizes(store: Checkpoint, layers: dict[str, dict[str, int]]) -> list[int]:
    """The group sizes a GPTQ (scales (groups, N)) or compressed-tensors (weight_scale (N, groups)) checkpoint's
    scales imply, for a config that does not say it (-1: one group per layer), as `marlin pack` reads them."""
    from marlin_cli.repack import implied_group

    sizes = set()
    for name, shape in layers.items():
        for suffix, axis in (("scales", 0), ("weight_scale", 1)):
            dims = store.entry(f"{name}.{suffix}")["shape"] if f"{name}.{suffix}" in store.file_of else []
            if len(dims) == 2 and dims[axis] > 0:
                sizes.add(implied_group(shape["in_features"], dims[axis]))
    return sorted(sizes)


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
        value = str(info[key])
        if key == "method" and info.get("sparsity"):
            value = _SPARSE24_METHODS.get(value, value)
        if key == "group_size" and "scale_group_sizes" in info:
            value = f"not in the config; the scales imply {', '.join(map(str, info['scale_group_sizes']))}"
        table.add_row(key, value)
    if info.get("sparsity"):
        table.add_row("sparsity", f"{info['sparsity']} (2 of every 4 weights along K stored)")
    table.add_row("quantized layers", str(len(info["quantized_layers"])))
    table.add_row("kept layers", str(len(info["ignored_layers"])))
    table.add_row("size", f"{info['bytes'] / 1e6:.1f} MB")
    err_console.print(table)
    if layers:
        detail = Table("layer", "K x N")
        for name, shape in info["quantized_layers"].items():
            detail.add_row(name, f"{shape['in_features']} x {shape['out_features']}")
        err_console.print(detail)
