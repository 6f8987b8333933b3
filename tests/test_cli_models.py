"""Tiny models of real transformers classes, quantized end to end through the CLI, verified and re-loaded."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from marlin_cli.model.load import open_model
from marlin_cli.nn import MarlinLinear, load_quantized

FAST = ["--nsamples", "8", "--seqlen", "64"]


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral", "opt", "gpt2"])
def test_quantize_verify_reload(kind: str, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    source = tiny_models(kind)
    out = tmp_path / "w4"
    code, stdout, stderr = run_cli("quantize", source, out, *FAST, "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["summary"]["quantized"] > 0 and report["summary"]["kept"] == 0
    assert report["summary"]["peak_host_gib"] > 0  # peak_gpu_gib is null without a GPU, set on one
    assert all(layer["error"] < layer["rtn_error"] for layer in report["layers"]), "GPTQ must beat RTN per layer"
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors.index.json", "quantization_report.json", "tokenizer.json"} <= files
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "marlin" and qc["bits"] == 4 and qc["group_size"] == 128
    assert set(qc["quantized_modules"]) == {layer["name"] for layer in report["layers"]}

    code, stdout, stderr = run_cli("verify", out, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["passed"]

    # Re-loaded through MarlinLinear, the model computes what the quantized (dequantized) weights compute.
    model = load_quantized(out)
    assert sum(isinstance(m, MarlinLinear) for m in model.modules()) == len(qc["quantized_modules"])
    dense = open_model(source).model.float()
    for name, module in model.named_modules():
        if isinstance(module, MarlinLinear):
            target = dense.get_submodule(name)
            w = module.dequantized_weight()
            target.weight.data.copy_(w.T if isinstance(target, transformers.pytorch_utils.Conv1D) else w)
    ids = torch.randint(0, 30000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model.float()(ids).logits, dense(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "args",
    [
        ["--act-order", "group", "--clip"],
        ["--group-size", "-1"],
        ["--group-size", "32"],
        ["--method", "rtn"],
        ["--preset", "w4-g128-best"],
    ],
    ids=["group-clip", "per-channel", "g32", "rtn", "preset"],
)
def test_options_round_trip_through_the_checkpoint(args: list[str], tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    code, _, stderr = run_cli("quantize", tiny_models("llama"), out, *FAST, *args)
    assert code == 0, stderr
    code, stdout, stderr = run_cli("verify", out, "--json")
    assert code == 0, stderr
    code, stdout, _ = run_cli("inspect", out, "--json")
    info = json.loads(stdout)
    assert code == 0 and info["format"] == "marlin" and len(info["quantized_layers"]) == 14
    if "group" in args or "--preset" in args:
        assert info["act_order"] == "group"
        assert all(json.loads((out / "config.json").read_text())["quantization_config"]["desc_act"] for _ in [0])


@pytest.mark.parametrize(
    ("args", "clip"),
    [
        ([], True),
        (["--no-clip"], False),
        (["--method", "rtn"], False),
        (["--sparse24"], False),
        (["--sparse24", "--clip"], True),
        (["--preset", "w4-g128-sparse24"], False),
    ],
)
def test_clip_on_by_default_for_dense_gptq(args: list[str], clip: bool, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    code, stdout, stderr = run_cli("quantize", tiny_models("llama"), tmp_path / "w4", *FAST, *args, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["quantization"]["clip"] is clip


def test_rtn_takes_no_column_order_and_says_what_it_leaves_unused(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """--method rtn over a preset with act-order group once wrote desc_act without a permutation, which verify then
    failed on every layer; now the preset's order gives way, an explicit --act-order is refused, and calibration flags
    draw a note."""
    out = tmp_path / "w4"
    code, _, stderr = run_cli("quantize", tiny_models("llama"), out, "--method", "rtn", "--act-order", "group")
    assert code == 2 and "--act-order group with --method rtn" in stderr and not out.exists()
    code, stdout, stderr = run_cli("quantize", tiny_models("llama"), out, "--preset", "w4-g128-best", "--method", "rtn")
    assert code == 0, stderr
    assert json.loads((out / "config.json").read_text())["quantization_config"]["act_order"] == "none"
    assert run_cli("verify", out)[0] == 0
    code, _, stderr = run_cli("quantize", tiny_models("llama"), tmp_path / "w4b", "--method", "rtn", *FAST)
    assert code == 0 and "note: --nsamples, --seqlen unused: --method rtn does no calibration" in stderr, stderr


def test_pack_rtn_and_shards(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "packed"
    code, stdout, stderr = run_cli("pack", tiny_models("qwen2"), out, "--max-shard-size", "3MB", "--json")
    assert code == 0, stderr
    shards = sorted(out.glob("model-*.safetensors"))
    assert len(shards) > 1
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards}
    assert set(json.loads(stdout)["files"]["shards"]) == {p.name for p in shards}
    assert run_cli("verify", out)[0] == 0


def test_tables_keep_layer_names_whole_in_a_log(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """With stderr not a terminal (a CI job's log), the tables keep their natural width: each layer name stays on one
    line, where rich's default of 80 columns folded it over several."""
    out = tmp_path / "packed"
    code, _, stderr = run_cli("pack", tiny_models("llama"), out)
    assert code == 0, stderr
    names = json.loads((out / "config.json").read_text())["quantization_config"]["quantized_modules"]
    assert all(len(name) > 20 for name in names)
    code, _, verified = run_cli("verify", out)
    assert code == 0, verified
    for text in (stderr, verified):
        assert all(name in text for name in names)


def test_progress_lines_in_a_log(tiny_models, run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """With stderr not a terminal, where rich would draw its bars once at the end, progress is a line when a stage
    starts, when it ends and every LOG_INTERVAL seconds between, each with the peak memory so far."""
    from marlin_cli.cli import common

    def layer_lines(out: Path) -> list[str]:
        code, _, stderr = run_cli("quantize", tiny_models("llama"), out, *FAST)
        assert code == 0, stderr
        return [line for line in stderr.splitlines() if line.startswith("layers ")]

    monkeypatch.setattr(common, "LOG_INTERVAL", 1e9)
    first, last = layer_lines(tmp_path / "a")
    total = int(last.split()[1].split("/")[1])
    assert first.startswith(f"layers     1/{total} ") and last.startswith(f"layers     {total}/{total} ")
    assert "[host " in first and "GiB]" in last
    monkeypatch.setattr(common, "LOG_INTERVAL", 0.0)
    assert len(layer_lines(tmp_path / "b")) == total
    code, _, stderr = run_cli("verify", tmp_path / "b")  # verify reports its layers and checksums the same way
    assert code == 0, stderr
    assert f"layers     {total}/{total} " in stderr and "checksums  1/1 " in stderr


def test_progress_bars_show_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a terminal the bars' detail shows the memory figures: as rich markup, "[host 0.6 GiB]" vanished."""
    from rich.console import Console

    from marlin_cli.cli import common
    from marlin_cli.pipeline import Progress

    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    monkeypatch.setattr(common, "err_console", terminal)
    with common.ProgressView() as view:
        view(Progress("layers", 1, 2, "model.layers.0.self_attn.q_proj"))
    assert "model.layers.0.self_attn.q_proj  [host " in terminal.file.getvalue()


def test_existing_output_needs_force(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    code, _, stderr = run_cli("pack", tiny_models("llama"), out)
    assert code == 2 and "--force" in stderr
    assert (out / "keep.txt").read_text() == "user data"
    code, _, stderr = run_cli("pack", tiny_models("llama"), out, "--force")
    assert code == 0, stderr
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert not list(tmp_path.glob(".w4.*")), "no temporary directory is left behind"


def test_help_explains_every_option(run_cli) -> None:  # noqa: ANN001
    code, stdout, _ = run_cli("quantize", "--help")
    stdout = re.sub(r"[\s│]+", " ", stdout)  # undo the help panel's wrapping
    assert code == 0
    for flag in [
        "--group-size",
        "--act-order",
        "--clip",
        "--damp",
        "--method",
        "--calib",
        "--nsamples",
        "--seqlen",
        "--seed",
        "--force",
        "--json",
        "--max-shard-size",
        "--trust-remote-code",
    ]:
        assert flag in stdout
    assert "default: 128" in stdout and "default: static" in stdout
    assert "<bool>" not in stdout, "a flag takes no value, so its help shows none (typer 0.29 printed <bool>)"
    for command in ["pack", "verify", "inspect", "build-kernels"]:
        code, stdout, _ = run_cli(command, "--help")
        assert code == 0 and "--help" in stdout and "<bool>" not in stdout


def test_help_paragraphs_follow_the_terminal(run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A command's help paragraphs wrap at the terminal's width, not where its docstring's source lines end."""
    from marlin_cli.cli.app import app

    monkeypatch.setenv("COLUMNS", "400")
    for command in app.registered_commands:
        code, stdout, _ = run_cli(command.name, "--help")
        lines = [line.strip() for line in stdout.splitlines()]
        for paragraph in command.help.split("\n\n"):
            assert code == 0 and paragraph in lines, f"{command.name}: {paragraph[:40]!r} is not one line"


def test_version(run_cli) -> None:  # noqa: ANN001
    from marlin_cli import __version__

    code, stdout, _ = run_cli("--version")
    assert code == 0 and stdout.startswith(f"marlin {__version__} (torch ")


def test_verify_model_check(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    assert run_cli("quantize", tiny_models("llama"), out, *FAST)[0] == 0
    code, stdout, stderr = run_cli("verify", out, "--model-check", "--json")
    assert code == 0, stderr
    check = json.loads(stdout)["model_check"]
    assert check["kind"] == "logits" and check["tokens"] > 0
    assert 0 <= check["kl"] < 0.05 and 0 <= check["top1"] <= 1


def test_model_check_that_does_not_fit(tiny_models, run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The original model may not fit on the GPU (a 70B one alone takes 131 GiB): the message says what to do, not
    the quantize advice of the generic out-of-memory message."""
    import marlin_cli.verify

    def too_big(*args: object, **kwargs: object) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    monkeypatch.setattr(marlin_cli.verify, "open_model", too_big)
    code, _, stderr = run_cli("verify", out, "--model-check")
    message = " ".join(stderr.split())
    assert code == 2 and "does not fit" in message and "without --model-check" in message, stderr


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2"])
def test_blocks_are_read_one_at_a_time(kind: str, tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The lazy loader (a skeleton, each block read when its turn comes) writes exactly what loading the whole model
    writes, and is the path taken for a model whose checkpoint keys match its modules; opt's and gpt2's heads share
    their embeddings (stored once)."""
    from safetensors.torch import load_file

    import marlin_cli.pipeline as pipeline
    from marlin_cli.config import CalibConfig, QuantConfig
    from marlin_cli.model import load

    assert load.open_model(tiny_models(kind), lazy=True).store is not None
    job = dict(quant=QuantConfig(), calib=CalibConfig(nsamples=8, seqlen=64))
    pipeline.quantize(pipeline.Job(model=str(tiny_models(kind)), output=tmp_path / "lazy", **job))
    eager = load.open_model
    monkeypatch.setattr(pipeline, "open_model", lambda *a, lazy=False: eager(*a, lazy=False))
    pipeline.quantize(pipeline.Job(model=str(tiny_models(kind)), output=tmp_path / "eager", **job))
    lazy_t, eager_t = (load_file(next((tmp_path / d).glob("*.safetensors"))) for d in ("lazy", "eager"))
    assert lazy_t.keys() == eager_t.keys()
    assert all(torch.equal(lazy_t[k], eager_t[k]) and lazy_t[k].dtype == eager_t[k].dtype for k in lazy_t)


def test_shards_are_written_as_they_fill(tiny_models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Shards go to disk while blocks are still being quantized, so the host never holds the whole output; the
    checkpoint holds every tensor once (GPT-2's head, tied to its embedding, not at all) and its byte count."""
    from marlin_cli.config import CalibConfig, QuantConfig
    from marlin_cli.io import checkpoint as ckpt
    from marlin_cli.pipeline import Job, Progress, quantize

    events: list[str] = []
    flush = ckpt.ShardWriter._flush
    monkeypatch.setattr(ckpt.ShardWriter, "_flush", lambda self: (events.append("shard"), flush(self))[1])

    def on_progress(p: Progress) -> None:
        if p.stage == "quantize" and p.done < p.total:
            events.append(f"block {p.done + 1}/{p.total}")

    for kind in ("llama", "gpt2"):
        events.clear()
        out = tmp_path / kind
        calib = CalibConfig(nsamples=8, seqlen=64)
        job = Job(model=str(tiny_models(kind)), output=out, quant=QuantConfig(), calib=calib, max_shard_size=10**5)
        report = quantize(job, on_progress)
        blocks = [i for i, e in enumerate(events) if e.startswith("block ")]
        assert len(blocks) > 1 and "shard" in events[blocks[0] : blocks[-1]], f"{kind}: {events}"
        shards = sorted(out.glob("model-*.safetensors"))
        assert len(shards) == events.count("shard") and not list(out.glob("shard-*"))
        names = [n for f in shards for n in load_file(f)]
        assert len(names) == len(set(names)) and ("lm_head.weight" in names) == (kind == "llama")
        headers = sum(8 + int.from_bytes(f.read_bytes()[:8], "little") for f in shards)
        assert report["summary"]["bytes"] == sum(f.stat().st_size for f in shards) - headers
