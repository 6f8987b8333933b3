"""Bad input: one clear message naming the file, layer or flag, exit code 2, and no output left behind."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from tiny_models import make_tiny


def assert_refused(run_cli, args: list[str], out: Path, *phrases: str) -> None:  # noqa: ANN001
    code, stdout, stderr = run_cli(*args)
    assert code == 2, stderr
    assert "Traceback" not in stderr and stdout == ""
    for phrase in phrases:
        assert phrase in " ".join(stderr.split()), stderr
    assert not out.exists(), "no output directory may be left behind"
    assert not list(out.parent.glob(f".{out.name}.*")), "no temporary directory may be left behind"


@pytest.fixture
def llama_copy(tiny_models, tmp_path: Path) -> Path:  # noqa: ANN001
    return Path(shutil.copytree(tiny_models("llama"), tmp_path / "model"))


def test_missing_model_path(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", tmp_path / "nope", out], out, "does not exist")


@pytest.mark.parametrize("command", ["quantize", "pack", "verify", "inspect"])
def test_json_error_leaves_stdout_empty(command: str, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """A script reading --json's stdout gets nothing rather than half a document; the error is on stderr."""
    args = [tmp_path / "nope", tmp_path / "out"] if command in ("quantize", "pack") else [tmp_path / "nope"]
    code, stdout, stderr = run_cli(command, *args, "--json")
    assert code == 2 and stdout == "" and "nope" in stderr, stderr


def test_revision_of_a_local_model(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """--revision pins a hub download; given with a local model it would be ignored, so it is refused."""
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", tiny_models("llama"), out, "--revision", "v1"], out, "is a local model")


def test_bare_model_name(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A bare name that is no directory says what MODEL may be rather than only that no such path exists."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", "gpt2", out], out, "model gpt2: no such directory", "owner/name", "minilm")


