"""gymfleet.grading.toolcalls: action extraction, the recursive argument rule, and order-free multi-call matching."""

from __future__ import annotations

import itertools
import json

import pytest

from gymfleet.grading.toolcalls import (
    Action,
    ArgumentsError,
    Call,
    compare_calls,
    compare_values,
    extract_action,
    first_message_text,
    function_calls,
    match_calls,
    max_matching,
    parse_arguments,
    word_overlap,
)
from gymfleet.testing import make_response


def _call(name: str, **arguments) -> Call:
    return Call(name, json.dumps(arguments))


# ----------------------------------------------------------------------------------------------------- extraction


def test_extract_action_reads_every_call_in_order():
    response = make_response("Let me look.", tool_calls=[("get_weather", {"city": "Oslo"}), ("get_time", {})])
    action = extract_action(response)
    assert action == Action("calls", calls=(_call("get_weather", city="Oslo"), Call("get_time", "{}")))


def test_extract_action_reads_the_first_message_when_there_is_no_call():
    response = make_response("You're welcome!", reasoning="they thanked me")
    response["output"].append({**response["output"][-1], "content": [{"type": "output_text", "text": "second"}]})
    assert extract_action(response) == Action("message", text="You're welcome!")


def test_extract_action_without_message_or_call_is_none():
    assert extract_action(make_response(reasoning="thinking only")) is None
    assert extract_action(make_response()) is None


def test_message_without_output_text_is_no_action():
    response = make_response("x")
    response["output"][0]["content"] = [{"type": "refusal", "refusal": "no"}]
    assert first_message_text(response) is None and extract_action(response) is None


def test_function_calls_accepts_wire_models():
    from gymfleet.wire import Response

    response = Response.model_validate(make_response(tool_calls=[("a", "{}")]))
    assert function_calls(response) == [Call("a", "{}")]


# ------------------------------------------------------------------------------------------------------ arguments


def test_parse_arguments_names_bad_json():
    assert parse_arguments('{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
    for text in ("", "{city: Oslo}", '{"a": 1', "[" * 100_000):
        with pytest.raises(ArgumentsError, match="not valid JSON"):
            parse_arguments(text)


@pytest.mark.parametrize(
    ("expected", "actual", "value"),
    [
        ("book a flight", "book a flight", 0.5),
        ("book a flight", "Book A FLIGHT", 0.5),
        ("a b c d", "a b", 2 / 6),
        ("the the cat", "the cat cat", 2 / 6),  # multisets: one "the" and one "cat" in common
        ("x y", "z w", 0.0),
        ("", "", 0.0),
    ],
)
def test_word_overlap(expected, actual, value):
    assert word_overlap(expected, actual) == pytest.approx(value)


MATCH, MISS = True, False


@pytest.mark.parametrize(
    ("expected", "actual", "threshold", "matches"),
    [
        ({"city": "Paris"}, {"city": "Paris"}, 0.1, MATCH),
        ({"city": "Paris"}, {"city": "paris"}, 0.1, MISS),  # one word: exact equality
        ({"city": "Paris"}, {"city": "Paris "}, 0.1, MISS),
        ({"city": "Paris"}, {"city": "Paris France"}, 0.0, MISS),  # either side one word: exact
        ({"q": "cheap flights to rome"}, {"q": "Rome flights cheap"}, 0.3, MATCH),  # 3/7 = 0.43
        ({"q": "cheap flights to rome"}, {"q": "rome hotels near the station"}, 0.3, MISS),  # 1/9
        ({"q": "cheap flights to rome"}, {"q": "rome hotels near the station"}, 0.1, MATCH),  # 0.11
        ({"q": "cheap flights to rome"}, {"q": "completely unrelated words"}, 0.0, MATCH),  # thr 0: any multi-word
        ({"q": "cheap flights to rome"}, {"q": "rome"}, 0.0, MISS),
        ({"n": 3}, {"n": 3}, 0.1, MATCH),
        ({"n": 3}, {"n": 4}, 0.1, MISS),
        ({"n": 3}, {"n": 3.0}, 0.1, MATCH),  # departure: NeMo-Gym rejects 3.0 for an expected int
        ({"x": 2.5}, {"x": 2.5000000001}, 0.1, MATCH),
        ({"x": 2.5}, {"x": 2.6}, 0.1, MISS),
        ({"x": 2.0}, {"x": 2}, 0.1, MATCH),  # departure: NeMo-Gym rejects an int for an expected float
        ({"x": 1.0}, {"x": 10**400}, 0.1, MISS),  # too large for a float: no crash
        ({"n": 1}, {"n": True}, 0.1, MISS),  # departure: NeMo-Gym lets true match 1
        ({"flag": True}, {"flag": 1}, 0.1, MISS),
        ({"flag": False}, {"flag": False}, 0.1, MATCH),
        ({"v": None}, {"v": None}, 0.1, MATCH),
        ({"v": None}, {"v": "null"}, 0.1, MISS),
        ({"n": 3}, {"n": "3"}, 0.1, MISS),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1}, 0.1, MATCH),
        ({"a": 1}, {"a": 1, "b": 2}, 0.1, MISS),  # an extra key
        ({"a": 1, "b": 2}, {"a": 1}, 0.1, MISS),  # a missing key
        ({"ids": [1, 2]}, {"ids": [1, 2]}, 0.1, MATCH),
        ({"ids": [1, 2]}, {"ids": [2, 1]}, 0.1, MISS),  # lists are ordered
        ({"ids": [1, 2]}, {"ids": [1, 2, 3]}, 0.1, MISS),
        ({"ids": [1, 2]}, {"ids": "1, 2"}, 0.1, MISS),
        ({"f": {"g": [{"h": "deep value here"}]}}, {"f": {"g": [{"h": "here deep"}]}}, 0.1, MATCH),
        ({"f": {"g": [{"h": "x"}]}}, {"f": {"g": [{"h": "y"}]}}, 0.1, MISS),
        ({}, {}, 0.1, MATCH),
        ({}, [], 0.1, MISS),
    ],
)
def test_compare_values_table(expected, actual, threshold, matches):
    reason = compare_values(expected, actual, threshold)
    assert (reason is None) is matches, reason


