"""The real pretrained MiniLM (all-MiniLM-L6-v2) pruned to 2:4 and quantized to 4 bits through the CLI, calibrated
(SparseGPT) against the magnitude baseline (magnitude 2:4, then GPTQ with the mask fixed), both with the embedded
corpus and group size 128, measured on held-out text (tests/minilm_eval.py says how).

Every one of MiniLM's 36 encoder layers (384 and 1536 wide, multiples of 128) fits the 2:4 layout. Issue 4 asks for a
summed held-out error of calibrated 2:4 at most 0.7x the magnitude baseline's; this implementation reaches 0.363x
(cosine 0.845 against 0.545), and the thresholds below keep a small margin over that so a regression fails.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from minilm_eval import Reference

pytestmark = pytest.mark.slow

MAX_RATIO = 0.40  # summed held-out error, calibrated / magnitude (issue 4: 0.70)
MIN_COSINE = 0.83  # mean embedding cosine of the calibrated 2:4 model to the original


def quantize(run_cli, out: Path, *flags: str) -> float:  # noqa: ANN001
    started = time.perf_counter()
    code, stdout, stderr = run_cli("quantize", "minilm", out, "--sparse24", *flags, "--json")
    assert code == 0, stderr
    assert [layer["status"] for layer in json.loads(stdout)["layers"]] == ["quantized"] * 36
    assert run_cli("verify", out)[0] == 0
    return time.perf_counter() - started


def test_minilm_sparsegpt_beats_magnitude(run_cli, tmp_path: Path) -> None:  # noqa: ANN001
    reference = Reference()
    seconds = quantize(run_cli, tmp_path / "sparsegpt")
    quantize(run_cli, tmp_path / "magnitude", "--method", "magnitude")
    calibrated, magnitude = (reference.evaluate(tmp_path / d) for d in ("sparsegpt", "magnitude"))
    ratio = sum(calibrated["errors"].values()) / sum(magnitude["errors"].values())
    worse = [name for name, err in calibrated["errors"].items() if err >= magnitude["errors"][name]]
    print(
        f"\nMiniLM 2:4 + 4-bit, g128: held-out error SparseGPT / magnitude = {ratio:.3f} "
        f"(sums {sum(calibrated['errors'].values()):.4g} / {sum(magnitude['errors'].values()):.4g}); embedding "
        f"cosine vs the original: SparseGPT {calibrated['cosine']:.4f}, magnitude {magnitude['cosine']:.4f}; "
        f"SparseGPT quantize wall time {seconds:.1f} s"
    )
    assert not worse, f"SparseGPT is not below the magnitude baseline on {worse}"
    assert ratio <= MAX_RATIO
    assert calibrated["cosine"] >= MIN_COSINE > magnitude["cosine"]
