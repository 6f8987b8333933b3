"""Shared fixtures: tiny real Hugging Face models saved to disk, and a CLI runner that keeps the real exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoTokenizer

from marlin_cli.model.load import resolve

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (gptq_reference, minilm_eval)

VOCAB = 30522  # the MiniLM tokenizer's, shared by every tiny model (no hub here)
TINY = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
    ),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            hidden_size=128,
            intermediate_size=384,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        ),
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(hidden_size=128, ffn_dim=256, num_attention_heads=4, word_embed_proj_dim=128, max_position_embeddings=256),
    ),
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(n_embd=128, n_head=4, n_positions=256, bos_token_id=101, eos_token_id=102),
    ),
}


def make_tiny(kind: str, directory: Path, dtype: torch.dtype = torch.float16, **overrides: object) -> Path:
    """Save a tiny randomly initialised model of a real transformers class, with the MiniLM tokenizer."""
    config_cls, model_cls, kwargs = TINY[kind]
    layers = {"gpt2": "n_layer"}.get(kind, "num_hidden_layers")
    config = getattr(transformers, config_cls)(vocab_size=VOCAB, **{layers: 2, **kwargs, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).to(dtype)
    model.save_pretrained(directory)
    AutoTokenizer.from_pretrained(resolve("minilm")).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = make_tiny(kind, tmp_path_factory.mktemp(kind))
        return made[kind]

    return get


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[int, str, str]]:
    """Run `marlin ARGS...` in-process through its real entry point; returns (exit code, stdout, stderr)."""
    from marlin_cli.cli.app import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["marlin", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run
