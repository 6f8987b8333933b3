"""Interop through the CLI: --format exports read back by the compressed-tensors package, round trips through
GPTQ and compressed-tensors, and a GPTQ checkpoint written by the format's rules converted with `marlin pack`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from marlin_cli.io.checkpoint import Checkpoint
from marlin_cli.nn import MarlinLinear, load_quantized

FAST = ["--nsamples", "8", "--seqlen", "64"]
SETTINGS = [(g, a) for g in (-1, 32, 64, 128) for a in ("none", "static")]
IDS = [f"g{g}-{a}" for g, a in SETTINGS]


def quantize(run_cli, source: Path, out: Path, *args: str) -> Path:  # noqa: ANN001
    code, _, stderr = run_cli("quantize", source, out, *FAST, *args)
    assert code == 0, stderr
    return out


def tensors(path: Path) -> dict[str, torch.Tensor]:
    store = Checkpoint(path)
    return {name: store.tensor(name) for name in store.names()}


def marlin_weights(path: Path) -> dict[str, torch.Tensor]:
    """Dequantized (N, K) float32 weights of every quantized layer of our checkpoint, read through MarlinLinear."""
    model = load_quantized(path)
    return {name: m.dequantized_weight() for name, m in model.named_modules() if isinstance(m, MarlinLinear)}


@pytest.mark.parametrize("group_size,act_order", SETTINGS, ids=IDS)
# dequantize=True is passed on purpose beside the export's own quantization_config, which transformers warns about
@pytest.mark.filterwarnings("ignore:You passed `quantization_config`:UserWarning")
def test_compressed_tensors_package_reads_our_export(group_size: int, act_order: str, tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """transformers' compressed-tensors integration (the compressed-tensors package) loads and decompresses our
    export; its weights equal ours exactly: in fp16 through the model loader, in float32 through the compressor."""
    ct_pkg = pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    args = ["--group-size", str(group_size), "--act-order", act_order]
    ours = quantize(run_cli, tiny_models("llama"), tmp_path / "marlin", *args)
    export = quantize(run_cli, tiny_models("llama"), tmp_path / "ct", *args, "--format", "compressed-tensors")
    want = marlin_weights(ours)

    model = AutoModelForCausalLM.from_pretrained(export, quantization_config=CompressedTensorsConfig(dequantize=True))
    for name, w in want.items():
        got = model.get_submodule(name).weight
        assert got.dtype == torch.float16 and torch.equal(got, w.half()), f"{name} ({ct_pkg.__version__})"

    qc = QuantizationConfig.model_validate(json.loads((export / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    compressor = BaseCompressor.get_value_from_registry(qc.format)
    state = tensors(export)
    for name, w in want.items():
        local = {k.removeprefix(f"{name}."): v for k, v in state.items() if k.startswith(f"{name}.weight_")}
        local["weight_scale"] = local["weight_scale"].float()  # float32 dequant: exact, no fp16 rounding
        assert torch.equal(compressor.decompress(local, scheme)["weight"], w), name

    # ours -> compressed-tensors -> ours: the same tensors, bit for bit
    back = tmp_path / "back"
    code, _, stderr = run_cli("pack", export, back)
    assert code == 0, stderr
    direct, converted = tensors(ours), tensors(back)
    assert set(direct) == set(converted)
    assert all(torch.equal(direct[k], converted[k]) for k in direct)


@pytest.mark.parametrize(
    "group_size,act_order", [*SETTINGS, (128, "group"), (32, "group")], ids=[*IDS, "g128-group", "g32-group"]
)
def test_gptq_export_round_trip(group_size: int, act_order: str, tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """ours -> gptq -> ours: every tensor comes back bit for bit. With act-order group this holds because our
    layout stores the rows inside a group in input order, which is all GPTQ's g_idx can record."""
    args = ["--group-size", str(group_size), "--act-order", act_order]
    ours = quantize(run_cli, tiny_models("llama"), tmp_path / "marlin", *args)
    export = quantize(run_cli, tiny_models("llama"), tmp_path / "gptq", *args, "--format", "gptq")
    qc = json.loads((export / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "gptq" and qc["sym"] is True and qc["desc_act"] == (act_order == "group")
    assert qc["bits"] == 4 and qc["group_size"] == group_size
    back = tmp_path / "back"
    code, _, stderr = run_cli("pack", export, back)
    assert code == 0, stderr
    assert run_cli("verify", back)[0] == 0
    direct, converted = tensors(ours), tensors(back)
    assert set(direct) == set(converted)
    for name in direct:
        assert torch.equal(direct[name], converted[name]), name
    want, got = marlin_weights(ours), marlin_weights(back)
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_gptq_export_read_by_compressed_tensors_unpacking(tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """An independent reader of our GPTQ tensors: the compressed-tensors package's own int32 unpacking (qweight is
    its weight_packed transposed). transformers' GPTQ integration needs gptqmodel/optimum kernels that do not
    install on a CPU-only machine, so it is not used here."""
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    ours = quantize(run_cli, tiny_models("llama"), tmp_path / "marlin", "--group-size", "64")
    export = quantize(run_cli, tiny_models("llama"), tmp_path / "gptq", "--group-size", "64", "--format", "gptq")
    state = tensors(export)
    for name, w in marlin_weights(ours).items():
        n, k = w.shape
        q = helpers.unpack_from_int32(state[f"{name}.qweight"].T.contiguous(), 4, torch.Size([n, k]))  # signed
        g_idx = state[f"{name}.g_idx"].long()
        assert torch.equal(q.float() * state[f"{name}.scales"].float().T[:, g_idx], w), name
        assert (state[f"{name}.qzeros"].view(torch.uint32) == 0x77777777).all(), "v1 zeros: 8 - 1 in every nibble"


@pytest.mark.parametrize(
    "fmt,args",
    [
        ("gptq", ["--group-size", "32", "--act-order", "group"]),
        ("gptq", ["--group-size", "-1"]),
        ("compressed-tensors", ["--group-size", "64"]),
    ],
    ids=["gptq-g32-group", "gptq-channel", "compressed-g64"],
)
def test_verify_reads_exports(fmt: str, args: list[str], tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """verify takes an export as written: each layer converted as `marlin pack` converts it, through the kernel (the
    reference op on the CPU) against the export's own dequantized weights; then the shards against the report."""
    ours = quantize(run_cli, tiny_models("llama"), tmp_path / "marlin", *args)
    export = quantize(run_cli, tiny_models("llama"), tmp_path / "export", *args, "--format", fmt)
    code, stdout, stderr = run_cli("verify", export, "--json")
    report = json.loads(stdout)
    assert code == 0 and report["passed"] and not report["checksum_problems"], stderr
    layers = json.loads((ours / "config.json").read_text())["quantization_config"]["quantized_modules"]
    assert {c["name"]: [c["in_features"], c["out_features"]] for c in report["layers"]} == layers
    assert all(0 < c["error"] <= report["tolerance"] for c in report["layers"])

    # one negative scale: the product would still match, but no symmetric export has one
    (export / "quantization_report.json").unlink()  # the shard changes: leave the checksums out of this check
    shard = next(export.glob("*.safetensors"))
    state = load_file(shard)
    name = next(n for n in sorted(state) if n.endswith(("scales", "weight_scale")))
    state[name] = state[name].clone()
    state[name].view(-1)[0] *= -1
    save_file(state, shard, metadata={"format": "pt"})
    code, _, stderr = run_cli("verify", export)
    assert code == 1 and f"tensor {name} has scales that are not finite and positive" in " ".join(stderr.split())

    code, _, stderr = run_cli("verify", export, "--model-check")
    assert code == 2 and "`marlin pack" in stderr, "--model-check reads Marlin checkpoints only, and says so"


# --- a GPTQ checkpoint from elsewhere -----------------------------------------------------------------------------


def write_foreign_gptq(
    source: Path,
    out: Path,
    zero_format: str,
    desc_act: bool,
    asym: bool = False,
    natural: str | None = None,
    group: Callable[[str], int] | None = None,
) -> dict:
    """Write a GPTQ checkpoint of `source` by the format's own rules (DESIGN.md 3.3), independently of marlin's code:
    GPTQModel and AutoGPTQ do not install on the CPU-only test machine, so their writer cannot run here.

    Per Linear layer of the blocks: absmax scales per group of 64 input rows (rows assigned to groups through a
    shuffled g_idx when desc_act), codes round(w / s) + zero, 8 codes per int32 along K, zeros packed along N and
    stored minus one for the original ("gptq") convention; layers whose name holds `natural` keep a monotone g_idx
    under desc_act. `group` gives each layer's group size by name instead, and the config then leaves it unsaid.
    Returns {layer: dequantized (N, K) float32 weight}."""
    state = load_file(next(source.glob("*.safetensors")))
    config = json.loads((source / "config.json").read_text())
    gen, dense, out_state = torch.Generator().manual_seed(7), {}, {}
    for name, t in state.items():
        prefix = name.removesuffix(".weight")
        if not (name.endswith("_proj.weight") and ".layers." in name):
            out_state[name] = t
            continue
        w = t.float()  # (N, K)
        n, k = w.shape
        g = group(prefix) if group else 64
        g_idx = torch.arange(k) // g
        if desc_act and not (natural and natural in prefix):
            g_idx = g_idx[torch.randperm(k, generator=gen)]
        zero = torch.randint(5, 11, (k // g, n), generator=gen) if asym else torch.full((k // g, n), 8)
        scales = torch.zeros(k // g, n)
        for grp in range(k // g):
            scales[grp] = w[:, g_idx == grp].abs().amax(1) / 7
        scales = scales.half().float()
        q = torch.clamp(torch.round(w.T / scales[g_idx]) + zero[g_idx], 0, 15).long()  # (K, N)
        dense[prefix] = ((q - zero[g_idx]) * scales[g_idx]).T
        qweight = torch.zeros(k // 8, n, dtype=torch.int64)
        for i in range(8):
            qweight |= q[i::8] << (4 * i)
        stored = zero - (1 if zero_format == "gptq" else 0)
        qzeros = torch.zeros(k // g, n // 8, dtype=torch.int64)
        for i in range(8):
            qzeros |= stored[:, i::8] << (4 * i)
        out_state[f"{prefix}.qweight"] = qweight.to(torch.uint32).view(torch.int32)
        out_state[f"{prefix}.qzeros"] = qzeros.to(torch.uint32).view(torch.int32)
        out_state[f"{prefix}.scales"] = scales.half()
        out_state[f"{prefix}.g_idx"] = g_idx.to(torch.int32)
    out.mkdir()
    save_file(out_state, out / "model.safetensors", metadata={"format": "pt"})
    config["quantization_config"] = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 64,
        "desc_act": desc_act,
        "sym": not asym,
        "checkpoint_format": zero_format,
    }
    if group:
        del config["quantization_config"]["group_size"]
    (out / "config.json").write_text(json.dumps(config))
    for f in source.glob("tokenizer*"):
        (out / f.name).write_bytes(f.read_bytes())
    return dense


@pytest.mark.parametrize("desc_act", [False, True], ids=["natural", "desc_act"])
@pytest.mark.parametrize("zero_format", ["gptq", "gptq_v2"])
def test_foreign_gptq_checkpoint_converts(zero_format: str, desc_act: bool, tiny_models, run_cli, tmp_path):  # noqa: ANN001
    source = tmp_path / "foreign"
    dense = write_foreign_gptq(tiny_models("llama"), source, zero_format, desc_act)
    code, stdout, _ = run_cli("inspect", source, "--json")
    info = json.loads(stdout)
    assert code == 0 and info["format"].startswith("gptq") and len(info["quantized_layers"]) == len(dense)
    out = tmp_path / "marlin"
    code, stdout, stderr = run_cli("pack", source, out, "--json")
    assert code == 0, stderr
    assert json.loads(stdout)["summary"]["error_sum"] == 0
    assert run_cli("verify", out)[0] == 0
    assert run_cli("verify", source)[0] == 0, "verify takes the foreign checkpoint as it is, too"
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["desc_act"] == desc_act and qc["group_size"] == 64
    model = load_quantized(out)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(0))
    for name, w in dense.items():
        layer = model.get_submodule(name)
        x_k = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(1)) if w.shape[1] != 128 else x
        assert torch.equal(layer.dequantized_weight(), w), name
        torch.testing.assert_close(layer(x_k), x_k @ w.T, rtol=1e-5, atol=1e-5)


def test_conversion_writes_shards_as_it_goes(tiny_models, run_cli, tmp_path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001
    """A GPTQ conversion writes each layer as soon as it is converted (the host holds one shard, not the whole
    checkpoint), and gives the layers that desc_act left in order the identity permutation only at the end, once it
    knows that another layer has one."""
    import marlin_cli.repack as repack
    from marlin_cli.io import checkpoint as ckpt

    source = tmp_path / "foreign"
    dense = write_foreign_gptq(tiny_models("llama"), source, "gptq", desc_act=True, natural="q_proj")
    events: list[str] = []
    flush, convert = ckpt.ShardWriter._flush, repack._convert
    monkeypatch.setattr(ckpt.ShardWriter, "_flush", lambda self: (events.append("shard"), flush(self))[1])
    monkeypatch.setattr(repack, "_convert", lambda src, p, *a: (events.append(p), convert(src, p, *a))[1])
    out = tmp_path / "marlin"
    code, _, stderr = run_cli("pack", source, out, "--max-shard-size", "40KB")
    assert code == 0, stderr
    assert "shard" in events[: events.index(sorted(dense)[-1])], events
    assert run_cli("verify", out)[0] == 0
    model = load_quantized(out)
    for name, w in dense.items():
        layer = model.get_submodule(name)
        assert torch.equal(layer.dequantized_weight(), w), name
        if "q_proj" in name:
            assert torch.equal(tensors(out)[f"{name}.perm"], torch.arange(w.shape[1], dtype=torch.int32))


def test_desc_act_to_compressed_tensors_refused_at_the_first_permuted_layer(
    tiny_models,
    run_cli,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
):
    """compressed-tensors no longer reads act-order group: a desc_act GPTQ checkpoint is refused as soon as its first
    permuted layer is converted (once every layer had been), and --requantize converts it in the natural order."""
    import marlin_cli.repack as repack

    source = tmp_path / "foreign"
    write_foreign_gptq(tiny_models("llama"), source, "gptq", desc_act=True, natural="down_proj")
    converted: list[str] = []
    convert = repack._convert
    monkeypatch.setattr(repack, "_convert", lambda src, p, *a: (converted.append(p), convert(src, p, *a))[1])
    out = tmp_path / "ct"
    code, _, stderr = run_cli("pack", source, out, "--format", "compressed-tensors")
    assert code == 2 and "--format compressed-tensors with --act-order group" in stderr and "--requantize" in stderr
    # layers convert in name order: mlp.down_proj keeps its order, mlp.gate_proj is the first permuted one
    assert not out.exists() and [p.rsplit(".", 1)[1] for p in converted] == ["down_proj", "gate_proj"], converted
    code, _, stderr = run_cli("pack", source, out, "--format", "compressed-tensors", "--requantize")
    assert code == 0, stderr
    assert run_cli("verify", out)[0] == 0


def test_group_size_left_unsaid_is_read_from_the_scales_and_must_be_one(
    tiny_models,
    run_cli,
    tmp_path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
):
    """A GPTQ config without group_size: the scales' shapes give it (inspect shows what they imply), and layers that
    disagree are refused at the first one that differs (once every layer had been converted first), with --requantize
    as the way out."""
    import marlin_cli.repack as repack

    same, mixed = tmp_path / "same", tmp_path / "mixed"
    write_foreign_gptq(tiny_models("llama"), same, "gptq", desc_act=False, group=lambda name: 32)
    info = json.loads(run_cli("inspect", same, "--json")[1])
    assert info["group_size"] is None and info["scale_group_sizes"] == [32], info
    code, _, stderr = run_cli("pack", same, tmp_path / "out")
    assert code == 0, stderr
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["group_size"] == 32
    assert run_cli("verify", tmp_path / "out")[0] == 0

    # down_proj (K = 256) at group 128, the others at 64: layers convert in name order, down_proj first
    write_foreign_gptq(tiny_models("llama"), mixed, "gptq", desc_act=False, group=lambda n: 128 if "down" in n else 64)
    code, _, stderr = run_cli("inspect", mixed)
    assert code == 0 and "not in the config; the scales imply 64, 128" in " ".join(stderr.split()), stderr
    converted: list[str] = []
    convert = repack._convert
    monkeypatch.setattr(repack, "_convert", lambda src, p, *a: (converted.append(p), convert(src, p, *a))[1])
    out = tmp_path / "mixed-out"
    code, _, stderr = run_cli("pack", mixed, out)
    message = " ".join(stderr.split())
    assert code == 2 and "model.layers.0.mlp.gate_proj has group size 64 but" in message, stderr
    assert "model.layers.0.mlp.down_proj has 128" in message and "--requantize" in message, stderr
    assert [p.rsplit(".", 1)[1] for p in converted] == ["down_proj", "gate_proj"], converted
    assert not out.exists() and not list(tmp_path.glob(".marlin*")), "nothing is left behind"
    code, _, stderr = run_cli("pack", mixed, out, "--requantize")
    assert code == 0, stderr
    assert run_cli("verify", out)[0] == 0


def test_asymmetric_gptq_refused_unless_requantize(tiny_models, run_cli, tmp_path):  # noqa: ANN001
    source = tmp_path / "asym"
    dense = write_foreign_gptq(tiny_models("llama"), source, "gptq", desc_act=False, asym=True)
    out = tmp_path / "marlin"
    code, _, stderr = run_cli("pack", source, out)
    assert code == 2 and "qzeros" in stderr and "--requantize" in stderr
    assert not out.exists() and not list(tmp_path.glob(".marlin*")), "nothing is left behind"
    code, _, stderr = run_cli("verify", source)  # the kernel's grid is symmetric: no layer of it can run
    assert code == 1 and "asymmetric weights cannot be stored exactly" in " ".join(stderr.split()), stderr
    code, stdout, stderr = run_cli("pack", source, out, "--requantize", "--group-size", "32", "--json")
    assert code == 0, stderr
    report = json.loads(stdout)
    assert report["requantized"] and all(0 < layer["error"] < 0.05 for layer in report["layers"])
    assert len(report["layers"]) == len(dense) and run_cli("verify", out)[0] == 0


def test_exact_conversion_refuses_requantizing_flags_and_requantize_takes_them(tiny_models, run_cli, tmp_path):  # noqa: ANN001
    """--group-size and --clip apply to re-quantized weights only: on an exact copy they are refused rather than
    ignored, and with --requantize --clip searches the RTN scales (it was once ignored there too)."""
    source = tmp_path / "foreign"
    write_foreign_gptq(tiny_models("llama"), source, "gptq", desc_act=False)
    out = tmp_path / "marlin"
    for args in (["--group-size", "32"], ["--clip"], ["--group-size", "128", "--clip"]):
        code, _, stderr = run_cli("pack", source, out, *args)
        flags = " and ".join(a for a in args if a.startswith("--"))
        assert code == 2 and f"{flags}: {source} converts exactly" in stderr and "--requantize" in stderr, stderr
        assert not out.exists()
    errors = {}
    for clip in ("--no-clip", "--clip"):
        code, stdout, stderr = run_cli(
            "pack", source, tmp_path / clip, "--requantize", "--group-size", "32", clip, "--json"
        )
        assert code == 0, stderr
        errors[clip] = {layer["name"]: layer["error"] for layer in json.loads(stdout)["layers"]}
        assert run_cli("verify", tmp_path / clip)[0] == 0
    # the search's candidates include the absmax scale RTN takes without it, so no layer can do worse
    assert all(errors["--clip"][name] <= e for name, e in errors["--no-clip"].items()), errors
    assert sum(errors["--clip"].values()) < 0.9 * sum(errors["--no-clip"].values()), errors


def test_compressed_tensors_refuses_act_order_group(tiny_models, run_cli, tmp_path):  # noqa: ANN001
    out = tmp_path / "ct"
    code, _, stderr = run_cli(
        "quantize", tiny_models("llama"), out, *FAST, "--act-order", "group", "--format", "compressed-tensors"
    )
    assert code == 2 and "--act-order static" in stderr and not out.exists()
    code, _, stderr = run_cli("pack", tiny_models("llama"), out, "--format", "awq")
    assert code == 2 and "--format 'awq'" in stderr


def test_gptq_export_refuses_a_partly_quantizable_block(run_cli, tmp_path):  # noqa: ANN001
    from tiny_models import make_tiny

    model = make_tiny("llama", tmp_path / "odd", intermediate_size=200)  # MLP layers do not fit the tile
    code, _, stderr = run_cli("pack", model, tmp_path / "out", "--format", "gptq")
    assert code == 2 and "--format gptq needs every block layer quantized" in stderr
    assert not (tmp_path / "out").exists()
    # converting: a GPTQ source whose down projections (K = 192) do not fit the Marlin tile, to --format gptq
    source = tmp_path / "foreign"
    write_foreign_gptq(make_tiny("llama", tmp_path / "odd192", intermediate_size=192), source, "gptq", desc_act=False)
    code, _, stderr = run_cli("pack", source, tmp_path / "out", "--format", "gptq")
    assert code == 2 and "--format gptq needs every block layer quantized" in stderr and "down_proj" in stderr
    assert not (tmp_path / "out").exists()
    code, stdout, stderr = run_cli("pack", source, tmp_path / "out", "--json")  # marlin keeps them dense
    assert code == 0, stderr
    kept = [layer["name"] for layer in json.loads(stdout)["layers"] if layer["status"] == "kept"]
    assert kept and all(name.endswith("down_proj") for name in kept) and run_cli("verify", tmp_path / "out")[0] == 0
