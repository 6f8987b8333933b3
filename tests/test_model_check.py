"""The model check runs both models block by block; these check that doing so changes no output and holds one block
at a time, and the quantized model's skeleton it starts from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import make_tiny

from marlin_cli.calib.data import embedded_texts, token_samples
from marlin_cli.errors import CheckpointError
from marlin_cli.model import run
from marlin_cli.model.layout import find_blocks
from marlin_cli.model.load import open_model, open_tokenizer, resolve
from marlin_cli.nn import MarlinLinear, load_quantized
from marlin_cli.verify import model_check

SAMPLES = [torch.randint(200, 20000, (1, n), generator=torch.Generator().manual_seed(n)) for n in (7, 19, 33)]


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2", "qwen2_moe", "minilm"])
def test_streamed_outputs_are_the_whole_models(kind: str, tiny_models) -> None:  # noqa: ANN001
    """Block by block, the model computes bit for bit what it computes whole: the same operations on the same
    inputs in the same order. The skeletons read their blocks lazily but qwen2_moe's, whose keys differ from its
    modules (loaded whole); opt's and gpt2's heads share their embeddings; MiniLM is the real encoder (no head: last
    hidden states)."""
    source = resolve("minilm") if kind == "minilm" else tiny_models(kind)
    with run.inference():
        whole = open_model(source).model
        wants = [whole(input_ids=ids) for ids in SAMPLES]
        loaded = open_model(source, lazy=True)
        gots = list(run.streamed_outputs(loaded, find_blocks(loaded.model)[0], SAMPLES, torch.device("cpu")))
    key = "last_hidden_state" if kind == "minilm" else "logits"
    for want, got in zip(wants, gots, strict=True):
        assert torch.equal(getattr(want, key), getattr(got, key))


def test_one_block_at_a_time(tiny_models, run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """Each model's blocks are read in turn, after the tensors outside them, and when one is read every earlier block
    of that model has been dropped (its tensors on the meta device)."""
    models: list[torch.nn.Module] = []
    reads: list[tuple[str, bool]] = []
    read = run.load_tensors

    def recording(module: torch.nn.Module, store: object, prefix: str = "", skip: str | None = None) -> None:
        if not prefix:
            models.append(module)
        else:
            earlier = list(models[-1].get_submodule("model.layers"))[: int(prefix.split(".")[2])]
            reads.append((prefix, all(t.is_meta for b in earlier for t in b.state_dict().values())))
        read(module, store, prefix, skip)

    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    monkeypatch.setattr(run, "load_tensors", recording)
    code, _, stderr = run_cli("verify", out, "--model-check")
    assert code == 0, stderr
    assert len(models) == 2 and isinstance(models[1].get_submodule("model.layers.0.mlp.up_proj"), MarlinLinear)
    assert reads == [("model.layers.0.", True), ("model.layers.1.", True)] * 2
    assert "original   2/2 " in stderr and "quantized  2/2 " in stderr  # progress by block in a log


def test_figures_are_the_whole_models_in_float32(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """The original's logits wait on the host as the fp16 model computed them; the KL and top-1 agreement are still
    those of both whole models' float32 log-probabilities, to float32 summation order."""
    source, out = tiny_models("llama"), tmp_path / "w4"
    assert run_cli("pack", source, out)[0] == 0
    samples = token_samples(embedded_texts("heldout"), open_tokenizer(out), 4, 64, seed=0)
    with run.inference():
        original, quantized = open_model(source).model, load_quantized(out)
        pairs = [(original(input_ids=ids).logits, quantized(input_ids=ids).logits) for ids in samples]
    assert pairs[0][0].dtype == torch.float16
    kls, agree = [], []
    for want, got in pairs:
        want, got = want.float().log_softmax(-1), got.float().log_softmax(-1)
        kls.append((want.exp() * (want - got)).sum(-1).flatten())
        agree.append((want.argmax(-1) == got.argmax(-1)).flatten().float())
    check = model_check(out, source, "cpu", nsamples=4, seqlen=64)
    assert check.kl == pytest.approx(float(torch.cat(kls).mean()), rel=1e-6) and check.kl > 0
    assert check.top1 == float(torch.cat(agree).mean())


def test_an_original_with_other_blocks(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    other = make_tiny("llama", tmp_path / "three", num_hidden_layers=3)
    code, _, stderr = run_cli("verify", out, "--model-check", "--original", other)
    message = " ".join(stderr.split())
    assert code == 2 and "does not have the 3 blocks" in message and "--original" in message, stderr
    code, _, stderr = run_cli("verify", out, "--original", other)
    assert code == 2 and "add --model-check" in stderr, "--original alone would otherwise go unused"


def test_load_quantized_reads_stored_dtypes(tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    """The skeleton is never initialised: every tensor is the stored one, in its stored dtype (fp16 here)."""
    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out)[0] == 0
    model = load_quantized(out)
    stored = load_file(next(out.glob("*.safetensors")))
    state = model.state_dict()
    assert all(torch.equal(state[k], v) and state[k].dtype == v.dtype for k, v in stored.items())
    assert {t.dtype for t in model.parameters()} == {torch.float16}


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_load_quantized_names_a_tensor_mismatch(change: str, tiny_models, run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    out = tmp_path / "w4"
    assert run_cli("pack", tiny_models("llama"), out, "--max-shard-size", "100GB")[0] == 0
    shard = next(out.glob("*.safetensors"))
    tensors = load_file(shard)
    if change == "missing":
        del tensors["model.norm.weight"]
    else:
        tensors["model.extra.weight"] = torch.ones(3)
    save_file(tensors, shard)
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="model.norm.weight" if change == "missing" else "model.extra.weight"):
        load_quantized(out)
