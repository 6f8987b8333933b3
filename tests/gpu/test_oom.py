"""Running out of GPU memory mid-run: `marlin quantize` stops with exit 2, says what to change, and leaves nothing.

The process is capped with torch.cuda.set_per_process_memory_fraction below the size of one block, so calibration
starts and the run fails when the first block moves to the GPU.
"""

from __future__ import annotations

import string
import subprocess
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

BLOCK_BYTES = 2 * (4 * 1024 * 1024 + 3 * 1024 * 4096)  # fp16 attention + MLP weights of one block below: 34 MB
LIMIT_BYTES = 24 * 2**20


def tiny_model(path: Path) -> Path:
    """A 2-block Llama 1024 wide with a character-level tokenizer (no hub, no tokenizer package needed)."""
    chars = string.printable
    vocab = {"[UNK]": 0, "[PAD]": 1} | {c: i + 2 for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(
        path
    )
    config = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=1024,
        intermediate_size=4096,
        num_attention_heads=8,
        num_hidden_layers=2,
        max_position_embeddings=512,
    )
    transformers.LlamaForCausalLM(config).half().save_pretrained(path)
    return path


def test_out_of_gpu_memory_stops_cleanly(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "model")
    out = tmp_path / "out"
    fraction = LIMIT_BYTES / torch.cuda.get_device_properties(0).total_memory
    script = (
        "import sys, torch\n"
        f"torch.cuda.set_per_process_memory_fraction({fraction!r})\n"
        "from marlin_cli.cli.app import main\n"
        f"sys.argv = ['marlin', 'quantize', {str(model)!r}, {str(out)!r}, '--device', 'cuda', "
        "'--nsamples', '16', '--seqlen', '128']\n"
        "main()\n"
    )
    assert BLOCK_BYTES > LIMIT_BYTES
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "the GPU ran out of memory" in proc.stderr and "--nsamples" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no output, no staging directory
