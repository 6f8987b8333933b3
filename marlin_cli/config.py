"""Quantization settings: frozen dataclasses, YAML presets, validation. Written into every checkpoint."""

from __future__ import annotations

import dataclasses
import importlib.resources
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
import yaml

from marlin_cli.errors import ConfigError, UsageError

GROUP_SIZES = (-1, 32, 64, 128)


def parse_device(device: str | None) -> torch.device:
    """--device as a torch device (cpu, cuda or cuda:N), the GPU when torch sees one if not given, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}: marlin computes on cpu, cuda or cuda:N")
    return parsed


def default_device(device: str | None) -> torch.device:
    """Where work runs (parse_device), refused up front when torch cannot reach that GPU."""
    parsed = parse_device(device)
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            cpu_build = torch.version.cuda is None and torch.version.hip is None
            why = "this torch is a CPU build" if cpu_build else "no GPU is visible"
            raise UsageError(f"--device {device}: torch sees no CUDA GPU ({why}); pass --device cpu or leave it out")
        if parsed.index is not None and parsed.index >= count:
            seen = "1 GPU (cuda:0)" if count == 1 else f"{count} GPUs (cuda:0 to cuda:{count - 1})"
            raise UsageError(f"--device {device}: torch sees {seen}")
    return parsed


class ActOrder(str, Enum):
    STATIC = "static"  # descending-Hessian column order, scales fixed on the original groups: no run-time permutation
    GROUP = "group"  # groups follow the permuted order; the checkpoint stores the K-permutation
    NONE = "none"  # natural column order


class Method(str, Enum):
    GPTQ = "gptq"  # with sparse24: SparseGPT (saliency-chosen 2:4 mask, both errors propagated)
    RTN = "rtn"  # with sparse24: magnitude 2:4, then round to nearest
    MAGNITUDE = "magnitude"  # sparse24 only: magnitude 2:4, then GPTQ with the mask fixed (the baseline)


@dataclass(frozen=True)
class QuantConfig:
    """How each layer is quantized."""

    bits: int = 4
    group_size: int = 128
    act_order: ActOrder = None  # type: ignore[assignment]  # resolved below: static; none with sparse24 or rtn
    method: Method = Method.GPTQ
    damp: float = 0.01  # fraction of the mean Hessian diagonal added to the diagonal
    clip: bool = False  # search over shrunken group scales by the solve's own error (algo.gptq); see default_clip
    block_size: int = 128  # GPTQ lazy-batch width (columns)
    sparse24: bool = False  # prune to 2:4 (2 of every 4 consecutive input weights kept) and store the 2:4 layout

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", _enum(Method, self.method, "--method"))
        # RTN rounds each weight on its own: no column order to choose, no permutation to store
        default = ActOrder.NONE if self.sparse24 or self.method is Method.RTN else ActOrder.STATIC
        object.__setattr__(self, "act_order", _enum(ActOrder, self.act_order or default, "--act-order"))
        if self.method is Method.RTN and self.act_order is not ActOrder.NONE:
            raise UsageError(
                f"--act-order {self.act_order.value} with --method rtn: round-to-nearest quantizes each weight on its "
                "own, in no column order, and stores no permutation; leave --act-order out or use --method gptq"
            )
        if self.sparse24 and self.act_order is not ActOrder.NONE:
            raise UsageError(
                f"--act-order {self.act_order.value} with --sparse24: 2:4 pruning chooses its mask in the natural "
                "column order, and the 2:4 layout stores no permutation; leave --act-order out (it defaults to none)"
            )
        if self.method is Method.MAGNITUDE and not self.sparse24:
            raise UsageError(
                "--method magnitude is the 2:4 pruning baseline and needs --sparse24; for dense weights use gptq or rtn"
            )
        if self.bits != 4:
            raise ConfigError(f"--bits {self.bits} is not supported: the Marlin format stores 4-bit weights")
        if self.group_size not in GROUP_SIZES:
            raise ConfigError(f"--group-size {self.group_size} must be one of {', '.join(map(str, GROUP_SIZES))}")
        if not 0 < self.damp < 1:
            raise ConfigError(f"--damp {self.damp} must be in (0, 1); 0.01 is typical")
        if self.block_size < 1:
            raise ConfigError(f"block_size {self.block_size} must be positive")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def default_clip(method: Method | str, sparse24: bool) -> bool:
    """`marlin quantize`'s --clip when neither the flag nor the preset sets it: on for dense GPTQ, where the search
    costs a few percent of the run and cuts MiniLM's held-out error from 0.338x to 0.280x RTN's (docs/gptq-log.md,
    c5); off for RTN, which has no Hessian to search by, and for 2:4, whose per-group search ran 72 s against 14 s on
    MiniLM on a 2-core CPU."""
    return _enum(Method, method, "--method") is Method.GPTQ and not sparse24


@dataclass(frozen=True)
class CalibConfig:
    """Where calibration text comes from and how much of it is used."""

    # "embedded", a local .txt/.jsonl/.parquet file, or a datasets hub name "<name>[:<config>]:<split>:<field>"
    source: str = "embedded"
    nsamples: int = 128
    seqlen: int = 2048  # capped by the model's maximum positions
    seed: int = 0

    def __post_init__(self) -> None:
        if self.nsamples < 1:
            raise ConfigError(f"--nsamples {self.nsamples} must be at least 1; 128 is typical")
        if self.seqlen < 8:
            raise ConfigError(f"--seqlen {self.seqlen} must be at least 8; 2048 is typical")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _enum(cls: type[Enum], value: Any, flag: str) -> Any:
    try:
        return cls(value.value if isinstance(value, Enum) else value)
    except ValueError:
        choices = "|".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise ConfigError(f"{flag} {value!r} is not one of {choices}") from None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def presets() -> list[str]:
    """Names of the presets shipped in configs/."""
    root = importlib.resources.files("marlin_cli.configs")
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def read_preset(name_or_path: str) -> dict[str, Any]:
    """QuantConfig fields from a shipped preset name or a YAML file; unknown keys are rejected."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    elif name_or_path in presets():
        text = importlib.resources.files("marlin_cli.configs").joinpath(f"{name_or_path}.yaml").read_text()
    else:
        raise ConfigError(f"--preset {name_or_path!r} is neither a YAML file nor one of: {', '.join(presets())}")
    data = yaml.safe_load(text) or {}
    known = {f.name for f in dataclasses.fields(QuantConfig)}
    if not isinstance(data, dict) or set(data) - known:
        unknown = sorted(set(data) - known) if isinstance(data, dict) else data
        raise ConfigError(f"preset {name_or_path}: unknown keys {unknown}; allowed: {', '.join(sorted(known))}")
    return data
