"""Table tests of code_gen's pure parts: comparison, think-tag leaks, the header, grading."""

from __future__ import annotations

import pytest

from gymfleet.grading.sandbox_client import RunResult
from resources_servers.code_gen.checker import (
    RESULT_MARKER,
    call_result_matches,
    grade,
    json_nests_deeper,
    leaks_think_tags,
    prelude_for,
    stdout_matches,
)


@pytest.mark.parametrize(("got", "expected", "same"), [
    ("5\n", "5\n", True),
    ("  1 2 3  \n\n", "1 2 3", True),
    ("2.5\n", "2.500000\n", True),
    ("1e3", "1000", True),
    ("1 2\n3", "1 2 3", False),
    ("2.5000001", "2.5", False),
    ("YES", "yes", False),
    ("", "0", False),
    ("a b", "a  b", False),
    ("1\r\n2\r\n", "1\n2\n", True),
    ("sNaN", "5", False),
    ("5", "sNaN", False),
    ("sNaN", "sNaN", True),
    ("sNaN 1", "sNaN 1.0", False),
    ("NaN", "NaN", True),
    ("nan", "NaN", False),
    ("Infinity", "inf", True),
    ("1e999999999", "1e999999999", True),
    ("1e999999999", "1E+999999999", True),
    ("1e999999999", "1e-999999999", False),
    ("1e99999999999999999999", "1e99999999999999999999", True),
    ("1e99999999999999999999", "1e99999999999999999999 ", True),
    ("1e99999999999999999999", "1e099999999999999999999", False),
    ("1_000", "1000", True),
    ("\udc80", "\udc80", True),
    ("\udc80 1", "\udc81 1", False),
], ids=["exact", "whitespace", "decimal-padding", "exponent", "line-count", "not-tolerant", "case", "empty",
        "inner-space", "crlf", "snan-for-number", "number-for-snan", "snan-as-text", "snan-and-decimal",
        "nan-as-text", "nan-spelling", "infinity", "huge-exponent", "huge-exponent-spelling",
        "huge-vs-tiny-exponent", "exponent-past-decimal-range", "past-range-as-text", "past-range-spelling",
        "underscores", "lone-surrogate", "lone-surrogates-differ"])
def test_stdout_matches(got, expected, same):
    assert stdout_matches(got, expected) is same


@pytest.mark.parametrize(("value", "expected", "same"), [
    ("[1, 2]", "[1, 2]", True),
    ("3", "3.0", True),
    ("0.30000000000000004", "0.3", True),
    ("0.31", "0.3", False),
    ('"abc"', '"abc"', True),
    ("true", "true", True),
    ("[1, 2]", "[2, 1]", False),
    ("0.5", '"0.5"', False),
    ('"6"', "6", False),
    ("6", '"6"', False),
    ('"6"', '"6"', True),
    ("[6.0, 2]", "[6, 2]", True),
    ("[0.30000000000000004]", "[0.3]", False),
    ("NaN", "NaN", True),
    ("[NaN]", "[NaN]", True),
    ("Infinity", "1e400", True),
    ("1" + "0" * 400, "1e400", False),
    ("1" + "0" * 400, "1" + "0" * 400, True),
    ("1" * 5000, "1" * 5000, False),
    ("{}", "[]", False),
    ('{"a": [1]}', '{"a": [1.0]}', True),
    ("null", "null", True),
    ("null", "0", False),
    ('"abc"', "abc", True),
    ("[[1]", "[[1]]", False),
    ("[" * 5000 + "]" * 5000, "[]", False),
    ("[" * 100 + "]" * 100, "[" * 100 + "]" * 100, True),
    ("[" * 101 + "]" * 101, "[" * 101 + "]" * 101, False),
    ('["' + "[" * 5000 + '"]', '["' + "[" * 5000 + '"]', True),
], ids=["list", "int-float", "float-close", "float-far", "string", "bool", "order", "float-for-string",
        "string-for-number", "number-for-string", "string-number-as-string", "nested-int-float",
        "nested-float-not-tolerant", "nan", "nested-nan", "infinity", "int-past-float-range", "huge-int",
        "too-many-digits", "object-vs-array", "object-int-float", "null", "null-vs-zero", "expected-not-json",
        "not-json", "deep-result", "at-the-depth-bound", "past-the-depth-bound", "brackets-in-a-string"])
