"""`tokens._check` (every model call's token data, checked before anyone trains on it) against the plain definition
it implements in C-speed builtins: every id an int (not a bool) >= 0, a non-empty prompt, one finite logprob per
generated token, and the first bad logprob named. Generated over the whole family of what JSON can carry in those
lists (bools, negative ids, floats, nan/inf spellings, None, strings, nested values), at any position."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gymfleet.errors import UpstreamError
from gymfleet.wire import TOKEN_FIELDS
from responses_api_models.vllm_model import tokens


def _reference(prompt: Any, generation: Any, logprobs: Any) -> str | None:
    """The check written out one value at a time: the reason it fails, or None."""

    def is_id(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(prompt, list) or not prompt or not all(is_id(token) for token in prompt):
        return "prompt_token_ids must be a non-empty list of token ids"
    if not isinstance(generation, list) or not all(is_id(token) for token in generation):
        return "generation_token_ids must be a list of token ids"
    if not isinstance(logprobs, list) or len(logprobs) != len(generation):
        count = len(logprobs) if isinstance(logprobs, list) else type(logprobs).__name__
        return f"{len(generation)} generated tokens but {count} logprobs"
    for position, value in enumerate(logprobs):
        finite = isinstance(value, int | float) and not isinstance(value, bool)
        try:
            finite = finite and math.isfinite(value)
        except OverflowError:
            finite = False
        if not finite:
            return f"generation logprob {position} is {value!r}, not a finite number"
    return None


def _verdict(prompt: Any, generation: Any, logprobs: Any) -> str | None:
    try:
        tokens._check(dict(zip(TOKEN_FIELDS, (prompt, generation, logprobs), strict=True)), "http://upstream")
    except UpstreamError as exc:
        assert exc.failure_class == tokens.FAILURE_CLASS
        return str(exc).removeprefix("upstream http://upstream: ")
    return None


IDS = st.integers(min_value=0, max_value=2**31)
ODD = st.one_of(st.booleans(), st.integers(max_value=-1), st.floats(allow_nan=True, allow_infinity=True),
                st.none(), st.text(max_size=5), st.just([1]), st.just({"id": 1}), st.integers(min_value=2**64))
LOGPROBS = st.one_of(st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                     st.integers(min_value=-50, max_value=0))


@st.composite
def _lists(draw, good, odd, min_size=0):
    """A list of `good` values with, half the time, `odd` ones at random positions."""
    values = draw(st.lists(good, min_size=min_size, max_size=40))
    if draw(st.booleans()):
        for _ in range(draw(st.integers(1, 3))):
            values.insert(draw(st.integers(0, len(values))), draw(odd))
    return values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_check_agrees_with_the_one_value_at_a_time_definition(data):
    prompt = data.draw(_lists(IDS, ODD, min_size=data.draw(st.sampled_from([0, 1]))))
    generation = data.draw(_lists(IDS, ODD))
    size = len(generation) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    logprobs = data.draw(_lists(LOGPROBS, ODD)) if size < 0 else data.draw(
        st.lists(LOGPROBS, min_size=size, max_size=size))
    if logprobs and data.draw(st.booleans()):  # one bad logprob at a random place, keeping the length
        logprobs[data.draw(st.integers(0, len(logprobs) - 1))] = data.draw(ODD)
    assert _verdict(prompt, generation, logprobs) == _reference(prompt, generation, logprobs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), True, None, "0.5", 10**400, [0.0]])
@pytest.mark.parametrize("where", [0, 7, -1])
def test_a_bad_logprob_anywhere_is_named(bad, where):
    logprobs = [-0.5] * 8
    logprobs[where] = bad
    expected = f"generation logprob {where % 8} is {bad!r}, not a finite number"
    assert _verdict([1, 2], list(range(8)), logprobs) == expected


def test_finite_logprobs_whose_sum_overflows_pass():
    huge = [1e308, 1e308, -0.5]  # each finite, their sum is not: the exact way decides
    assert _verdict([1], [1, 2, 3], huge) is None


@pytest.mark.parametrize("prompt", [[True], [-1], [1.0], [1, None], ["1"], []])
def test_bad_prompt_ids_are_refused(prompt):
    assert _verdict(prompt, [1], [-0.1]) == "prompt_token_ids must be a non-empty list of token ids"


TOKENS = st.one_of(IDS.map(lambda token: f"token_id:{token}"),
                   st.sampled_from(["token_id:-3", "token_id: 7", "token_id:1_0", "token_id:+4", "token_id:x",
                                    "token_id:", "Token_id:5", "x", "", "ｔoken_id:5"]),
                   st.integers(), st.none(), st.floats(allow_nan=False))
ENTRIES = st.one_of(
    st.fixed_dictionaries({"token": TOKENS, "logprob": st.one_of(LOGPROBS, ODD)}),
    st.fixed_dictionaries({"token": TOKENS}), st.fixed_dictionaries({"logprob": LOGPROBS}),
    st.sampled_from([None, "token_id:5", ["token_id:5"], 7]),
)


def _one_at_a_time(entries: list[Any]) -> list[int] | str:
    try:
        return [tokens._token_id(entry, "http://upstream") for entry in entries]
    except UpstreamError as exc:
        return str(exc)
    except AttributeError:  # an entry that is not an object: the request fails as it always did (a 500)
        return "not an object"


@settings(max_examples=400, deadline=None)
@given(st.lists(ENTRIES, max_size=30), st.data())
def test_reading_ids_and_logprobs_in_c_reads_what_one_at_a_time_does(entries, data):
    if data.draw(st.booleans()):  # mostly well-formed: vLLM's answer with a few odd entries in it
        entries = [{"token": f"token_id:{index}", "logprob": -0.25} for index in range(data.draw(st.integers(0, 30)))]
        if entries and data.draw(st.booleans()):
            entries[data.draw(st.integers(0, len(entries) - 1))] = data.draw(ENTRIES)
    fast = tokens._named_ids(entries)
    slow = _one_at_a_time(entries)
    if fast is not None:
        assert fast == slow
    else:  # the slow way is taken only where it fails, naming the entry
        assert not isinstance(slow, list), f"every entry named an id, yet the ids were read one at a time: {entries}"
    expected = [entry.get("logprob") if isinstance(entry, dict) else None for entry in entries]
    assert tokens._logprobs_of(entries) == expected
