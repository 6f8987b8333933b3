"""Calibration sources and samples."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from marlin_cli.calib.data import embedded_texts, load_texts, token_samples
from marlin_cli.errors import CalibrationError
from marlin_cli.model.load import resolve

DOCS = ["The first document talks about tensors.", "A second one, about scales and codes.", "def third():\n    pass"]


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201
    return AutoTokenizer.from_pretrained(resolve("minilm"))


def test_local_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("\n\n".join(DOCS))
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in DOCS) + "\n")
    pq.write_table(pa.table({"text": DOCS, "id": [1, 2, 3]}), tmp_path / "a.parquet")
    for name in ("a.txt", "a.jsonl", "a.parquet"):
        assert load_texts(str(tmp_path / name)) == DOCS, name


def test_jsonl_without_text_field(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(CalibrationError, match="a 'text' field"):
        load_texts(str(tmp_path / "a.jsonl"))


def test_unknown_source() -> None:
    with pytest.raises(CalibrationError, match="is not 'embedded'"):
        load_texts("something")


def test_embedded_corpus_keeps_held_out_text_apart() -> None:
    calib, held = embedded_texts("calib"), embedded_texts("heldout")
    assert len(calib) > 1500 and len(held) > 150
    assert not set(calib) & set(held)
    assert load_texts("embedded") == calib


def test_samples_are_seeded_truncated_documents(tokenizer) -> None:  # noqa: ANN001
    texts = embedded_texts("calib")
    a = token_samples(texts, tokenizer, 16, 64, seed=1)
    b = token_samples(texts, tokenizer, 16, 64, seed=1)
    c = token_samples(texts, tokenizer, 16, 64, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, c))
    for s in a:
        assert s.shape[0] == 1 and 2 < s.shape[1] <= 64
        assert s[0, 0] == tokenizer.cls_token_id and s[0, -1] == tokenizer.sep_token_id  # real special tokens


def test_too_few_documents(tokenizer) -> None:  # noqa: ANN001
    with pytest.raises(CalibrationError, match="3 documents, fewer than --nsamples 8"):
        token_samples(DOCS, tokenizer, 8, 64, seed=0)


def test_calibration_length_follows_the_model(tmp_path: Path) -> None:
    """--seqlen is capped by the model's positions and by a sentence-transformers model's max_seq_length."""
    from transformers import BertConfig

    from marlin_cli.model.load import calibration_length

    config = BertConfig(max_position_embeddings=512)
    assert calibration_length(2048, config, tmp_path) == 512
    assert calibration_length(100, config, tmp_path) == 100
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    assert calibration_length(2048, config, tmp_path) == 256
    assert calibration_length(2048, config, resolve("minilm")) == 256  # the shipped MiniLM says so
    (tmp_path / "sentence_bert_config.json").write_text("{not json")
    assert calibration_length(2048, config, tmp_path) == 512  # unreadable: the config's limit alone


def test_embedded_corpus_by_paragraph() -> None:
    """A sentence-embedding model is calibrated on the corpus's paragraphs: blank-line blocks of >= 60 characters,
    in document order, from the calibration documents only."""
    from marlin_cli.calib.data import MIN_PARAGRAPH, paragraphs

    assert paragraphs(["a" * 70 + "\n\nshort\n\n  " + "b" * 60 + "  ", "c" * 59]) == ["a" * 70, "b" * 60]
    paras = load_texts("embedded", by_paragraph=True)
    assert len(paras) > 1000
    assert all(len(p) >= MIN_PARAGRAPH and "\n\n" not in p for p in paras)
    assert paras == paragraphs(load_texts("embedded"))  # the held-out tenth stays out (split by document)