@pytest.mark.parametrize(
    "damage,phrase",
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[:5], "truncated"),
        (lambda b: (10**9).to_bytes(8, "little") + b[8:], "exceeds the file"),
        (lambda b: b[:8] + b"{" * 20 + b[28:], "not valid JSON"),
    ],
    ids=["half", "no-header", "header-too-large", "garbled-header"],
)
def test_corrupt_safetensors(damage, phrase: str, llama_copy: Path, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    weights = llama_copy / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", llama_copy, out], out, "model.safetensors", phrase)


@pytest.mark.parametrize(
    "flags,phrase",
    [
        (["--act-order", "sideways"], "--act-order 'sideways' is not one of static|group|none"),
        (["--method", "awq"], "--method 'awq'"),
        (["--group-size", "48"], "--group-size 48 must be one of"),
        (["--damp", "0"], "--damp 0.0 must be in (0, 1)"),
        (["--nsamples", "0"], "--nsamples 0 must be at least 1"),
        (["--max-shard-size", "big"], "--max-shard-size 'big'"),
        (["--calib", "nowhere.jsonl"], "--calib nowhere.jsonl: no such file"),
        (["--preset", "w9"], "--preset 'w9'"),
        (["--device", "gpu"], "--device 'gpu': marlin computes on cpu, cuda or cuda:N"),
        # no machine has 64 GPUs: "no CUDA GPU" without one, "torch sees N GPUs (cuda:0 to ...)" with
        (["--device", "cuda:64"], "--device cuda:64: torch sees"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_flag_values(flags: list[str], phrase: str, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", tiny_models("llama"), out, *flags], out, phrase)


@pytest.mark.parametrize("count,seen", [(1, "1 GPU (cuda:0)"), (2, "2 GPUs (cuda:0 to cuda:1)")])
def test_device_index_past_the_gpus(count: int, seen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from marlin_cli.config import default_device
    from marlin_cli.errors import UsageError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert default_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)
    with pytest.raises(UsageError, match=rf"--device cuda:3: torch sees {re.escape(seen)}$"):
        default_device("cuda:3")


def test_unknown_flag_is_a_usage_error(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "out"
    code, _, stderr = run_cli("quantize", tiny_models("llama"), out, "--bitz", "3")
    assert code == 2 and "--bitz" in stderr and not out.exists()


def test_no_layer_the_format_accepts(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    model = make_tiny(
        "llama",
        tmp_path / "narrow",
        hidden_size=96,
        intermediate_size=160,
        num_attention_heads=3,
        num_key_value_heads=3,
    )
    out = tmp_path / "out"
    assert_refused(
        run_cli,
        ["quantize", model, out],
        out,
        "no layer has a shape the Marlin format accepts",
        "not a multiple of 128",
    )


class _Payload:
    """Unpickling this touches a marker file: the proof that nothing was unpickled is that the file never appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


def test_pickle_only_model_is_refused(llama_copy: Path, run_cli, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import pickle

    import torch

    marker = tmp_path / "unpickled"
    (llama_copy / "model.safetensors").unlink()
    (llama_copy / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    (llama_copy / "training_args.pt").write_bytes(pickle.dumps(_Payload(marker)))

    def never(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the loader unpickled a file")

    monkeypatch.setattr(torch, "load", never)
    monkeypatch.setattr(pickle, "load", never)
    monkeypatch.setattr(pickle, "loads", never)
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", llama_copy, out], out, "pytorch_model.bin", "pickle")
    assert not marker.exists()


def test_bits_other_than_four_are_refused(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    preset = tmp_path / "w3.yaml"
    preset.write_text("bits: 3\ngroup_size: 128\n")
    out = tmp_path / "out"
    args = ["quantize", tiny_models("llama"), out, "--preset", preset]
    assert_refused(run_cli, args, out, "--bits 3 is not supported")


def test_calibration_text_too_short(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    calib = tmp_path / "calib.txt"
    calib.write_text("one short document\n\nand another")
    out = tmp_path / "out"
    assert_refused(
        run_cli,
        ["quantize", tiny_models("llama"), out, "--calib", calib],
        out,
        "2 documents, fewer than --nsamples 128",
        "lower --nsamples",
    )


def test_output_under_a_file(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """An output the OS refuses for another reason than space is not told to free disk space."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    code, _, stderr = run_cli("pack", tiny_models("llama"), out)
    message = " ".join(stderr.split())
    assert code == 2 and f"cannot write {out}: Not a directory; choose another output directory" in message, stderr
    assert "disk space" not in message


def test_output_that_is_the_input(llama_copy: Path, run_cli) -> None:  # noqa: ANN001
    code, _, stderr = run_cli("pack", llama_copy, llama_copy, "--force")
    assert code == 2 and "would overwrite the input" in stderr
    assert (llama_copy / "model.safetensors").exists()


@pytest.mark.parametrize("command", ["verify", "inspect"])
@pytest.mark.parametrize(
    "where,phrase", [("missing", "no such directory"), ("file", "not a directory"), ("empty", "no ")]
)
def test_not_a_checkpoint(command: str, where: str, phrase: str, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / where
    if where == "empty":
        path.mkdir()
    elif where == "file":
        path.write_text("{}")
    code, stdout, stderr = run_cli(command, path)
    message = " ".join(stderr.split())
    assert code == 2 and stdout == "" and "Traceback" not in stderr and f"{path}: {phrase}" in message, stderr
    assert "give" in message, "the message says what is expected"


def test_verify_of_an_unquantized_model(tiny_models, run_cli) -> None:  # noqa: ANN001
    ckpt = tiny_models("llama")
    code, _, stderr = run_cli("verify", ckpt)
    message = " ".join(stderr.split())
    assert code == 2 and f"{ckpt / 'config.json'}: no quantization_config, so not a quantized checkpoint" in message


def test_text_is_printed_as_it_is(tiny_models, run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Paths and error texts are never read as rich markup: "[v2]" stays in a path, and "[/x]" in an exception's
    text does not turn the internal-error line itself into a crash."""
    import marlin_cli.verify

    out = tmp_path / "[v2]w4"
    code, _, stderr = run_cli("pack", tiny_models("llama"), out)
    assert code == 0 and f"-> {out}" in stderr, stderr
    code, _, stderr = run_cli("inspect", tmp_path / "[v2]missing")
    assert code == 2 and "[v2]missing: " in stderr, stderr

    def broken(*args: object) -> None:
        raise RuntimeError("closing [/x] tag")

    monkeypatch.setattr(marlin_cli.verify, "verify_checkpoint", broken)
    code, _, stderr = run_cli("verify", out)
    assert code == 3 and "internal error: RuntimeError: closing [/x] tag" in stderr, stderr


def test_verify_rejects_tampered_checkpoint(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    shard = next(out.glob("model-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    code, _, stderr = run_cli("verify", out)
    assert code == 2 and shard.name in stderr and "truncated" in stderr


@pytest.mark.parametrize("kind", ["unknown-architecture", "no-blocks"])
def test_model_without_blocks_the_tool_can_find(kind: str, llama_copy: Path, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    if kind == "no-blocks":  # a real Llama config with zero decoder layers
        model, phrases = make_tiny("llama", tmp_path / "empty", num_hidden_layers=0), ["no repeated block"]
    else:  # real weights under a config transformers does not know
        model, phrases = llama_copy, ["config.json", "model type `bogus`"]
        (model / "config.json").write_text('{"model_type": "bogus", "architectures": ["BogusForCausalLM"]}')
    out = tmp_path / "out"
    assert_refused(run_cli, ["quantize", model, out], out, *phrases)
