"""Build the embedded calibration corpus from the Python standard library (PSF-licensed, redistributable).

Documents are module, class and function docstrings (natural language) and function sources (code), shuffled with a
fixed seed and written as gzipped JSON lines to marlin_cli/calib/corpus.jsonl.gz. Run: python scripts/build_corpus.py
"""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import random
import sys
import warnings
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "marlin_cli" / "calib" / "corpus.jsonl.gz"
SKIP = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "venv",
    "pydoc_data",
}
MAX_SOURCE_CHARS = 3000  # one function's source at most: keeps any single module from dominating
TARGET_CHARS = 1_600_000


def _documents(module_name: str) -> list[tuple[str, str]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(module_name)
    except Exception:  # a module that does not import on this platform simply contributes nothing
        return []
    docs: list[tuple[str, str]] = []  # (kind, text): "prose" for docstrings, "code" for sources
    if doc := inspect.getdoc(module):
        docs.append(("prose", doc))
    for _, obj in inspect.getmembers(module):
        if getattr(obj, "__module__", None) != module_name:
            continue
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and (doc := inspect.getdoc(obj)):
            docs.append(("prose", doc))
        if inspect.isfunction(obj):
            try:
                source = inspect.getsource(obj)
            except (OSError, TypeError):
                continue
            if 200 < len(source) <= MAX_SOURCE_CHARS:
                docs.append(("code", source))
    return docs


def main() -> None:
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP)
    docs = sorted({(kind, d.strip()) for name in names for kind, d in _documents(name) if len(d.strip()) >= 80})
    random.Random(0).shuffle(docs)
    kept, total = [], 0
    for d in docs:
        if total >= TARGET_CHARS:
            break
        kept.append(d)
        total += len(d[1])
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime 0: the same corpus gives the same bytes
        for kind, text in kept:
            f.write((json.dumps({"kind": kind, "text": text}) + "\n").encode())
    print(f"{len(kept)} documents, {total} characters -> {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
