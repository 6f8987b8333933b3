"""2:4 sparsity end to end through the CLI: quantize --sparse24 -> verify -> reload, pack --sparse24 from a dense model
and from our dense Marlin checkpoint, inspect, dry-run, and what is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from marlin_cli.algo.sparsegpt import magnitude_rtn
from marlin_cli.formats import marlin24
from marlin_cli.io.checkpoint import Checkpoint
from marlin_cli.model.load import open_model
from marlin_cli.nn import MarlinLinear, load_quantized

FAST = ["--nsamples", "8", "--seqlen", "64"]
# tiny Llama's k/v projections are 64 wide: the 2:4 tile needs out_features % 128, so they stay unquantized
LLAMA_KEPT = {f"model.layers.{b}.self_attn.{p}_proj" for b in (0, 1) for p in "kv"}


def stored_codes(path: Path) -> dict[str, torch.Tensor]:
    """Codes (K, N) of every 2:4 layer of a checkpoint, unpacked from B_24/B_meta/s."""
    store = Checkpoint(path)
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    return {
        name: marlin24.unpack(*(store.tensor(f"{name}.{t}") for t in ("B_24", "B_meta", "s")))[0]
        for name in qc["quantized_modules"]
    }


def assert_two_of_four(path: Path) -> None:
    for name, codes in stored_codes(path).items():
        k, n = codes.shape
        assert int((codes != 8).reshape(k // 4, 4, n).sum(1).max()) <= 2, name


def assert_reloads(path: Path, source: Path, quantized: int) -> None:
    """Re-loaded through MarlinLinear (2:4), the model computes what its dequantized weights compute."""
    model = load_quantized(path)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, MarlinLinear)}
    assert len(layers) == quantized and all(m.sparse24 for m in layers.values())
    dense = open_model(source).model.float()
    for name, module in layers.items():
        dense.get_submodule(name).weight.data.copy_(module.dequantized_weight())
    ids = torch.randint(0, 30000, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model.float()(ids).logits, dense(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", ["llama", "opt"])
def test_quantize_sparse24_verify_reload(kind: str, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    source, out = tiny_models(kind), tmp_path / "w4-24"
    code, stdout, stderr = run_cli("quantize", source, out, "--sparse24", *FAST, "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    layers = {r["name"]: r for r in report["layers"]}
    kept = {n for n, r in layers.items() if r["status"] == "kept"}
    assert kept == (LLAMA_KEPT if kind == "llama" else set())
    assert all("not a multiple of 128 (2:4 Marlin tile)" in layers[n]["reason"] for n in kept)
    done = [r for r in layers.values() if r["status"] == "quantized"]
    assert all(r["method"] == "sparsegpt" for r in done)
    assert all(r["error"] < r["magnitude_error"] <= r["rtn_error"] * 1.01 for r in done), "SparseGPT beats magnitude"
    assert report["summary"]["error_vs_magnitude"] < 1

    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "marlin" and qc["sparsity"] == "2:4" and qc["act_order"] == "none"
    assert not qc["desc_act"] and set(qc["ignored_modules"]) == kept
    state = load_file(next(out.glob("*.safetensors")))
    for r in done:
        assert {f"{r['name']}.{t}" for t in ("B_24", "B_meta", "s")} <= state.keys()
        assert f"{r['name']}.weight" not in state and f"{r['name']}.B" not in state
    assert all(state[f"{n}.weight"].dtype == torch.float16 for n in kept)
    assert_two_of_four(out)

    code, stdout, stderr = run_cli("verify", out, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["passed"] and len(json.loads(stdout)["layers"]) == len(done)
    code, stdout, _ = run_cli("inspect", out, "--json")
    info = json.loads(stdout)
    assert code == 0 and info["sparsity"] == "2:4" and info["format"] == "marlin_24" and info["method"] == "gptq"
    code, _, stderr = run_cli("inspect", out)
    assert code == 0 and "SparseGPT" in stderr, "the table says how the 2:4 mask was chosen"
    assert_reloads(out, source, len(done))


@pytest.mark.parametrize("args", [["--group-size", "-1"], ["--group-size", "64", "--clip"], ["--method", "magnitude"]])
def test_sparse24_options(args: list[str], tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4-24"
    code, stdout, stderr = run_cli("quantize", tiny_models("opt"), out, "--sparse24", *FAST, *args, "--json")
    assert code == 0, stderr
    methods = {r["method"] for r in json.loads(stdout)["layers"]}
    assert methods == {"magnitude" if "magnitude" in args else "sparsegpt"}
    assert_two_of_four(out)
    shown, not_shown = ("2:4 mask by magnitude, then GPTQ", "SparseGPT")
    if "magnitude" not in args:
        shown, not_shown = not_shown, shown
    table = run_cli("inspect", out)[2]
    assert shown in table and not_shown not in table, "the table says how the 2:4 mask was chosen"
    assert run_cli("verify", out)[0] == 0


def test_preset_and_model_check(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4-24"
    code, _, stderr = run_cli("quantize", tiny_models("llama"), out, "--preset", "w4-g128-sparse24", *FAST)
    assert code == 0, stderr
    assert json.loads((out / "config.json").read_text())["quantization_config"]["sparsity"] == "2:4"
    code, stdout, stderr = run_cli("verify", out, "--model-check", "--json")
    assert code == 0, stderr
    check = json.loads(stdout)["model_check"]
    assert check["kind"] == "logits" and check["tokens"] > 0 and 0 <= check["top1"] <= 1


def test_dry_run_knows_the_2_4_shape_rules(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4-24"
    code, stdout, stderr = run_cli("quantize", tiny_models("llama"), out, "--sparse24", "--dry-run", "--json")
    assert code == 0, stderr
    plan = json.loads(stdout)
    assert {layer["name"] for layer in plan["layers"] if layer["action"] == "kept"} == LLAMA_KEPT
    code, stdout, stderr = run_cli("quantize", tiny_models("llama"), out, "--sparse24", *FAST, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["summary"]["bytes"] == plan["output_bytes"]


def test_pack_sparse24_from_a_dense_model(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    rounded, calibrated = tmp_path / "rtn", tmp_path / "calib"
    code, stdout, stderr = run_cli("pack", tiny_models("opt"), rounded, "--sparse24", "--json")
    assert code == 0, stderr
    assert {r["method"] for r in json.loads(stdout)["layers"]} == {"rtn"}
    calib = ["--calib", "embedded", "--json"]
    code, stdout, stderr = run_cli("pack", tiny_models("opt"), calibrated, "--sparse24", *calib)
    assert code == 0, stderr
    assert {r["method"] for r in json.loads(stdout)["layers"]} == {"sparsegpt"}
    for out in (rounded, calibrated):
        assert_two_of_four(out)
        assert run_cli("verify", out)[0] == 0
    # magnitude + RTN: exactly the 2 largest |w| of every 4 kept, rounded to nearest
    dense = open_model(tiny_models("opt")).model
    for name, module in load_quantized(rounded).named_modules():
        if isinstance(module, MarlinLinear):
            w = dense.get_submodule(name).weight.float()
            assert torch.equal(module.dequantized_weight(), magnitude_rtn(w, 128).weight()), name


def test_pack_sparse24_from_our_dense_marlin_checkpoint(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    dense, sparse = tmp_path / "dense", tmp_path / "sparse"
    assert run_cli("quantize", tiny_models("llama"), dense, *FAST, "--act-order", "group")[0] == 0
    code, stdout, stderr = run_cli("pack", dense, sparse, "--sparse24", "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    kept = {r["name"] for r in report["layers"] if r["status"] == "kept"}
    assert kept == LLAMA_KEPT and report["requantized"]
    assert_two_of_four(sparse)
    assert run_cli("verify", sparse)[0] == 0
    layers = load_quantized(dense).named_modules()
    before = {n: m.dequantized_weight() for n, m in layers if isinstance(m, MarlinLinear)}
    after = load_quantized(sparse)
    for name, w in before.items():
        if name in kept:  # stored dequantized, in the dtype of the scales
            assert torch.equal(after.get_submodule(name).weight.float(), w.half().float()), name
        else:
            assert torch.equal(after.get_submodule(name).dequantized_weight(), magnitude_rtn(w, 128).weight()), name
    code, _, stderr = run_cli("pack", sparse, tmp_path / "again", "--sparse24")
    assert code == 2 and "already a 2:4 sparse Marlin checkpoint" in stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sparse24", "--act-order", "static"], "--act-order static with --sparse24"),
        (["--sparse24", "--act-order", "group"], "--act-order group with --sparse24"),
        (["--sparse24", "--format", "gptq"], "--format gptq with --sparse24"),
        (["--sparse24", "--format", "compressed-tensors"], "--format compressed-tensors with --sparse24"),
        (["--method", "magnitude"], "--method magnitude is the 2:4 pruning baseline"),
    ],
    ids=["static", "group", "gptq", "compressed-tensors", "magnitude-dense"],
)
def test_quantize_refusals(args: list[str], message: str, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    for dry in ([], ["--dry-run"]):
        code, _, stderr = run_cli("quantize", tiny_models("llama"), tmp_path / "out", *args, *dry)
        assert code == 2 and message in " ".join(stderr.split()), stderr
    assert not (tmp_path / "out").exists()


def test_pack_refusals(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    gptq, dense = tmp_path / "gptq", tmp_path / "dense"
    assert run_cli("pack", tiny_models("llama"), gptq, "--format", "gptq")[0] == 0
    assert run_cli("pack", tiny_models("llama"), dense)[0] == 0
    for args, message in [
        # refused when the job is made, before any layer converts (it once converted them all first)
        ([dense, tmp_path / "d", "--sparse24", "--format", "gptq"], "--format gptq with --sparse24"),
        ([gptq, tmp_path / "a", "--sparse24"], f"{gptq}: a gptq checkpoint; --sparse24 takes a dense"),
        ([tiny_models("opt"), tmp_path / "b", "--calib", "embedded"], "--calib without --sparse24"),
        ([gptq, tmp_path / "c", "--sparse24", "--calib", "embedded"], "calibrated 2:4 needs the original model"),
    ]:
        code, _, stderr = run_cli("pack", *args)
        assert code == 2 and message in " ".join(stderr.split()), stderr


def test_verify_catches_broken_metadata(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4-24"
    assert run_cli("pack", tiny_models("opt"), out, "--sparse24")[0] == 0
    shard = next(out.glob("*.safetensors"))
    state = load_file(shard)
    name = next(n for n in state if n.endswith(".B_meta"))
    state[name][3, 5] = 0  # nibbles 0b0000: position 0 twice, no 2:4 pattern
    save_file(state, shard, metadata={"format": "pt"})
    code, stdout, _ = run_cli("verify", out, "--json")
    failed = [c for c in json.loads(stdout)["layers"] if not c["passed"]]
    assert code == 1 and [c["name"] for c in failed] == [name.removesuffix(".B_meta")]
    assert "breaks the 2:4 rule" in failed[0]["problem"]
