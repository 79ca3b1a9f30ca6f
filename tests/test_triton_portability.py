"""Source rules for the oldest Triton the GPU backends run on (3.6 on the lent H100 / H200; CI
compiles and interprets with a newer one, so these slips pass there and fail only on the device).

- A ``tl.constexpr`` parameter of a ``@triton.jit`` function takes no string default: Triton 3.6
  hands the bare ``str`` to the callee when a call omits it (``AttributeError: 'str' object has no
  attribute 'type'`` at compile time). softmax's split helpers had ``CACHE: tl.constexpr = ""`` and
  the three-launch split failed to compile on the H100 (docs/bench/issue12-session28.md section 1);
  callers pass the string instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _is_jit(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def string_constexpr_defaults(source: str, name: str = "<source>") -> list[str]:
    """``file:line function(param)`` for every constexpr parameter of a jit function whose default is a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef) or not _is_jit(node):
            continue
        args = node.args.posonlyargs + node.args.args
        defaults = dict(zip([a.arg for a in args][len(args) - len(node.args.defaults):], node.args.defaults))
        defaults.update({a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None})
        for arg in args + node.args.kwonlyargs:
            default = defaults.get(arg.arg)
            if (arg.annotation is not None and "constexpr" in ast.unparse(arg.annotation)
                    and isinstance(default, ast.Constant) and isinstance(default.value, str)):
                found.append(f"{name}:{node.lineno} {node.name}({arg.arg})")
    return found


def test_no_string_default_for_a_constexpr_parameter() -> None:
    found = []
    for path in sorted((ROOT / "backends").rglob("*.py")):
        text = path.read_text()
        if "triton.jit" in text:
            found += string_constexpr_defaults(text, str(path.relative_to(ROOT)))
    assert not found, ("constexpr parameters with a string default (Triton 3.6 passes the bare str: "
                       f"'str' object has no attribute 'type'); pass the string at every call instead: {found}")


def test_the_rule_finds_the_softmax_slip() -> None:
    slip = ('import triton\nimport triton.language as tl\n\n@triton.jit\n'
            'def _row_sum(sums_row, S, PART: tl.constexpr, CACHE: tl.constexpr = ""):\n    pass\n\n'
            '@triton.jit\ndef _ok(x, F64: tl.constexpr = False, EVICT: tl.constexpr = None):\n    pass\n')
    assert string_constexpr_defaults(slip, "slip.py") == ["slip.py:5 _row_sum(CACHE)"]
