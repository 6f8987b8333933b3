"""Checkpoint directories: atomic sharded writing (temporary sibling directory, then rename) and validated reading."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from marlin_cli.errors import CheckpointError, UsageError
from marlin_cli.io.safetensors_check import read_header

INDEX = "model.safetensors.index.json"
REPORT = "quantization_report.json"
# Files that travel with the weights: tokenizer, generation settings, chat template.
SIDE_FILES = re.compile(
    r"(tokenizer.*|special_tokens_map\.json|vocab\.(txt|json)|merges\.txt|added_tokens\.json|"
    r"generation_config\.json|chat_template\.(jinja|json)|.*\.tiktoken|spiece\.model)$"
)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'5GB', '500MB', '1024' -> bytes (decimal units, as Hugging Face uses)."""
    m = _SIZE.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--max-shard-size {text!r} is not a size like 5GB, 500MB or 1000000")
    unit = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[(m.group(2) or "B").upper()]
    return int(float(m.group(1)) * unit)


def check_output(output: Path, force: bool, sources: list[Path]) -> None:
    """Refuse an output that exists (without --force) or that is, or holds, one of the inputs."""
    out = output.resolve()
    for src in sources:
        src = src.resolve()
        if out == src or src.is_relative_to(out):
            raise UsageError(f"output {output} would overwrite the input {src}; choose another output directory")
    if output.exists() and not force:
        raise UsageError(f"output {output} already exists; pass --force to replace it")


@contextmanager
def writing(output: Path) -> Iterator[None]:
    """What the operating system or safetensors refuse while `output` is written (full disk, quota, size limit,
    permissions) as a CheckpointError that says what to do."""
    try:
        yield
    except (OSError, SafetensorError) as e:
        # safetensors' errors carry no errno; its writes fail mostly for space
        full = not isinstance(e, OSError) or e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        fix = "free disk space or choose another output directory" if full else "choose another output directory"
        raise CheckpointError(
            f"cannot write {output}: {getattr(e, 'strerror', None) or e}; {fix} (nothing was written)"
        ) from None


@contextmanager
def staging_dir(output: Path, force: bool) -> Iterator[Path]:
    """A temporary sibling of `output` that becomes `output` only if the block completes; removed on any failure.
    Siblings that a killed run on this machine left behind (SIGKILL, the kernel's out-of-memory killer) go first."""
    host = socket.gethostname()
    for stale in output.parent.glob(f".{output.name}.partial-{host}-*"):
        if not _alive(stale.name.rsplit("-", 1)[1]):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = output.parent / f".{output.name}.partial-{host}-{os.getpid()}"
    try:
        with writing(output):
            tmp.mkdir(parents=True)
        yield tmp
        with writing(output):
            _swap_in(tmp, output, force)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Whether process `pid` (a directory name's suffix) runs on this machine; anything unreadable counts as alive."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return True
    return True


def _swap_in(tmp: Path, output: Path, force: bool) -> None:
    if not output.exists():
        tmp.rename(output)
        return
    if not force:
        raise UsageError(f"output {output} appeared while writing; pass --force to replace it")
    old = output.parent / f".{output.name}.old-{os.getpid()}"
    output.rename(old)
    tmp.rename(output)
    shutil.rmtree(old)


def plan_shards(sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    """Names, in the order given, split into consecutive shards of at most `max_bytes` each (a larger tensor gets its
    own): the shards ShardWriter writes for the same tensors in the same order."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes.items():
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


class ShardWriter:
    """Writes tensors into `directory` in the order they come, in shards of at most `max_bytes` (a larger tensor gets
    its own), each as soon as the next tensor would not fit: the host holds at most one shard of them. The files get
    their names model-0000i-of-0000n.safetensors, and the index is written, in `finish`, once n is known."""

    def __init__(self, directory: Path, output: Path, max_bytes: int) -> None:
        self.directory, self.output, self.max_bytes = directory, output, max_bytes
        self.pending: dict[str, torch.Tensor] = {}
        self.pending_bytes = 0
        self.shards: list[tuple[str, list[str]]] = []  # (file's sha256, its tensors), in the order written
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_bytes:
            self._flush()
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        path = self.directory / f"shard-{len(self.shards) + 1}.safetensors"
        with writing(self.output):
            save_file(self.pending, path, metadata={"format": "pt"})
            self.shards.append((sha256(path), list(self.pending)))  # hashed while the file is in the page cache
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> dict[str, str]:
        """Write what is pending, name the files and write the index; returns {file: sha256}."""
        if self.pending or not self.shards:
            self._flush()
        weight_map, sums = {}, {}
        with writing(self.output):
            for i, (digest, names) in enumerate(self.shards, 1):
                fname = f"model-{i:05d}-of-{len(self.shards):05d}.safetensors"
                (self.directory / f"shard-{i}.safetensors").rename(self.directory / fname)
                sums[fname] = digest
                weight_map.update({n: fname for n in names})
            write_json(self.directory / INDEX, {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map})
        return sums


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def read_json_object(path: Path, missing_ok: bool = False) -> dict[str, Any]:
    """A JSON file holding an object (config.json and friends); {} for a missing file when `missing_ok`."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: not readable JSON") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: holds a JSON {type(data).__name__}, not an object")
    return data


def copy_side_files(source: Path, target: Path) -> list[str]:
    """Copy the tokenizer and generation files of a model directory; returns their names."""
    names = sorted(p.name for p in source.iterdir() if p.is_file() and SIDE_FILES.match(p.name))
    for name in names:
        shutil.copy2(source / name, target / name)
    return names


def check_dir(path: Path) -> None:
    """CheckpointError unless `path` is a directory, saying whether it is missing or a file."""
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise CheckpointError(f"{path}: {what}; give the checkpoint directory")


class Checkpoint:
    """A model directory's safetensors, read lazily after every header was validated."""

    def __init__(self, path: Path) -> None:
        self.path = path
        check_dir(path)
        index = path / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                files = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise CheckpointError(f"{index}: not a valid safetensors index (no weight_map)") from None
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
            weight_map = None
        if not files:
            raise CheckpointError(f"{path}: no *.safetensors files; give the directory that holds the weights")
        self.headers: dict[str, dict[str, Any]] = {}
        self.file_of: dict[str, str] = {}
        for fname in files:
            if not (path / fname).is_file():
                raise CheckpointError(f"{path / fname}: listed in {INDEX} but missing")
            header = read_header(path / fname)
            self.headers[fname] = header
            self.file_of.update({name: fname for name in header})
        if weight_map is not None:
            for name, fname in weight_map.items():
                if self.file_of.get(name) != fname:
                    raise CheckpointError(f"{index}: tensor {name!r} is not in {fname}")

    def names(self) -> list[str]:
        return sorted(self.file_of)

    def entry(self, name: str) -> dict[str, Any]:
        """Header entry (dtype, shape) of tensor `name`."""
        return self.headers[self.file_of[name]][name]

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self.file_of:
            raise CheckpointError(f"{self.path}: tensor {name!r} is missing")
        with safe_open(self.path / self.file_of[name], framework="pt") as f:
            return f.get_tensor(name)

    def nbytes(self) -> int:
        return sum((self.path / f).stat().st_size for f in self.headers)
