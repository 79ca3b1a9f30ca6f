"""``tools/sass_loops.py``: the SASS reading (predicates, modifiers, back edges) and one real sm_90 compile."""

from __future__ import annotations

import os

import pytest
from tool_module import load_tool

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/               @P0 BRA 0x60 ;                             /* 0x0000000000000947 */
        /*0020*/                   LDL.LU R8, [R1+0x5c] ;                 /* 0x00005c0001087983 */
        /*0030*/                   DMMA.8x8x4 R128, R126, R112.reuse, RZ ; /* 0x000000707e80723f */
        /*0040*/              @!P1 STL.64 [R1+0x8], R4 ;                  /* 0x0000080401007387 */
        /*0050*/              @!P4 BRA 0x20 ;                             /* 0xfffffff000008947 */
        /*0060*/                   EXIT ;                                 /* 0x000000000000794d */
"""


def _load():
    return load_tool("sass_loops")


def test_parse_drops_predicates_and_modifiers() -> None:
    tool = _load()
    assert tool.parse_sass(SASS) == [(0x0, "LDC"), (0x10, "BRA"), (0x20, "LDL"), (0x30, "DMMA"), (0x40, "STL"),
                                     (0x50, "BRA"), (0x60, "EXIT")]


def test_only_backward_branches_are_loops() -> None:
    tool = _load()
    assert tool.branch_targets(SASS) == [(0x20, 0x50)]  # the forward @P0 BRA 0x60 is no loop
    loop = tool.loop_report(tool.parse_sass(SASS), 0x20, 0x50)
    assert (loop["instructions"], loop["matrix"], loop["spill_stores"], loop["spill_loads"]) == (4, 1, 1, 1)


def test_a_real_kernel_on_sm90() -> None:
    """softmax's split-max kernel: one loop over its tiles, no spills, as the static spec and at the launch's
    specialisation (compiled here, no GPU)."""
    pytest.importorskip("triton")
    tool = _load()
    if not os.path.exists(tool._tool("cuobjdump")):
        pytest.skip("this Triton bundles no cuobjdump")
    from rlkernel.backends.cuda.static_checks import all_specs

    (spec,) = [s for s in all_specs() if s[:2] == ("softmax", "fp32_split_max")]
    _, _, fn, signature, constexprs, options = spec
    sig, consts, aligned = tool.runtime_spec(signature, constexprs)
    rows = (tool.report(fn, signature, constexprs, options), tool.report(fn, sig, consts, options, aligned=aligned))
    for row in rows:
        assert "REG:" in row["usage"] and "STACK:0" in row["usage"]
        assert row["loops"] and all(loop["spill_stores"] == 0 and loop["spill_loads"] == 0 for loop in row["loops"])
        assert all(loop["instructions"] > 0 for loop in row["loops"])


def test_the_launch_specialisation() -> None:
    """The default compile is the launch's: every non-constexpr argument aligned, ``--one`` arguments the
    constant 1 (integers only)."""
    tool = _load()
    signature = {"x_ptr": "*fp32", "n": "i32", "stride": "i64", "BLOCK": "constexpr"}
    sig, consts, aligned = tool.runtime_spec(signature, {"BLOCK": 64}, ("stride", "absent"))
    assert sig == {"x_ptr": "*fp32", "n": "i32", "stride": "constexpr", "BLOCK": "constexpr"}
    assert consts == {"BLOCK": 64, "stride": 1}
    assert aligned == ("x_ptr", "n")
    assert signature["stride"] == "i64"  # the caller's spec is not changed
    with pytest.raises(ValueError, match="x_ptr"):
        tool.runtime_spec(signature, {"BLOCK": 64}, ("x_ptr",))
