"""scripts/check_meta_hazards.py on SASS text written here: a write to a wgmma.sp group's metadata register counts
while the group is in flight, including across the stage loop's back edge, and not once a wait has retired it."""

from __future__ import annotations

from check_meta_hazards import functions, rewrites, stage_loop


def loop(*body: str) -> list[tuple[int, str]]:
    """The stage loop of a kernel whose loop body is `body` (one instruction a line, from address 0x10)."""
    texts = ["MOV R1, c[0x0][0x28]", *body, "@P0 BRA 0x10"]
    sass = "Function : k\n" + "".join(f"/*{16 * i:04x}*/ {text} ;\n" for i, text in enumerate(texts))
    found = stage_loop(functions(sass)["k"])
    assert found is not None
    return found


def test_rewrite_while_the_group_runs() -> None:
    body = loop(
        "LDS R88, [R2]",
        "HGMMA.SP.64x64x32.F32 R24, R92, gdesc[UR4], R24, R88, 0x0",
        "HGMMA.SP.64x64x32.F32 R56, R96, gdesc[UR4], R56, R88, 0x1, gsb0",
        "IADD3 R88, R88, 0x1, RZ",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "IADD3 R88, R88, 0x1, RZ",
    )
    found = rewrites(body)
    assert {a for a, _, _ in found} == {0x40} and min(d for _, _, d in found) == 1


def test_rewrite_after_the_back_edge() -> None:
    # the wait leaves one group in flight: the next stage's load of R88 is 4 instructions after the issue
    body = loop(
        "LDS R88, [R2]",
        "HGMMA.SP.64x64x32.F32 R24, R92, gdesc[UR4], R24, R88, 0x0, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "NOP",
    )
    found = rewrites(body)
    assert {(a, d) for a, _, d in found} == {(0x10, 4)}


def test_no_rewrite_once_retired() -> None:
    body = loop(
        "LDS R88, [R2]",
        "HGMMA.SP.64x64x32.F32 R24, R92, gdesc[UR4], R24, R88, 0x0, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "IADD3 R88, R88, 0x1, RZ",
    )
    assert rewrites(body) == []
