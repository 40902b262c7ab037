"""code_gen's pure parts: code extraction, the programs sent to the sandbox, output comparison, verdicts.

Nothing here runs model code; `app.py` sends the solution (wrapped by `call_program()` for call-based tests, after
the `prelude_for()` header) to the sandbox and grades the results with `grade()`. Expected outputs never enter the
sandbox, so nothing a program does in there can make a wrong answer pass.
"""

from __future__ import annotations

import importlib
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

from gymfleet.sandbox_client import RunResult

# The modules competitive-programming graders pre-import (star-imported, then `builtins` restored, then the module
# names bound), so solutions that forget an import still run, as they do under LiveCodeBench-style graders.
HEADER_MODULES = (
    "string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
    "itertools", "functools", "operator", "io", "sys", "json", "typing",
)  # fmt: skip
# Identifiers the program could look up: "deque" in "q = deque()" matches; "3rd" does not start one.
IDENTIFIER = re.compile(r"[^\W\d]\w*")
RESULT_MARKER = "\n@@gymfleet-call-result@@"
NEMO_CODES = {"wrong_answer": -2, "timeout": -3, "runtime_error": -4, "memory_limit": -4}
EXCERPT_CHARS = 300


def leaks_think_tags(output_text: str, reasoning_text: str) -> bool:
    """A `<think>`/`</think>` tag in the answer, or more than one of either in the reasoning summary."""
    if "<think>" in output_text or "</think>" in output_text:
        return True
    return reasoning_text.count("<think>") > 1 or reasoning_text.count("</think>") > 1


def prelude_for(code: str) -> str:
    """The grader header, limited to the modules whose name or exported names occur in `code` (same lookups)."""
    names = set(IDENTIFIER.findall(code))
    needed = [name for name in HEADER_MODULES if name in names or _exports(name) & names]
    lines = [f"from {name} import *" for name in needed if name != "typing"]
    lines.append("from builtins import *")
    lines += ["from typing import *"] if "typing" in needed else []
    lines += [f"import {name}" for name in needed if name != "typing"]
    lines += ["import sys", "sys.setrecursionlimit(50000)"]
    return "\n".join(lines) + "\n"


@cache
def _exports(module_name: str) -> frozenset[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [name for name in dir(module) if not name.startswith("_")]
    return frozenset(names)


def call_program(code: str, fn_name: str) -> str:
    """A driver around the solution for call-based tests. It runs the solution as a module, not as `__main__` (so
    example usage under `if __name__ == "__main__":` stays out, as LiveCodeBench imports it), with the solution's
    own prints sent to stderr; reads the JSON arguments (one per stdin line); calls `fn_name` (a method of
    `Solution()` when the code defines that class and it has one, else the top-level function); and prints the JSON
    result after a marker line."""
    return f"""import json as _gf_json, sys as _gf_sys
_gf_answer, _gf_sys.stdout = _gf_sys.stdout, _gf_sys.stderr
_gf_module = dict(globals(), __name__="solution")
exec(compile({code!r}, "solution.py", "exec"), _gf_module)
_gf_args = [_gf_json.loads(line) for line in _gf_sys.stdin.read().split("\\n") if line.strip()]
_gf_class = _gf_module.get("Solution")
_gf_method = getattr(_gf_class(), {fn_name!r}, None) if isinstance(_gf_class, type) else None
_gf_result = (_gf_method or _gf_module[{fn_name!r}])(*_gf_args)
_gf_answer.write({RESULT_MARKER!r} + _gf_json.dumps(_gf_result, default=repr) + "\\n")
_gf_answer.flush()
"""


def stdout_matches(got: str, expected: str) -> bool:
    """Line-wise comparison: same number of lines (after stripping the whole output and each line); each line equal,
    or all of its whitespace-separated tokens equal as decimals (`1.0` matches `1`)."""
    got_lines = [line.strip() for line in got.strip().split("\n")]
    expected_lines = [line.strip() for line in expected.strip().split("\n")]
    if len(got_lines) != len(expected_lines):
        return False
    return all(a == b or _same_decimals(a, b) for a, b in zip(got_lines, expected_lines, strict=True))


def _same_decimals(got: str, expected: str) -> bool:
    got_values, expected_values = _decimals(got), _decimals(expected)
    return got_values is not None and got_values == expected_values


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except (InvalidOperation, ValueError):
        return None


def call_result_matches(got_stdout: str, expected: str) -> bool:
    """The value after the driver's last marker equals the expected JSON: `==`, or as floats within 1e-5 relative
    (1e-8 absolute)."""
    raw = call_value_text(got_stdout)
    if raw is None:
        return False
    try:
        got = json.loads(raw)
    except ValueError:
        return False
    want = _json_or_text(expected)
    if got == want or json.dumps(got) == json.dumps(want):
        return True
    try:
        a, b = float(got), float(want)
    except (TypeError, ValueError):
        return False
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def call_value_text(stdout: str) -> str | None:
    """The JSON text the call driver printed after its (last) marker, or None when it printed none."""
    if RESULT_MARKER.strip() not in stdout:
        return None
    return stdout.rsplit(RESULT_MARKER.strip(), 1)[1].strip()


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


@dataclass
class Grade:
    """How a solution did: reward fields and the explanation."""

    reward: float
    verdict: str
    results: list[bool | int] = field(default_factory=list)
    failed_test: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    time_s: float = 0.0


def grade(results: list[RunResult], expected: list[str], call_based: bool, total: int) -> Grade:
    """Grade sandbox results in test order; the first failure decides (later results are ignored)."""
    codes: list[bool | int] = []
    time_s = sum(result.duration_s for result in results)
    for index, (result, want) in enumerate(zip(results, expected, strict=False)):
        verdict = _verdict(result, want, call_based)
        if verdict == "passed":
            codes.append(True)
            continue
        codes.append(NEMO_CODES[verdict])
        got = call_value_text(result.stdout) if call_based else result.stdout
        detail = {"test": index, "status": result.status, "message": result.message, "expected": _excerpt(want),
                  "got": _excerpt(got if got is not None else result.stdout),
                  "stderr": _excerpt(result.stderr, tail=True)}
        return Grade(0.0, verdict, codes, index, detail, time_s)
    if len(codes) < total:  # the sandbox reported fewer cases than asked for: the program broke the run
        return Grade(0.0, "runtime_error", codes, len(codes), {"message": "the run ended early"}, time_s)
    return Grade(1.0, "passed", codes, None, {}, time_s)


def _verdict(result: RunResult, expected: str, call_based: bool) -> str:
    if result.status == "timeout":
        return "timeout"
    if result.status == "oom":
        return "memory_limit"
    if result.status != "ok":
        return "runtime_error"
    if result.stdout_truncated:  # what was cut is unknown; a cut stderr (debug output) does not matter
        return "wrong_answer"
    matches = call_result_matches if call_based else stdout_matches
    return "passed" if matches(result.stdout, expected) else "wrong_answer"


def _excerpt(text: str, tail: bool = False) -> str:
    if len(text) <= EXCERPT_CHARS:
        return text
    return "..." + text[-EXCERPT_CHARS:] if tail else text[:EXCERPT_CHARS] + "..."
