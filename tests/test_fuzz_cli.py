"""Fuzzing `marlin inspect` and `marlin verify` end to end: mutated checkpoint files and configs give exit 0, 1 or 2.

A minimal Marlin checkpoint (one 128 x 64 layer), and the same layer as GPTQ and compressed-tensors exports, are mutated
byte by byte (the safetensors file) and field by field (the quantization_config), and both commands run in-process on
every mutant through the real entry point. Exit 3 (an internal error: an exception the tool did not turn into a message)
fails the test, as does a slow example (no hang, and no allocation sized by a header: that would take seconds)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from marlin_cli.formats import compressed_tensors, gptq, marlin

torch.manual_seed(0)
CODES, SCALES = torch.randint(0, 16, (128, 64), dtype=torch.uint8), torch.rand(1, 64).add(0.5).half()
SEED_TENSORS = {"l.B": marlin.pack_weight(CODES), "l.s": marlin.pack_scales(SCALES)}
SEED_FILE = save(SEED_TENSORS, metadata={"format": "pt"})
SEED_CONFIG = {
    "architectures": ["BertModel"],
    "quantization_config": {
        "quant_method": "marlin",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "quantized_modules": {"l": [128, 64]},
    },
}
# the same layer as a GPTQ export: verify converts it as `marlin pack` would and reads it through another path
GPTQ_FILE = save(
    {f"l.{k}": v for k, v in gptq.to_gptq(gptq.Layer(CODES, SCALES.float(), None), "gptq").items()},
    metadata={"format": "pt"},
)
GPTQ_CONFIG = {
    "architectures": ["BertModel"],
    "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
}
CT_FILE = save(
    {f"l.{k}": v for k, v in compressed_tensors.to_compressed(gptq.Layer(CODES, SCALES.float(), None)).items()},
    metadata={"format": "pt"},
)
CT_WEIGHTS = {"num_bits": 4, "symmetric": True, "strategy": "group", "group_size": 128}
CT_CONFIG = {
    "architectures": ["BertModel"],
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": CT_WEIGHTS}},
    },
}
EXAMPLES = 1000  # per strategy and seed; each example runs both commands: 12,000 command runs in all
STATS = {"runs": 0, "seconds": 0.0, "codes": {}}


@pytest.fixture(scope="module", autouse=True)
def report() -> None:
    yield
    print(f"\nfuzzed inspect/verify: {STATS['runs']} runs in {STATS['seconds']:.1f} s, exit codes {STATS['codes']}")


def run_both(run_cli, directory: Path, data: bytes, config: object) -> None:  # noqa: ANN001
    directory.mkdir(exist_ok=True)
    (directory / "model.safetensors").write_bytes(data)
    (directory / "config.json").write_text(json.dumps(config))
    for command in (["inspect", directory, "--json"], ["verify", directory, "--device", "cpu", "--json"]):
        started = time.perf_counter()
        code, _, err = run_cli(*command)
        seconds = time.perf_counter() - started
        STATS["runs"] += 1
        STATS["seconds"] += seconds
        STATS["codes"][code] = STATS["codes"].get(code, 0) + 1
        assert code in (0, 1, 2), f"{command[0]} exited {code}: {err}"
        assert seconds < 5, f"{command[0]} took {seconds:.1f} s"


def test_the_seed_checkpoints_pass(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    run_both(run_cli, tmp_path / "ckpt", SEED_FILE, SEED_CONFIG)
    run_both(run_cli, tmp_path / "gptq", GPTQ_FILE, GPTQ_CONFIG)
    run_both(run_cli, tmp_path / "compressed", CT_FILE, CT_CONFIG)
    assert STATS["codes"] == {0: 6}


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


SEEDS = {"marlin": (SEED_FILE, SEED_CONFIG), "gptq": (GPTQ_FILE, GPTQ_CONFIG), "compressed": (CT_FILE, CT_CONFIG)}
LONGEST = max(len(f) for f, _ in SEEDS.values())


@pytest.mark.parametrize("seed", SEEDS)
@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, LONGEST - 1), st.integers(0, 255)), max_size=8),
    st.integers(0, LONGEST),
)
def test_mutated_files(seed: str, run_cli, tmp_path_factory, edits: list[tuple[int, int]], cut: int) -> None:  # noqa: ANN001
    file, config = SEEDS[seed]
    data = bytearray(file)
    for at, value in edits:
        data[at % len(data)] = value
    run_both(run_cli, tmp_path_factory.getbasetemp() / f"fuzz-files-{seed}", bytes(data[:cut] if cut else data), config)


ANY = st.none() | st.booleans() | st.integers(-(2**40), 2**40)
ANY = ANY | st.text(max_size=4) | st.lists(st.integers(), max_size=2)
FIELDS = {
    "quant_method": st.sampled_from(["marlin", "gptq", "compressed-tensors"]) | ANY,
    "bits": st.sampled_from([4, 8]) | ANY,
    "group_size": st.sampled_from([-1, 0, 32, 64, 128, 256]) | ANY,
    "desc_act": ANY,
    "sym": ANY,
    "checkpoint_format": st.sampled_from(["gptq", "gptq_v2"]) | ANY,
    "quantized_modules": st.dictionaries(
        st.sampled_from(["l", "m", ""]), st.lists(st.integers(-130, 2**40), max_size=3) | ANY, max_size=2
    )
    | ANY,
}


@pytest.mark.parametrize("seed", SEEDS)
@FUZZ
@given(
    st.fixed_dictionaries({}, optional=FIELDS),
    st.sampled_from(["keep", "drop", "replace"]),
    ANY,
)
def test_mutated_configs(seed: str, run_cli, tmp_path_factory, fields: dict, how: str, other: object) -> None:  # noqa: ANN001
    file, seed_config = SEEDS[seed]
    qc = {**seed_config["quantization_config"], **fields}
    config = {"keep": {**seed_config, "quantization_config": qc}, "drop": {"architectures": other}}.get(how, other)
    run_both(run_cli, tmp_path_factory.getbasetemp() / f"fuzz-configs-{seed}", file, config)
