"""The safetensors header check and the checkpoint reader, case by case (the fuzz test covers the rest)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from marlin_cli.errors import CheckpointError, ModelError
from marlin_cli.io.checkpoint import INDEX, Checkpoint, ShardWriter, parse_size, plan_shards, sha256
from marlin_cli.io.safetensors_check import read_header
from marlin_cli.model.layout import find_blocks


def write(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.mark.parametrize(
    "header,data,phrase",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            bytes(12),
            "overlap",
        ),
        ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8), "outside the 8 data bytes"),
        ({"a": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 2]}}, bytes(2), "unknown dtype 'Q4'"),
        ({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 4]}}, bytes(4), "do not hold a F16 tensor"),
        ({"a": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 2]}}, bytes(2), "invalid shape"),
        ({"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}}, bytes(6), "truncated or corrupt"),
    ],
    ids=["overlapping", "out-of-range", "wrong-dtype", "size-mismatch", "negative-shape", "trailing-bytes"],
)
def test_header_problems_are_named(header: dict, data: bytes, phrase: str, tmp_path: Path) -> None:
    path = write(tmp_path / "x.safetensors", header, data)
    with pytest.raises(CheckpointError, match=phrase) as info:
        read_header(path)
    assert str(path) in str(info.value)


def test_a_valid_file_passes(tmp_path: Path) -> None:
    save_file({"a": torch.ones(3, 2), "b": torch.zeros(5, dtype=torch.int32)}, tmp_path / "m.safetensors")
    assert set(read_header(tmp_path / "m.safetensors")) == {"a", "b"}
    assert torch.equal(Checkpoint(tmp_path).tensor("a"), torch.ones(3, 2))


def test_index_that_points_to_a_missing_shard(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, tmp_path / "model-00001-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors: listed in"):
        Checkpoint(tmp_path)


def test_model_without_repeated_blocks() -> None:
    with pytest.raises(ModelError, match="no repeated block"):
        find_blocks(torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU()))


def test_shard_plan_and_sizes() -> None:
    assert plan_shards({"a": 6, "b": 6, "c": 20, "d": 1}, 10) == [["a"], ["b"], ["c"], ["d"]]
    assert plan_shards({"a": 3, "b": 3, "c": 3}, 10) == [["a", "b", "c"]]
    assert parse_size("5GB") == 5 * 10**9 and parse_size("500MB") == 5 * 10**8 and parse_size("1024") == 1024


def test_shard_writer_writes_the_planned_shards(tmp_path: Path) -> None:
    """Tensors in the order they come, in the shards plan_shards gives for that order; named, hashed and indexed."""
    sizes = {"d": 6, "b": 6, "c": 20, "a": 1, "e": 2}  # bytes: int8 tensors; an order that is not sorted
    tensors = {n: torch.randint(-128, 127, (size,), dtype=torch.int8) for n, size in sizes.items()}
    writer = ShardWriter(tmp_path, tmp_path, max_bytes=10)
    for name, t in tensors.items():
        writer.add(name, t)
    sums = writer.finish()
    plan = plan_shards(sizes, 10)
    assert plan == [["d"], ["b"], ["c"], ["a", "e"]]
    files = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*files, INDEX])
    assert sums == {f: sha256(tmp_path / f) for f in files}
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["weight_map"] == {n: files[i] for i, shard in enumerate(plan) for n in shard}
    assert index["metadata"]["total_size"] == writer.total_bytes == sum(sizes.values())
    store = Checkpoint(tmp_path)
    assert all(torch.equal(store.tensor(n), t) for n, t in tensors.items())
