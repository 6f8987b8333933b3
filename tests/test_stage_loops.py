"""scripts/stage_loops.py on SASS text written here: the stage loop is found around its HGMMA, the end of a strip
(the longest forward branch inside the loop) is left out of the stage's path, and R2UR and HGMMA are counted on it."""

from __future__ import annotations

from check_meta_hazards import functions, stage_loop
from stage_loops import stage_path

# One kernel: set-up, a loop of 6 instructions on its stage path (one R2UR, two HGMMA, the strip-end test and the
# back edge) around a strip end of 3 (one R2UR), then the exit.
SASS = """
        Function : kernel_with_a_loop
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   R2UR UR4, R2 ;
        /*0020*/                   HGMMA.64x16x16.F32 R24, gdesc[UR4], RZ ;
        /*0030*/                   HGMMA.64x16x16.F32 R24, gdesc[UR8], R24, gsb0 ;
        /*0040*/               @P0 BRA 0x80 ;
        /*0050*/                   R2UR UR6, R3 ;
        /*0060*/                   STG.E desc[UR6][R4.64], R24 ;
        /*0070*/                   IADD3 R5, R5, 0x1, RZ ;
        /*0080*/                   ISETP.NE.AND P1, PT, R5, R6, PT ;
        /*0090*/               @P1 BRA 0x10 ;
        /*00a0*/                   EXIT ;
"""


def test_stage_path_leaves_out_the_strip_end() -> None:
    body = stage_loop(functions(SASS)["kernel_with_a_loop"], "HGMMA")
    assert body is not None and [a for a, _ in body] == list(range(0x10, 0xA0, 0x10))
    path = [t for _, t in stage_path(body)]
    assert len(path) == 6
    assert sum(t.startswith("R2UR") for t in path) == 1 and sum(t.startswith("HGMMA") for t in path) == 2
    assert not any(t.startswith("STG") for t in path)


def test_no_loop_without_hgmma() -> None:
    assert stage_loop(functions(SASS.replace("HGMMA", "HMMA"))["kernel_with_a_loop"], "HGMMA") is None
