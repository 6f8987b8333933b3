"""Validate a safetensors file's header against the file before anything reads tensors from it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from marlin_cli.errors import CheckpointError

ITEMSIZE = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
MAX_HEADER = 100 * 2**20  # the format's own limit


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensor entries of `path` ({name: {dtype, shape, data_offsets}}), each checked against the file size.

    Raises CheckpointError naming the file and the problem for a truncated file, a header larger than the file,
    a header that is not JSON, unknown dtypes, sizes that disagree with shapes, or out-of-range/overlapping offsets.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(
                    f"{path}: truncated ({size} bytes, no safetensors header); re-download or re-export it"
                )
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointError(
                    f"{path}: header length {n} exceeds the file ({size} bytes): the file is corrupt or truncated"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON: the file is corrupt") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object: the file is corrupt")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    spans = []
    for name, entry in header.items():
        spans.append((*_check_entry(path, name, entry, data_len), name))
    spans.sort()
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise CheckpointError(f"{path}: tensors {a!r} and {b!r} overlap: the file is corrupt")
    if spans and spans[-1][1] != data_len:
        raise CheckpointError(
            f"{path}: {data_len} data bytes but the tensors end at {spans[-1][1]}: truncated or corrupt"
        )
    return header


def _check_entry(path: Path, name: str, entry: Any, data_len: int) -> tuple[int, int]:
    bad = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{bad} has no dtype/shape/offsets entry: the file is corrupt")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise CheckpointError(f"{bad} has an unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise CheckpointError(f"{bad} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise CheckpointError(
            f"{bad} has data offsets {offsets!r} outside the {data_len} data bytes: truncated or corrupt"
        )
    if offsets[1] - offsets[0] != math.prod(shape) * ITEMSIZE[dtype]:
        raise CheckpointError(f"{bad}: {offsets[1] - offsets[0]} bytes do not hold a {dtype} tensor of shape {shape}")
    return offsets[0], offsets[1]
