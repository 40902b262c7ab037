"""swe_pivot over real HTTP: NeMo-Gym's rows, the levels table (realistic and adversarial calls), both modes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, nemo_gym_examples, serve
from resources_servers.swe_pivot.app import SwePivotConfig, SwePivotServer
from resources_servers.swe_pivot.levels import command_paths, similarity, tool_category

HERE = Path(__file__).resolve().parents[1]
OUR_ROWS = [json.loads(line) for line in (HERE / "data/example.jsonl").read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in (nemo_gym_examples("swe_pivot") / "example.jsonl").read_text().splitlines()]
FIX, GREP, VIEW, CREATE, RUN = OUR_ROWS


@pytest.fixture(scope="module")
def url():
    with serve(SwePivotServer({"name": "swe_pivot", "domain": "agent"}).create_app()) as base:
        yield base


@pytest.fixture(scope="module")
def continuous_url():
    server = SwePivotServer({"name": "swe_pivot", "domain": "agent", "reward_mode": "continuous"})
    with serve(server.create_app()) as base:
        yield base


def _verify(url: str, row: dict, name: str, arguments: dict | str, text: str | None = None) -> dict:
    response = make_response(text, tool_calls=[(name, arguments)])
    answer = httpx.post(f"{url}/verify", json={**row, "response": response}, timeout=30)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert all(result[key] == value for key, value in row.items()), "row echoed"
    return result


def _gold(row: dict) -> tuple[str, dict]:
    return row["expected_action"]["name"], json.loads(row["expected_action"]["arguments"])


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["uuid"])
def test_expert_call_scores_one_and_another_tool_zero(url, row):
    result = _verify(url, row, *_gold(row))
    assert (result["reward"], result["failure_reason"], result["similarity_score"]) == (1.0, "none", 1.0)
    wrong = _verify(url, row, "finish", {})
    assert (wrong["reward"], wrong["failure_reason"]) == (0.0, "tool_name_mismatch")


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["uuid"])
def test_continuous_mode_shrinks_only_edits(continuous_url, row):
    name, arguments = _gold(row)
    result = _verify(continuous_url, row, name, arguments)
    content = arguments.get("new_str") is not None and f"{arguments.get('old_str', '')}\n{arguments['new_str']}"
    content = content or arguments.get("file_text", "")
    if tool_category(name) == "edit":
        assert result["diff_size_penalty"] == pytest.approx(0.1 * min(len(content) / 500, 1))
        assert result["reward"] == pytest.approx(1 - result["diff_size_penalty"])
    else:
        assert (result["reward"], result["diff_size_penalty"]) == (1.0, 0.0)


FIX_ARGS = _gold(FIX)[1]


@pytest.mark.parametrize(
    ("row", "name", "arguments", "reward", "failure"),
    [
        (FIX, "StrReplaceEditor", FIX_ARGS, 1.0, "none"),  # CamelCase alias
        (FIX, "edit_file", FIX_ARGS, 1.0, "none"),  # same category
        (FIX, "str_replace_editor", {**FIX_ARGS, "path": "/workspace/textkit/slug.py"}, 1.0, "none"),  # other root
        (FIX, "str_replace_editor", {**FIX_ARGS, "path": "/repo/other/slug.py"}, 0.0, "target_mismatch"),
        (FIX, "str_replace_editor", {**FIX_ARGS, "command": "insert"}, 0.0, "target_mismatch"),
        (FIX, "str_replace_editor", {**FIX_ARGS, "new_str": "    return text.lower().replace(' ', '-')"},
         0.0, "similarity_below_threshold"),  # a different fix
        (FIX, "str_replace_editor", {**FIX_ARGS, "new_str": "    return '-'.join(text.lower().split()) "},
         1.0, "none"),  # a trailing space
        (FIX, "str_replace_editor", {**FIX_ARGS, "old_str": ""}, 0.0, "similarity_below_threshold"),
        (FIX, "execute_bash", {"command": "sed -i 's/x/y/' /repo/textkit/slug.py"}, 0.0, "tool_name_mismatch"),
        (FIX, "my_custom_tool", FIX_ARGS, 0.0, "tool_name_mismatch"),  # unknown tools match by name only
        (FIX, "str_replace_editor", '{"command": "str_replace", "path": "/repo/textkit/slug.py"',
         0.0, "model_output_invalid"),  # truncated JSON (NeMo-Gym: read as {})
        (FIX, "str_replace_editor", '["str_replace"]', 0.0, "model_output_invalid"),
        (FIX, "str_replace_editor", {}, 0.0, "target_mismatch"),  # departure: NeMo-Gym skips empty targets
        (FIX, "str_replace_editor", {"command": "str_replace"}, 0.0, "target_mismatch"),  # departure: no path
        (GREP, "execute_bash", {"command": "grep -rn 'parse_header(' /repo/netkit --include=*.py"}, 1.0, "none"),
        (GREP, "bash", {"command": "grep -rn 'parse_header(' /repo/netkit"}, 1.0, "none"),
        (GREP, "execute_bash", {"command": "rg 'parse_header(' /repo/netkit"}, 0.0, "target_mismatch"),  # verb
        (GREP, "execute_bash", {"command": "grep -rn 'parse_header(' /repo/other"}, 0.0, "target_mismatch"),
        (GREP, "execute_bash", {"command": "grep -rn 'import socket' /repo/netkit"},
         0.0, "similarity_below_threshold"),
        (GREP, "execute_bash", {}, 0.0, "target_mismatch"),  # departure: NeMo-Gym scores execute_bash({}) 1
        (GREP, "execute_bash", {"command": ""}, 0.0, "target_mismatch"),
        (VIEW, "str_replace_editor", {"command": "view", "path": "/repo/netkit/headers.py", "view_range": [8, 32]},
         1.0, "none"),
        (VIEW, "str_replace_editor", {"command": "view", "path": "/repo/netkit/headers.py"}, 1.0, "none"),  # whole
        (VIEW, "str_replace_editor", {"command": "view", "path": "/repo/netkit/headers.py", "view_range": [14, 30]},
         1.0, "none"),  # 16 of 20 lines: exactly 80%
        (VIEW, "str_replace_editor", {"command": "view", "path": "/repo/netkit/headers.py", "view_range": [15, 30]},
         0.0, "target_mismatch"),  # 75%
        (VIEW, "view_file", {"path": "/repo/netkit/headers.py"}, 0.0, "tool_name_mismatch"),  # read is not edit
        (RUN, "execute_bash", {"command": "cd /repo && python -m pytest tests/test_slug.py"}, 1.0, "none"),
        (RUN, "execute_bash", {"command": "cd /srv && python -m pytest tests/ -q"}, 0.0, "target_mismatch"),
    ],
    ids=["camelcase", "same-category", "other-root", "other-file", "other-subcommand", "other-fix", "trailing-space",
         "no-old-str", "wrong-category", "unknown-tool", "truncated-json", "args-not-object", "empty-args", "no-path",
         "grep-extra-flag", "bash-alias", "other-verb", "other-dir", "other-pattern", "bash-empty-args",
         "bash-empty-command", "view-wider", "view-whole-file", "view-80pct", "view-75pct", "read-vs-edit",
         "pytest-no-q", "pytest-other-path"],
)
def test_levels_table(url, row, name, arguments, reward, failure):
    result = _verify(url, row, name, arguments)
    assert (result["reward"], result["failure_reason"]) == (reward, failure), result["reason"]
    assert (result["reason"] is None) is (failure == "none")


def test_no_call_and_message_only(url):
    for response in (make_response("I would edit slug.py"), make_response(), make_response(reasoning="edit it")):
        answer = httpx.post(f"{url}/verify", json={**FIX, "response": response}).json()
        assert (answer["reward"], answer["failure_reason"], answer["tool_name_match"]) == (
            0.0, "model_output_invalid", False)


def test_only_the_first_call_is_graded(url):
    name, arguments = _gold(GREP)
    response = make_response(tool_calls=[("execute_bash", {"command": "ls /repo"}), (name, arguments)])
    answer = httpx.post(f"{url}/verify", json={**GREP, "response": response}).json()
    assert answer["reward"] == 0.0 and answer["model_output"].startswith("execute_bash(")


def test_huge_edit_is_graded_on_its_first_2000_characters(url, continuous_url):
    arguments = {**FIX_ARGS, "new_str": FIX_ARGS["new_str"] + "\n" + "#" * 1_000_000}
    assert _verify(url, FIX, "str_replace_editor", arguments)["failure_reason"] == "similarity_below_threshold"
    assert similarity("a" * 5000 + "x", "a" * 5000 + "y") == 1.0  # the cut: only 2,000 characters compared


@pytest.mark.parametrize("new_str", ["    return '-'.join(text.split())", "    return text.strip()"])
def test_continuous_ramp(continuous_url, new_str):
    result = _verify(continuous_url, FIX, "str_replace_editor", {**FIX_ARGS, "new_str": new_str})
    score = result["similarity_score"]
    penalty = 0.1 * min(len(FIX_ARGS["old_str"] + "\n" + new_str) / 500, 1)
    ramp = 1.0 if score >= 0.8 else 0.5 + 0.5 * (score - 0.4) / 0.4 if score >= 0.4 else 0.0
    assert result["reward"] == pytest.approx(ramp * (1 - penalty) if ramp else 0.0)
    assert 0.0 < score < 1.0


def test_continuous_partial_credit_value(continuous_url):
    # old_str identical; new_str similarity s between 0.4 and 0.8 earns 0.5 + 0.5 (s - 0.4) / 0.4, then the penalty.
    new_str = "    return '-'.join(words)"
    s = similarity(new_str, FIX_ARGS["new_str"])
    assert 0.4 <= s < 0.8
    result = _verify(continuous_url, FIX, "str_replace_editor", {**FIX_ARGS, "new_str": new_str})
    penalty = 0.1 * len(FIX_ARGS["old_str"] + "\n" + new_str) / 500
    assert result["reward"] == pytest.approx((0.5 + 0.5 * (s - 0.4) / 0.4) * (1 - penalty))


def test_levels_can_be_switched_off():
    config = {"name": "x", "enable_target_match": False, "enable_argument_similarity": False}
    with serve(SwePivotServer(config).create_app()) as base:
        result = _verify(base, FIX, "str_replace_editor", {"command": "view", "path": "/elsewhere.py"})
        assert (result["reward"], result["target_match"], result["similarity_score"]) == (1.0, None, None)


def test_expected_call_from_expected_answer_or_metadata(url):
    row = {key: value for key, value in GREP.items() if key != "expected_action"}
    for extra in ({"expected_answer": json.dumps(GREP["expected_action"])},
                  {"metadata": {"expected_action": GREP["expected_action"]}}):
        assert _verify(url, {**row, **extra}, *_gold(GREP))["reward"] == 1.0


@pytest.mark.parametrize(
    "change",
    [{"expected_action": None}, {"expected_action": {"type": "message", "content": "hi"}},
     {"expected_action": {"type": "function_call", "name": "execute_bash", "arguments": "ls"}},
     {"expected_action": {"type": "function_call", "name": "", "arguments": "{}"}}],
    ids=["missing", "message", "args-not-json", "no-name"],
)
def test_rows_without_a_readable_expected_call_are_422(url, change):
    row = {**GREP, **change}
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response(tool_calls=[_gold(GREP)])})
    assert answer.status_code == 422
    assert "expected_action" in json.dumps(answer.json()["detail"])


def test_config_ramp_must_rise():
    with pytest.raises(ValueError, match="similarity_threshold"):
        SwePivotConfig(similarity_threshold=0.8, similarity_full_credit=0.8)


def test_helpers():
    assert tool_category("StrReplaceEditor") == tool_category("str_replace_editor") == "edit"
    assert tool_category("EXECUTE_BASH") == "bash" and tool_category("frobnicate") == "unknown"
    assert command_paths("cd /repo && pytest ./tests/a.py src/b.py --cov=src/pkg --x/y") == [
        "/repo", "./tests/a.py", "src/b.py", "src/pkg"]
