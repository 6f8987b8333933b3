"""Calibration text sources and their token samples.

A source is "embedded" (the corpus shipped in the package, built by scripts/build_corpus.py), a local .txt, .jsonl
or .parquet file, or a `datasets` hub name written "name[:config]:split:field" (needs network and `datasets`).
The embedded corpus is split once and for all: every tenth document is held out for evaluation, never calibration.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from pathlib import Path
from typing import Literal

import torch

from marlin_cli.errors import CalibrationError

HELDOUT_EVERY = 10
TEXT_FIELDS = ("text", "content", "document")


KINDS = ("prose", "code")  # docstrings, and function sources


def embedded_texts(split: Literal["calib", "heldout"] = "calib", kinds: tuple[str, ...] = KINDS) -> list[str]:
    """Documents of the shipped corpus of the given kinds: the calibration part, or the held-out tenth."""
    raw = importlib.resources.files("marlin_cli.calib").joinpath("corpus.jsonl.gz").read_bytes()
    docs = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines()]
    held = [i % HELDOUT_EVERY == HELDOUT_EVERY - 1 for i in range(len(docs))]
    return [d["text"] for d, h in zip(docs, held, strict=True) if h == (split == "heldout") and d["kind"] in kinds]


MIN_PARAGRAPH = 60  # characters: shorter blocks of the corpus are headings and rules, not paragraphs


def paragraphs(docs: list[str]) -> list[str]:
    """The blank-line-separated paragraphs of `docs` with at least MIN_PARAGRAPH characters, in order."""
    return [p.strip() for d in docs for p in d.split("\n\n") if len(p.strip()) >= MIN_PARAGRAPH]


def load_texts(source: str, by_paragraph: bool = False) -> list[str]:
    """Documents of a calibration source (see the module docstring); `by_paragraph` cuts the embedded corpus into
    paragraphs, the unit a sentence-embedding model is run on (files and hub data are taken as given)."""
    if source == "embedded":
        docs = embedded_texts("calib")
        return paragraphs(docs) if by_paragraph else docs
    path = Path(source)
    if path.suffix in (".txt", ".jsonl", ".parquet"):
        if not path.is_file():
            raise CalibrationError(f"--calib {source}: no such file")
        return _file_texts(path)
    if source.count(":") in (2, 3):
        return _hub_texts(source)
    raise CalibrationError(
        f"--calib {source!r} is not 'embedded', a .txt/.jsonl/.parquet file, or a hub name 'name[:config]:split:field'"
    )


def _file_texts(path: Path) -> list[str]:
    try:
        if path.suffix == ".txt":
            docs = path.read_text(encoding="utf-8").split("\n\n")
        elif path.suffix == ".jsonl":
            docs = [_text_of(json.loads(line), path) for line in path.read_text(encoding="utf-8").splitlines() if line]
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            field = next((f for f in TEXT_FIELDS if f in table.column_names), None)
            if field is None:
                raise CalibrationError(f"--calib {path}: no column named one of {TEXT_FIELDS}")
            docs = [str(t) for t in table.column(field).to_pylist()]
    except (UnicodeDecodeError, json.JSONDecodeError, OSError) as e:
        raise CalibrationError(f"--calib {path}: cannot read it ({e})") from None
    return [d for d in docs if d.strip()]


def _text_of(record: object, path: Path) -> str:
    if isinstance(record, dict):
        for field in TEXT_FIELDS:
            if isinstance(record.get(field), str):
                return record[field]
    raise CalibrationError(f"--calib {path}: every line must be a JSON object with a 'text' field")


def _hub_texts(source: str) -> list[str]:
    parts = source.split(":")
    name, config, split, field = parts if len(parts) == 4 else (parts[0], None, *parts[1:])
    try:
        import datasets
    except ImportError:
        raise CalibrationError(f"--calib {source}: the 'datasets' package is not installed") from None
    try:
        data = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # network, missing dataset or split: all end the same way for the user
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CalibrationError(f"--calib {source}: cannot load it ({first}); use a local file or 'embedded'") from None
    if field not in data.column_names:
        raise CalibrationError(f"--calib {source}: no field {field!r}; fields are {data.column_names}")
    return [t for t in data[field] if isinstance(t, str) and t.strip()]


def token_samples(texts: list[str], tokenizer: object, nsamples: int, seqlen: int, seed: int) -> list[torch.Tensor]:
    """`nsamples` distinct documents chosen with `seed`, each tokenized as the model sees a real input (with its
    special tokens, e.g. BOS or [CLS] ... [SEP]) and truncated to `seqlen` tokens: (1, T) int64 each.

    Whole documents rather than windows cut from one long stream keep the share and position of the special tokens
    as in real use, which matters for encoders: their Hessians are dominated by those tokens' large activations.
    """
    if len(texts) < nsamples:
        raise CalibrationError(
            f"calibration text has {len(texts)} documents, fewer than --nsamples {nsamples}; "
            "lower --nsamples or give more text with --calib"
        )
    gen = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(len(texts), generator=gen)[:nsamples].tolist()
    encode = tokenizer  # a Hugging Face tokenizer is called directly
    return [encode(texts[i], truncation=True, max_length=seqlen, return_tensors="pt")["input_ids"] for i in chosen]  # type: ignore[operator]
