"""scripts/warp_samples.py on an ncu source page written here: instructions that executed equally often form one
region, whose samples and stall reasons are summed; the "(Not Issued)" columns are not counted twice."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from warp_samples import regions

HEADER = [
    "Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
    "stall_long_sb", "stall_selected", "stall_long_sb (Not Issued)",
]  # fmt: skip
# set-up once per warp (2 instructions), a stage loop of 3 run 6 times per warp, the exit
ROWS = [
    ["0x0", "LDC R1, c[0x0][0x28]", "7", "128", "0", "7", "0"],
    ["0x10", "S2R R0, SR_TID.X", "3", "128", "2", "1", "2"],
    ["0x20", "LDS R4, [R2]", "10", "768", "9", "1", "9"],
    ["0x30", "HGMMA.SP.64x8x32.F32 R8, R4, gdesc[UR4], R8, R5, 0x0", "5", "768", "0", "5", "0"],
    ["0x40", "@P0 BRA 0x20", "1", "768", "0", "1", "0"],
    ["0x50", "EXIT", "0", "128", "0", "0", "0"],
]


def write_page(path: Path, header: list[str], rows: list[list[str]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "kernel_with_a_loop"])
        w.writerow(header)
        w.writerows(rows)


def test_regions_follow_the_execution_counts(tmp_path: Path) -> None:
    write_page(tmp_path / "page.csv", HEADER, ROWS)
    kernel, total, found = regions(tmp_path / "page.csv")
    assert kernel == "kernel_with_a_loop" and total == 26
    spans = [(r.first, r.count, r.executed, r.samples) for r in found]
    assert spans == [(0, 2, 128, 10), (2, 3, 768, 16), (5, 1, 128, 0)]
    assert found[1].text.startswith("LDS") and dict(found[1].reasons) == {"long_sb": 9, "selected": 7}


def test_a_page_without_warp_samples_is_refused(tmp_path: Path) -> None:
    write_page(tmp_path / "page.csv", [h for h in HEADER if not h.startswith("Warp")], [r[:2] + r[3:] for r in ROWS])
    with pytest.raises(SystemExit, match="not an ncu source page with warp samples"):
        regions(tmp_path / "page.csv")