def test_compare_values_names_the_path():
    reason = compare_values({"a": {"b": [1, "x"]}}, {"a": {"b": [1, "y"]}}, 0.1)
    assert reason is not None and reason.startswith("arguments.a.b[1]:")


def test_compare_values_threshold_is_inclusive():
    assert compare_values("a b", "a c", 0.25) is None  # 1/4 == 0.25
    assert compare_values("a b", "a c", 0.2500001) is not None


# ------------------------------------------------------------------------------------------------- whole calls


@pytest.mark.parametrize(
    ("actual", "reason_part"),
    [
        (_call("get_weather", city="Paris"), None),
        (_call("get_forecast", city="Paris"), "called 'get_forecast'"),
        (Call("get_weather", '{"city": "Paris"'), "not valid JSON"),
        (Call("get_weather", ""), "not valid JSON"),
        (Call("get_weather", '"Paris"'), "expected dict, got str"),
        (_call("get_weather", city="Lyon"), "arguments.city"),
        (_call("get_weather", city="Paris", units="C"), "keys differ"),
    ],
    ids=["right", "wrong-tool", "truncated-json", "empty-args", "args-not-object", "wrong-value", "extra-key"],
)
def test_compare_calls(actual, reason_part):
    reason = compare_calls(_call("get_weather", city="Paris"), actual, 0.1)
    assert reason is None if reason_part is None else reason_part in reason


# ------------------------------------------------------------------------------------------------------ matching


def _brute_force_size(n_left: int, n_right: int, edges: set[tuple[int, int]]) -> int:
    best = 0
    for size in range(min(n_left, n_right), 0, -1):
        for lefts in itertools.combinations(range(n_left), size):
            for rights in itertools.permutations(range(n_right), size):
                if all((i, j) in edges for i, j in zip(lefts, rights, strict=True)):
                    return size
    return best


@pytest.mark.parametrize("seed", range(40))
def test_max_matching_is_maximum(seed):
    import random

    rng = random.Random(seed)
    n_left, n_right = rng.randint(0, 4), rng.randint(0, 5)
    edges = {(i, j) for i in range(n_left) for j in range(n_right) if rng.random() < 0.4}
    pairs = max_matching(n_left, n_right, lambda i, j: (i, j) in edges)
    assert all(pair in edges for pair in pairs)
    assert len({i for i, _ in pairs}) == len({j for _, j in pairs}) == len(pairs)
    assert len(pairs) == _brute_force_size(n_left, n_right, edges)


def test_max_matching_reassigns_a_greedy_choice():
    # Left 0 can take 0 or 1; left 1 only 0. Greedy 0->0 must be undone.
    edges = {(0, 0), (0, 1), (1, 0)}
    assert max_matching(2, 2, lambda i, j: (i, j) in edges) == [(0, 1), (1, 0)]


PARIS, TOKYO, CAIRO = (_call("get_weather", city=city) for city in ("Paris", "Tokyo", "Cairo"))


@pytest.mark.parametrize(
    ("actual", "matched", "extra"),
    [
        ([PARIS, TOKYO, CAIRO], 3, 0),
        ([CAIRO, PARIS, TOKYO], 3, 0),  # any order
        ([PARIS, TOKYO], 2, 0),  # one missing
        ([PARIS, PARIS, PARIS], 1, 2),  # the same call cannot stand for three
        ([PARIS, TOKYO, CAIRO, _call("get_weather", city="Oslo")], 3, 1),  # an extra call
        ([], 0, 0),
        ([_call("get_stock_price", ticker="AMD")], 0, 1),
    ],
    ids=["all", "any-order", "one-missing", "duplicates", "extra", "none", "other-tool"],
)
def test_match_calls(actual, matched, extra):
    matching = match_calls([PARIS, TOKYO, CAIRO], actual, 0.1)
    assert len(matching.pairs) == matched and matching.extra_calls == extra
    assert matching.all_expected_matched is (matched == 3)
    assert len(matching.reasons) == 3 - matched


def test_match_calls_reasons():
    matching = match_calls([PARIS, TOKYO], [PARIS, _call("get_weather", city="Kyoto")], 0.1)
    assert matching.reasons == {1: "get_weather: arguments.city: expected 'Tokyo', got 'Kyoto'"}
    assert match_calls([PARIS], [], 0.1).reasons == {0: "no call to 'get_weather'"}
    taken = match_calls([PARIS, PARIS], [PARIS], 0.1).reasons
    assert taken == {1: "every matching call to 'get_weather' is taken by another expected call"}
    other = match_calls([PARIS], [Call("ls", "{}")], 0.1).reasons
    assert other == {0: "no call to 'get_weather' (called ['ls'])"}


def test_match_calls_with_many_actual_calls_stays_correct():
    spray = [_call("get_weather", city=f"City{i}") for i in range(300)] + [TOKYO]
    matching = match_calls([TOKYO], spray, 0.1)
    assert matching.pairs == [(0, 300)] and matching.extra_calls == 300


def test_expected_arguments_must_be_json():
    with pytest.raises(ArgumentsError):
        compare_calls(Call("f", "{not json"), Call("f", "{}"), 0.1)
