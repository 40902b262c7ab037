"""Property tests: code_gen's comparisons are total over any text a program can print, and row parsing over any
`unit_tests` string is a value or a validation error (gymfleet issue 10, item 2). Derandomized, no example database,
a fixed budget: the same examples on every run."""

from __future__ import annotations

import contextlib
import json
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gymfleet.grading.sandbox_client import RunResult
from resources_servers.code_gen.app import VerifierMetadata
from resources_servers.code_gen.checker import (
    MAX_JSON_DEPTH,
    RESULT_MARKER,
    call_result_matches,
    grade,
    json_nests_deeper,
    stdout_matches,
)


@pytest.fixture(scope="module", autouse=True)
def _quiet_patching_import():
    """Hypothesis's pytest plugin imports this (libcst, which warns on import) when it reports a failing example;
    under `filterwarnings = error` that warning would turn a failing property into an INTERNALERROR, so it is
    imported quietly before the first test (not at collection: ~0.6 CPU s in every xdist worker)."""
    with warnings.catch_warnings(), contextlib.suppress(ImportError):
        warnings.simplefilter("ignore", DeprecationWarning)
        import hypothesis.extra._patching  # noqa: F401


SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)

# Pieces that reach the corners of the comparisons more often than random characters do.
PIECES = st.sampled_from([
    "sNaN", "-sNaN7", "NaN", "nan", "Infinity", "-inf", "1e999999999", "1e-999999999", "1e99999999999999999999",
    "0", "1", "1.0", "-0", "5", "1_0", "٣", "[", "]", "{", "}", '"', "\\", ",", ":", "true", "null", " ", "\n",
    "\r\n", "\t", "\udc80", "\ud800", "\x00", "€", RESULT_MARKER, RESULT_MARKER.strip(), "[" * 3000, "9" * 5000,
])  # fmt: skip
TEXT = st.one_of(st.text(), st.lists(PIECES, max_size=12).map("".join), st.lists(st.one_of(PIECES, st.text(
    max_size=5)), max_size=12).map("".join))
# Program output as the sandbox sees it: any bytes, decoded the way a grader might decode them.
DECODED = st.tuples(st.binary(max_size=200), st.sampled_from(["replace", "surrogateescape"])).map(
    lambda pair: pair[0].decode("utf-8", errors=pair[1]))
OUTPUT = st.one_of(TEXT, DECODED)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@SETTINGS
@given(got=OUTPUT, expected=OUTPUT)
def test_stdout_comparison_is_total(got, expected):
    assert stdout_matches(got, expected) in (True, False)


@SETTINGS
@given(text=OUTPUT)
def test_any_output_matches_itself_on_stdin_tests(text):
    assert stdout_matches(text, text) is True


@SETTINGS
@given(got=OUTPUT, expected=OUTPUT, marked=st.booleans())
def test_call_comparison_is_total(got, expected, marked):
    stdout = f"debug{RESULT_MARKER}{got}" if marked else got
    assert call_result_matches(stdout, expected) in (True, False)


@SETTINGS
@given(value=JSON_VALUES)
def test_a_json_value_matches_itself_on_call_tests(value):
    text = json.dumps(value)
    assert call_result_matches(f"{RESULT_MARKER}{text}\n", text) is True


@SETTINGS
@given(value=JSON_VALUES, wrap=st.integers(0, 2 * MAX_JSON_DEPTH))
def test_the_depth_scan_agrees_with_the_value(value, wrap):
    text = "[" * wrap + json.dumps(value) + "]" * wrap
    assert json_nests_deeper(text) is (wrap + _depth(value) > MAX_JSON_DEPTH)


@SETTINGS
@given(text=OUTPUT)
def test_text_within_the_depth_bound_never_makes_the_json_parser_recurse_too_far(text):
    if not json_nests_deeper(text):
        with contextlib.suppress(ValueError):  # not JSON: an error, never a RecursionError
            json.loads(text)


@SETTINGS
@given(stdouts=st.lists(OUTPUT, min_size=1, max_size=3), expected=st.lists(OUTPUT, min_size=3, max_size=3),
       call_based=st.booleans(), cut=st.booleans())
def test_grading_any_output_is_a_reward(stdouts, expected, call_based, cut):
    results = [RunResult(status="ok", stdout=stdout, stderr=stdout, return_code=0, duration_s=0.0, truncated=cut,
                         stdout_truncated=cut) for stdout in stdouts]
    graded = grade(results, expected, call_based, total=3)
    assert graded.reward in (0.0, 1.0) and graded.verdict in ("passed", "wrong_answer", "runtime_error")


@SETTINGS
@given(unit_tests=OUTPUT)
def test_any_unit_tests_string_is_a_row_or_a_validation_error(unit_tests):
    try:
        VerifierMetadata.model_validate({"unit_tests": unit_tests})
    except ValidationError as exc:
        assert all(error["loc"][0] == "unit_tests" for error in exc.errors())


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deep_unit_tests_strings_are_a_validation_error(depth):
    with pytest.raises(ValidationError, match="nests deeper"):
        VerifierMetadata.model_validate({"unit_tests": "[" * depth + "]" * depth})


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0
