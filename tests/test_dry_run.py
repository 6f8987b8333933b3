"""--dry-run: the plan from the config alone, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tiny_models import make_tiny
from transformers import LlamaConfig


def test_dry_run_predicts_the_checkpoint(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("quantize", tiny_models("qwen2"), out, "--dry-run", "--json")
    assert code == 0, stderr
    plan = json.loads(stdout)
    assert not out.exists()
    assert len(plan["layers"]) == 14 and all(layer["action"] == "quantized" for layer in plan["layers"])
    code, stdout, stderr = run_cli("quantize", tiny_models("qwen2"), out, "--nsamples", "8", "--seqlen", "64", "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["summary"]["bytes"] == plan["output_bytes"]


def test_dry_run_host_memory_estimate_is_near_a_real_run(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    """Each in a process of its own, as users run them: the estimate counts the process itself (torch and
    transformers, about 0.4 GiB here), which is most of a tiny model's run; within a third of the measured peak."""

    def marlin(*args: object) -> dict:
        cli = [sys.executable, "-c", "from marlin_cli.cli.app import main; main()"]
        done = subprocess.run([*cli, *map(str, args), "--json", "--device", "cpu"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    model, out = tiny_models("llama"), tmp_path / "out"
    few = ("--nsamples", "8", "--seqlen", "64")
    estimate = marlin("quantize", model, out, *few, "--dry-run")["estimated_peak_host_gib"]
    measured = marlin("quantize", model, out, *few)["summary"]["peak_host_gib"]
    print(f"\nhost memory: estimate {estimate} GiB, measured {measured} GiB")
    assert 0.75 <= estimate / measured <= 1.33


def test_peak_memory_is_the_process_own() -> None:
    """A marlin started by a process that once held much more memory reports its own peak, not that process's (the
    peak getrusage gives survives exec)."""
    held = bytearray(2**30)  # this process's peak rises by 1 GiB: every page is written
    held[::4096] = b"x" * (len(held) // 4096)
    code = "from marlin_cli.pipeline import peak_memory; print(peak_memory()['peak_host_gib'])"
    child = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert child < 0.9, f"the child reports {child} GiB, about this process's peak"


def test_dry_run_names_what_stays_unquantized(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    model = make_tiny("llama", tmp_path / "odd", intermediate_size=200)  # 200 is no multiple of 64 or 128
    code, stdout, _ = run_cli("quantize", model, tmp_path / "out", "--dry-run", "--json")
    kept = {layer["name"]: layer["reason"] for layer in json.loads(stdout)["layers"] if layer["action"] == "kept"}
    assert code == 0 and len(kept) == 6  # gate, up (N = 200) and down (K = 200) in both blocks
    assert all("multiple of" in reason for reason in kept.values())


def test_dry_run_of_a_70b_config_reads_no_weights(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """Llama-3-70B's shapes from its config alone (no weight files exist): 560 layers, about 39.5 GB of output."""
    LlamaConfig(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(tmp_path)
    code, stdout, stderr = run_cli("quantize", tmp_path, tmp_path / "out", "--dry-run", "--json")
    assert code == 0, stderr
    plan = json.loads(stdout)
    assert len(plan["layers"]) == 560 and plan["shards"] == 8
    assert 39e9 < plan["output_bytes"] < 40e9
    print(f"\n70B plan: GPU {plan['estimated_peak_gpu_gib']} GiB, host {plan['estimated_peak_host_gib']} GiB")
