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
from itertools import accumulate
from typing import Any

from gymfleet.grading.sandbox_client import RunResult

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
# Deepest JSON the grader parses (returned values, expected values, a row's `unit_tests`): contest answers nest a
# few levels; the parser and `==` recurse once per level, so a deeper value is a wrong answer or a 422, not a crash.
MAX_JSON_DEPTH = 100
# A JSON string, or an unterminated one up to the end. Possessive and never failing once at a quote, so the scan is
# linear on any text (a plain `"(?:[^"\\]|\\.)*"` retries from every quote of `"\"\"\...`: quadratic).
_JSON_STRING = re.compile(r'"(?:[^"\\]++|\\.?)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


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
    or all of its whitespace-separated tokens equal as decimals (`1.0` matches `1`). Total: any text is a bool."""
    return stdout_mismatch(got, expected) is None


def stdout_mismatch(got: str, expected: str) -> str | None:
    """Why `got` does not match `expected` as `stdout_matches()` compares them, or None when it does. Never raises:
    a token that is no finite-or-infinite decimal (`sNaN`, `NaN`, `1e99999999999999999999`, text) makes its line
    compare as text only."""
    got_lines = [line.strip() for line in got.strip().split("\n")]
    expected_lines = [line.strip() for line in expected.strip().split("\n")]
    if len(got_lines) != len(expected_lines):
        return f"{len(got_lines)} lines printed, {len(expected_lines)} expected"
    for number, (a, b) in enumerate(zip(got_lines, expected_lines, strict=True), 1):
        if a != b and not _same_decimals(a, b):
            return f"line {number} differs"
    return None


def _same_decimals(got: str, expected: str) -> bool:
    got_tokens, expected_tokens = got.split(), expected.split()
    if len(got_tokens) != len(expected_tokens):  # before parsing any of a program's (maybe huge) tokens
        return False
    expected_values = _decimals(expected_tokens)
    if expected_values is None:
        return False
    got_values = _decimals(got_tokens)
    return got_values is not None and got_values == expected_values


def _decimals(tokens: list[str]) -> list[Decimal] | None:
    """The tokens as decimals, or None when one is not a number. A NaN (quiet or signaling) is not one: it
    equals nothing, and comparing a signaling NaN raises. Equality of the rest is exact and cheap at any exponent."""
    try:
        values = [Decimal(token) for token in tokens]
    except (InvalidOperation, ValueError):
        return None
    return None if any(value.is_nan() for value in values) else values


def call_result_matches(got_stdout: str, expected: str) -> bool:
    """The value after the driver's last marker equals the expected JSON: equal as Python values (tuples came back
    as lists; `1 == 1.0`), the same JSON text, or both numbers within 1e-5 relative (1e-8 absolute). A string
    never equals a number (`"6"` is not `6`). Total: any text is a bool."""
    return call_result_mismatch(got_stdout, expected) is None


def call_result_mismatch(got_stdout: str, expected: str) -> str | None:
    """Why the call driver's output does not match `expected` as `call_result_matches()` compares them, or None when
    it does. Never raises: a value nesting deeper than `MAX_JSON_DEPTH` is not parsed at all."""
    raw = call_value_text(got_stdout)
    if raw is None:
        return "the call printed no result"
    if json_nests_deeper(raw):
        return f"the returned value nests deeper than {MAX_JSON_DEPTH} levels"
    try:
        got = json.loads(raw)
    except ValueError:  # also a number of more than 4300 digits
        return "the returned value is not JSON"
    if json_nests_deeper(expected):
        return f"the expected value nests deeper than {MAX_JSON_DEPTH} levels"
    want = _json_or_text(expected)
    return None if _same_value(got, want) else "the returned value differs"


def _same_value(got: Any, want: Any) -> bool:
    """The spec's `==` / same `json.dumps` / `allclose(float, float)`, the float branch for numbers only. The
    values nest at most `MAX_JSON_DEPTH` deep, so neither `==` nor `json.dumps` can recurse too far."""
    if got == want or json.dumps(got) == json.dumps(want):
        return True
    if not (isinstance(got, int | float) and isinstance(want, int | float)):
        return False
    try:
        a, b = float(got), float(want)
    except OverflowError:  # an integer past float's range: only `==` could match it
        return False
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def json_nests_deeper(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `text` opens more than `limit` arrays/objects inside each other, counting the brackets outside JSON
    strings. That bounds the depth `json.loads` would recurse to on any text, valid JSON or not, so callers check it
    first (the parser recurses once per level, a RecursionError past ~1000). Linear in `text`; a text with at most
    `limit` brackets is not scanned at all."""
    if text.count("[") + text.count("{") <= limit:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > limit


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
    """Grade sandbox results in test order; the first failure decides (later results are ignored). A wrong answer's
    `detail` says why (`reason`)."""
    codes: list[bool | int] = []
    time_s = sum(result.duration_s for result in results)
    for index, (result, want) in enumerate(zip(results, expected, strict=False)):
        verdict, reason = _verdict(result, want, call_based)
        if verdict == "passed":
            codes.append(True)
            continue
        codes.append(NEMO_CODES[verdict])
        got = call_value_text(result.stdout) if call_based else result.stdout
        detail = {"test": index, "status": result.status, "message": result.message, "expected": _excerpt(want),
                  "got": _excerpt(got if got is not None else result.stdout),
                  "stderr": _excerpt(result.stderr, tail=True)}
        if reason is not None:
            detail["reason"] = reason
        return Grade(0.0, verdict, codes, index, detail, time_s)
    if len(codes) < total:  # the sandbox reported fewer cases than asked for: the program broke the run
        return Grade(0.0, "runtime_error", codes, len(codes), {"message": "the run ended early"}, time_s)
    return Grade(1.0, "passed", codes, None, {}, time_s)


def outputs_agree(printed: str, expected: str, call_based: bool) -> bool:
    """Whether a program that answers `printed` (a call test: that JSON value) passes where `expected` is."""
    if call_based:
        return call_result_mismatch(RESULT_MARKER + printed, expected) is None
    return stdout_mismatch(printed, expected) is None


def passes(result: RunResult, expected: str, call_based: bool) -> bool:
    """Whether one run's result passes its test, as `grade()` judges it."""
    return _verdict(result, expected, call_based)[0] == "passed"


def _verdict(result: RunResult, expected: str, call_based: bool) -> tuple[str, str | None]:
    """The test's verdict and, for a wrong answer, why."""
    if result.status == "timeout":
        return "timeout", None
    if result.status == "oom":
        return "memory_limit", None
    if result.status != "ok":
        return "runtime_error", None
    if result.stdout_truncated:  # what was cut is unknown; a cut stderr (debug output) does not matter
        return "wrong_answer", "the output was cut at the sandbox's output limit"
    mismatch = call_result_mismatch if call_based else stdout_mismatch
    reason = mismatch(result.stdout, expected)
    return ("passed", None) if reason is None else ("wrong_answer", reason)


def _excerpt(text: str, tail: bool = False) -> str:
    if len(text) <= EXCERPT_CHARS:
        return text
    return "..." + text[-EXCERPT_CHARS:] if tail else text[:EXCERPT_CHARS] + "..."
