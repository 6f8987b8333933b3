"""Faults: interrupted runs leave nothing behind; tampered or damaged inputs are named."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny

from marlin_cli.io.checkpoint import staging_dir


def test_staging_directory_is_removed_on_interrupt(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with staging_dir(out, force=False) as tmp:
            (tmp / "model-00001-of-00001.safetensors").write_bytes(b"partial")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_staging_directories_of_killed_runs_are_removed(tmp_path: Path) -> None:
    """A run killed outright (SIGKILL, the out-of-memory killer) leaves its hidden staging directory, with the shards
    written so far; the next run to the same output on this machine removes it, and leaves a live run's alone."""
    out, host = tmp_path / "out", socket.gethostname()
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f".out.partial-{host}-{finished.stdout.strip()}"
    live = tmp_path / f".out.partial-{host}-{os.getppid()}"
    for d in (dead, live):
        d.mkdir()
        (d / "shard-1.safetensors").write_bytes(b"partial")
    with staging_dir(out, force=False) as tmp:
        (tmp / "config.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "out"])


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_killed_quantize_leaves_nothing(sig: int, code: int, tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-c",
        "from marlin_cli.cli.app import main; main()",
        "quantize",
        str(tiny_models("llama")),
        str(out),
        "--nsamples",
        "512",
        "--seqlen",
        "256",
    ]  # about 7 s of work on a 2-core machine: the signal lands long before the output is complete
    # a shell's background jobs inherit SIGINT ignored, and Python then never raises KeyboardInterrupt: give the run
    # the default disposition, as in a terminal
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    first = proc.stderr.readline()  # the start line: the job is running
    time.sleep(1.0)  # inside loading or calibration
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    stderr = first + stderr
    assert proc.returncode == code, stderr
    assert list(tmp_path.iterdir()) == []


def test_nan_weights_are_refused(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    import shutil

    model = Path(shutil.copytree(tiny_models("llama"), tmp_path / "model"))
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name][3, 5] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    code, _, stderr = run_cli("quantize", model, tmp_path / "out")
    assert code == 2 and name in stderr and "NaN" in stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("source", "args", "bad"),
    [
        ("gptq", [], float("nan")),
        ("gptq", ["--requantize"], float("inf")),
        ("compressed-tensors", [], 0.0),
        ("marlin", ["--sparse24"], float("nan")),
    ],
    ids=["gptq-nan", "gptq-requantize-inf", "compressed-zero", "marlin-sparse24-nan"],
)
def test_damaged_scales_are_refused(source: str, args: list[str], bad: float, tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """A NaN, Inf or zero scale in a quantized source is damage: `marlin pack` names the tensor (it once reported
    "this is a bug" for a NaN, or a 2:4 violation), exits 2 and leaves nothing behind; verify fails that layer."""
    src = tmp_path / "src"
    code, _, stderr = run_cli("quantize", tiny_models("llama"), src, "--method", "rtn", "--format", source)
    assert code == 0, stderr
    (src / "quantization_report.json").unlink()  # the shard changes: leave the checksums out
    shard = next(src.glob("*.safetensors"))
    state = load_file(shard)
    name = next(
        n for n in sorted(state) if n.endswith(("mlp.down_proj.scales", "down_proj.weight_scale", "down_proj.s"))
    )
    state[name].view(-1)[5] = bad
    save_file(state, shard, metadata={"format": "pt"})
    code, _, stderr = run_cli("pack", src, tmp_path / "out", *args)
    message = " ".join(stderr.split())
    assert code == 2 and f"tensor {name} has scales that are not finite and positive" in message, stderr
    assert "the checkpoint is damaged" in message and "a bug" not in message
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["src"]
    code, _, stderr = run_cli("verify", src)
    assert code == 1 and name in " ".join(stderr.split()), stderr


def test_verify_rejects_a_changed_shard(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    shard = next(out.glob("model-*.safetensors"))
    tensors = load_file(shard)
    name = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    tensors[name] = tensors[name] + torch.ones_like(tensors[name])  # same header, other bytes
    save_file(tensors, shard, metadata={"format": "pt"})
    code, stdout, stderr = run_cli("verify", out, "--json")
    assert code == 1, stderr
    report = json.loads(stdout)
    assert not report["passed"] and shard.name in report["checksum_problems"][0]

    # a report without readable checksums (changed, or cut short) fails the check, not the command
    for text in (json.dumps({"files": {"shards": [shard.name]}}), '{"files": {"sha'):
        (out / "quantization_report.json").write_text(text)
        code, _, stderr = run_cli("verify", out)
        assert code == 1 and "no files.shards mapping" in stderr and "internal error" not in stderr


def test_hub_model_with_remote_code_needs_a_revision(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    code, _, stderr = run_cli("quantize", "some-org/some-model", tmp_path / "out", "--trust-remote-code")
    assert code == 2 and "--revision" in stderr


def test_offline_hub_id_is_one_line(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, stderr = run_cli("quantize", "some-org/some-model", tmp_path / "out")
    assert code == 2 and "cannot download some-org/some-model" in stderr and "Traceback" not in stderr


def test_config_asking_for_remote_code(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    import shutil

    model = Path(shutil.copytree(tiny_models("llama"), tmp_path / "model"))
    config = json.loads((model / "config.json").read_text())
    config.update(model_type="custom-thing", auto_map={"AutoConfig": "configuration_custom.CustomConfig"})
    (model / "config.json").write_text(json.dumps(config))
    code, _, stderr = run_cli("quantize", model, tmp_path / "out")
    assert code == 2 and "--trust-remote-code" in stderr


def test_full_disk_leaves_nothing(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    """A file-size limit of 2 MB (RLIMIT_FSIZE, SIGXFSZ ignored) stands in for a full disk: every write past it fails
    with an OS error, as on a full file system."""
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * 10**6, 2 * 10**6))

    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-c",
        "from marlin_cli.cli.app import main; main()",
        "pack",
        str(tiny_models("llama")),
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "cannot write" in done.stderr and "File too large" in done.stderr and "free disk space" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_bf16_weights_beyond_fp16_scales_are_clamped_and_reported(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    from tiny_models import make_tiny

    model = make_tiny("llama", tmp_path / "model", dtype=torch.bfloat16)
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.mlp.up_proj"
    tensors[f"{name}.weight"][7, 3] = 1e7  # bf16 holds it; a 4-bit scale for it would overflow fp16
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    code, stdout, stderr = run_cli("pack", model, tmp_path / "out", "--json")
    assert code == 0, stderr
    layer = next(r for r in json.loads(stdout)["layers"] if r["name"] == name)
    assert "saturate" in layer["reason"]
    scales = load_file(next((tmp_path / "out").glob("model-*.safetensors")))[f"{name}.s"]
    assert torch.isfinite(scales).all() and scales.max() == 65504  # clamped, never inf


def test_missing_tokenizer(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    import shutil

    model = Path(shutil.copytree(tiny_models("llama"), tmp_path / "model"))
    for f in model.glob("tokenizer*"):
        f.unlink()
    code, _, stderr = run_cli("quantize", model, tmp_path / "out")
    assert code == 2 and "no usable tokenizer" in stderr and "--method rtn" in stderr
    assert not (tmp_path / "out").exists()
    assert run_cli("quantize", model, tmp_path / "out", "--method", "rtn")[0] == 0  # RTN needs no tokenizer


def test_tokenizer_without_words(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """A tokenizer that loads but knows no word (what some transformers releases build when the files are missing)
    would calibrate on unknown tokens alone: refused like a missing one."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = Path(shutil.copytree(tiny_models("llama"), tmp_path / "model"))
    for f in model.glob("tokenizer*"):
        f.unlink()
    empty = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    empty.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=empty, unk_token="[UNK]").save_pretrained(model)
    code, _, stderr = run_cli("quantize", model, tmp_path / "out")
    assert code == 2 and "no usable tokenizer" in stderr and "knows no word" in stderr
    assert not (tmp_path / "out").exists()


def test_sigkill_never_leaves_a_complete_looking_output(tiny_models, tmp_path: Path) -> None:  # noqa: ANN001
    """SIGKILL cannot be caught: a hidden .partial directory may stay, but the output path either does not exist or
    holds a complete checkpoint (the rename is the last step)."""
    cmd = [sys.executable, "-c", "from marlin_cli.cli.app import main; main()", "quantize", str(tiny_models("llama"))]
    for i, delay in enumerate([0.5, 1.5, 3.0]):
        out = tmp_path / f"out{i}"
        with subprocess.Popen(  # the context closes the stderr pipe after the wait
            [*cmd, str(out), "--nsamples", "256", "--seqlen", "128"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            proc.stderr.readline()
            time.sleep(delay)
            proc.kill()
            proc.wait(timeout=60)
        assert not out.exists() or {"config.json", "model.safetensors.index.json", "quantization_report.json"} <= {
            p.name for p in out.iterdir()
        }


def test_layers_the_calibration_never_reaches_fall_back_to_rtn(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    # GPT-2 with cross-attention: a decoder-only run never calls the cross-attention layers
    model = make_tiny("gpt2", tmp_path / "model", add_cross_attention=True)
    code, stdout, stderr = run_cli("quantize", model, tmp_path / "out", "--nsamples", "4", "--seqlen", "64", "--json")
    assert code == 0, stderr
    layers = {r["name"]: r for r in json.loads(stdout)["layers"]}
    unreached = {n: r for n, r in layers.items() if ".crossattention." in n}
    assert len(unreached) == 6
    for r in unreached.values():
        assert (r["status"], r["method"]) == ("quantized", "rtn")
        assert r["reason"] == "not reached by the calibration data: RTN"
    assert all(r["method"] == "gptq" for n, r in layers.items() if n not in unreached)
    report = json.loads((tmp_path / "out" / "quantization_report.json").read_text())
    assert sum(r["method"] == "rtn" for r in report["layers"]) == 6
    assert run_cli("verify", tmp_path / "out")[0] == 0


def test_fused_moe_experts_are_kept_and_reported(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    code, stdout, stderr = run_cli(
        "quantize", tiny_models("qwen2_moe"), tmp_path / "out", "--nsamples", "4", "--seqlen", "64", "--json"
    )
    assert code == 0, stderr
    layers = {r["name"]: r for r in json.loads(stdout)["layers"]}
    experts = {n: r for n, r in layers.items() if ".mlp.experts." in n}
    names = [f"model.layers.{b}.mlp.experts.{p}" for b in (0, 1) for p in ("down_proj", "gate_up_proj")]
    assert sorted(experts) == names
    assert all(r["status"] == "kept" and "4 fused experts" in r["reason"] for r in experts.values())
    assert layers["model.layers.0.mlp.shared_expert.down_proj"]["method"] == "gptq"
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert set(experts) <= set(qc["ignored_modules"])
    assert run_cli("verify", tmp_path / "out")[0] == 0
    dry = json.loads(run_cli("quantize", tiny_models("qwen2_moe"), tmp_path / "plan", "--dry-run", "--json")[1])
    assert {r["name"] for r in dry["layers"] if r["action"] == "kept"} >= set(experts)


def test_out_of_memory_mid_run_leaves_nothing(tiny_models, run_cli, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    # the allocation failure is injected into the third layer's solve; tests/gpu/test_oom.py runs out for real
    import marlin_cli.pipeline

    calls = []

    def failing_gptq(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_gptq(*args, **kwargs)

    real_gptq = marlin_cli.pipeline.gptq
    monkeypatch.setattr(marlin_cli.pipeline, "gptq", failing_gptq)
    code, _, stderr = run_cli("quantize", tiny_models("llama"), tmp_path / "out", "--nsamples", "4", "--seqlen", "64")
    assert code == 2
    assert "ran out of memory" in stderr and "--nsamples" in stderr
    assert list(tmp_path.iterdir()) == []


def test_layers_with_more_inputs_than_calibration_tokens_say_so(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    # 2 samples of at most 64 tokens: below the FFN's 256 inputs, so its Hessian has rank below K
    code, stdout, stderr = run_cli(
        "quantize", tiny_models("llama"), tmp_path / "out", "--nsamples", "2", "--seqlen", "64", "--json"
    )
    assert code == 0, stderr
    report = json.loads(stdout)
    tokens = report["calibration"]["tokens"]
    assert tokens < 256
    for r in report["layers"]:
        noted = f"{tokens} calibration tokens, fewer than its {r['in_features']} inputs" in (r["reason"] or "")
        assert noted == (tokens < r["in_features"]), r
        assert r["method"] == "gptq"
    assert any(r["in_features"] == 256 for r in report["layers"])
