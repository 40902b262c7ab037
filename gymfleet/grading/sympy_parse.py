"""SymPy's `parse_expr` without its per-call `from sympy import *`: the same results, a third less CPU per math check.

`sympy.parsing.sympy_parser.parse_expr(s)` called without a `global_dict` builds its namespace afresh on every
call: `exec("from sympy import *")` (about 900 names), plus Python's builtin functions, `max`/`min` as SymPy's
`Max`/`Min`. That costs about 0.4 ms, and math-verify pays it many times per answer, mostly through
latex2sympy's `sympy.Number("123")` for every number literal (`Number` -> `sympify` -> `parse_expr`): measured on
`bench/math_verify_throughput.py`'s answers, a third of math-verify's CPU time per check.

`install()` replaces `parse_expr` (the attribute of `sympy.parsing.sympy_parser`, which `sympify` imports at each
call, and math-verify's own import of it) with a wrapper that, when no `global_dict` is given, passes a fresh copy
of a namespace built once by the very same steps. A copy per call, so whatever one evaluation leaves in its
namespace never reaches the next, exactly as with SymPy's fresh dict. Every argument given is passed through
unchanged, so results and errors are SymPy's (`tests/test_sympy_parse.py` compares the two on generated inputs).

Used inside `gymfleet.grading.mathcheck`'s worker processes only (the fork server installs it before forking), never
in a server process.
"""

from __future__ import annotations

import builtins
import functools
import types
from collections.abc import Callable
from typing import Any

__all__ = ["install", "installed", "sympy_namespace", "with_namespace"]

_ORIGINAL: Callable[..., Any] | None = None


def sympy_namespace() -> dict[str, Any]:
    """The namespace SymPy's `parse_expr` builds when it is given no `global_dict` (same steps, same order)."""
    from sympy import Max, Min

    namespace: dict[str, Any] = {}
    exec("from sympy import *", namespace)  # noqa: S102 - SymPy's own step, on a constant string
    for name, value in vars(builtins).items():
        if isinstance(value, types.BuiltinFunctionType):
            namespace[name] = value
    namespace["max"] = Max
    namespace["min"] = Min
    return namespace


def with_namespace(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (SymPy's `parse_expr`) given a fresh copy of `sympy_namespace()` when called without a
    `global_dict`; everything else passes through unchanged."""
    from sympy.parsing.sympy_parser import standard_transformations

    template = sympy_namespace()

    @functools.wraps(original)
    def parse_expr(s: str, local_dict: Any = None, transformations: Any = standard_transformations,
                   global_dict: Any = None, evaluate: Any = True) -> Any:
        if global_dict is None:
            global_dict = template.copy()
        return original(s, local_dict, transformations, global_dict, evaluate)

    return parse_expr


def installed() -> bool:
    """Whether `install()` has replaced SymPy's `parse_expr` in this process."""
    return _ORIGINAL is not None


def install() -> None:
    """Replace `parse_expr` in `sympy.parsing.sympy_parser` (and math-verify's reference to it, when math-verify is
    imported) with the wrapper described in the module docstring. Idempotent."""
    global _ORIGINAL
    if _ORIGINAL is not None:
        return
    from sympy.parsing import sympy_parser

    original = sympy_parser.parse_expr
    parse_expr = with_namespace(original)
    sympy_parser.parse_expr = parse_expr
    try:
        import math_verify.parser as math_verify_parser
    except ImportError:
        math_verify_parser = None
    if math_verify_parser is not None and getattr(math_verify_parser, "parse_expr", None) is original:
        math_verify_parser.parse_expr = parse_expr
    _ORIGINAL = original
