"""Tiny randomly initialised models of real transformers classes, saved with save_pretrained (no hub needed)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers import AutoTokenizer

from marlin_cli.model.load import resolve

VOCAB = 30522  # the MiniLM tokenizer's, shared by every tiny model (no hub here)
# Llama-style attention: 4 query heads of 32 over 2 key/value heads (k/v out_features 64, the smallest tile width)
LLAMA_LIKE = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
TINY = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(LLAMA_LIKE, intermediate_size=256)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(LLAMA_LIKE, intermediate_size=384)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(LLAMA_LIKE, intermediate_size=256)),
    "qwen2_moe": (  # transformers 5 fuses each block's experts into 3-D tensors
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            LLAMA_LIKE,
            intermediate_size=256,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_experts=4,
            num_experts_per_tok=2,
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