def test_call_result_matches(value, expected, same):
    assert call_result_matches(f"debug print{RESULT_MARKER}{value}\n", expected) is same


@pytest.mark.parametrize(("text", "deeper"), [
    ("[" * 101, True),
    ("[" * 100 + "]" * 100, False),
    ("{" * 101, True),
    ('[{"a": ' * 51, True),
    ("[]" * 1000, False),
    ('"' + "[" * 101, False),
    ("[" * 101 + '"', True),
    ('["\\"' + "[" * 200 + '"]', False),
    ('["\\\\"' + "[" * 200, True),
    ('"\\' * 20_000 + "[" * 200, False),
    ("[" * 101 + '"\\' * 20_000, True),
], ids=["open", "at-the-bound", "objects", "mixed", "flat", "in-unterminated-string", "before-a-quote",
        "escaped-quote", "escaped-backslash", "after-escaped-quotes", "before-escaped-quotes"])
def test_json_nests_deeper(text, deeper):
    assert json_nests_deeper(text) is deeper


def test_call_result_needs_the_drivers_marker():
    assert not call_result_matches("[1, 2]\n", "[1, 2]")


@pytest.mark.parametrize(("answer", "reasoning", "leaks"), [
    ("```python\nx\n```", "", False),
    ("<think>oops</think>```python\nx\n```", "", True),
    ("answer</think>", "", True),
    ("fine", "<think>a</think>", False),
    ("fine", "<think>a</think><think>b</think>", True),
], ids=["clean", "think-in-answer", "close-tag", "one-pair-in-reasoning", "two-in-reasoning"])
def test_leaks_think_tags(answer, reasoning, leaks):
    assert leaks_think_tags(answer, reasoning) is leaks


def test_the_header_imports_only_what_the_code_can_name():
    header = prelude_for("q = deque()\nprint(sqrt(4), List)")
    assert "from collections import *" in header and "from math import *" in header
    assert "from typing import *" in header and "from statistics import *" not in header
    assert header.index("from math import *") < header.index("from builtins import *") < header.index("import math")
    assert "sys.setrecursionlimit(50000)" in header
    assert "import re" not in prelude_for("print(int(input()) + 1)")


def _run(status="ok", stdout="", duration_s=0.01, cut: str = "") -> RunResult:
    return RunResult(status=status, stdout=stdout, stderr="", return_code=0 if status == "ok" else 1,
                     duration_s=duration_s, truncated=bool(cut),
                     stdout_truncated=cut == "stdout")


@pytest.mark.parametrize(("results", "reward", "verdict", "codes"), [
    ([_run(stdout="1"), _run(stdout="2")], 1.0, "passed", [True, True]),
    ([_run(stdout="1"), _run(stdout="3")], 0.0, "wrong_answer", [True, -2]),
    ([_run("timeout")], 0.0, "timeout", [-3]),
    ([_run("failed")], 0.0, "runtime_error", [-4]),
    ([_run("oom")], 0.0, "memory_limit", [-4]),
    ([_run(stdout="1")], 0.0, "runtime_error", [True]),
    ([_run(stdout="1"), _run(stdout="2", cut="stdout")], 0.0, "wrong_answer", [True, -2]),
    ([_run(stdout="1"), _run(stdout="2", cut="stderr")], 1.0, "passed", [True, True]),
], ids=["all-pass", "wrong-second", "timeout", "crash", "oom", "cut-short", "stdout-cut", "only-stderr-cut"])
def test_grade(results, reward, verdict, codes):
    graded = grade(results, ["1", "2"], call_based=False, total=2)
    assert (graded.reward, graded.verdict, graded.results) == (reward, verdict, codes)
