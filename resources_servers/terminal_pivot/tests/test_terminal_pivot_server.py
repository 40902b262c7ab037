"""terminal_pivot as a real server: realistic Terminus replies, NeMo-Gym-format rows, malformed rows, aggregates.

Expected similarities come from difflib itself (the spec's definition of the reward) or are counted by hand.
"""

from __future__ import annotations

import json
from difflib import SequenceMatcher
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, serve
from resources_servers.terminal_pivot.app import TerminalPivotServer

ROOT = Path(__file__).resolve().parents[3]
OUR_ROWS = [json.loads(line) for line in
            (ROOT / "resources_servers/terminal_pivot/data/example.jsonl").read_text().splitlines()]
# NeMo-Gym's 0.7.0 release ships no terminal_pivot rows: these are rows of our own in NeMo-Gym's format (with its
# `agent_ref`, both harnesses, first/mid/final rounds).
NEMO_ROWS = [json.loads(line) for line in (Path(__file__).parent / "nemo_gym_format.jsonl").read_text().splitlines()]


def t2(*keystrokes: str, complete: bool | None = None, **extra) -> dict:
    """A Terminus 2 turn."""
    turn = {"analysis": "The prompt is back.", "plan": "Run the next commands.",
            "commands": [{"keystrokes": k, "duration": 0.1} for k in keystrokes], **extra}
    if complete is not None:
        turn["task_complete"] = complete
    return turn


def t1(*keystrokes: str, complete: bool = False) -> dict:
    """A Terminus 1 turn."""
    return {"state_analysis": "At the shell prompt.", "explanation": "Run the commands.",
            "commands": [{"keystrokes": k, "is_blocking": True, "timeout_sec": 5} for k in keystrokes],
            "is_task_complete": complete}


def row(gold: dict, harness: str = "terminus_2", **extra) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "Next keystrokes, as JSON."}]},
            "expected_answer": json.dumps(gold), "metadata": {"harness": harness}, **extra}


def ratio(gold: str, reply: str) -> float:
    return SequenceMatcher(None, gold, reply).ratio()


GOLD2 = t2("cd /app\n", "ls -la\n", complete=False)
GOLD1 = t1("cd /app\n", "ls -la\n")
DONE2 = t2(complete=True)


@pytest.fixture(scope="module")
def url():
    with serve(TerminalPivotServer({"name": "terminal_pivot", "domain": "agent"}).create_app()) as base:
        yield base


def _verify(url: str, data: dict, response: dict | str) -> dict:
    response = make_response(response) if isinstance(response, str) else response
    answer = httpx.post(f"{url}/verify", json={**data, "response": response}, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


# (row, reply text, reward, similarity, failure_reason)
CASES = [
    # right
    pytest.param(row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n", complete=False)), 1.0, 1.0, None,
                 id="right-t2"),
    pytest.param(row(GOLD2), json.dumps(t2("cd /app\nls -la\n")), 1.0, 1.0, None,
                 id="right-keystrokes-joined-without-separator"),
    pytest.param(row(GOLD2), json.dumps({**t2("cd /app\n", "ls -la\n"), "analysis": "different words"}, indent=4),
                 1.0, 1.0, None, id="right-other-prose-and-layout"),
    pytest.param(row(GOLD1, "terminus_1"), json.dumps(t1("cd /app\n", "ls -la\n")), 1.0, 1.0, None, id="right-t1"),
    pytest.param(row(DONE2), json.dumps(t2(complete=True)), 1.0, 1.0, None, id="right-no-commands-both"),
    # partial: "cd /app\nls -" + one of "la" + "\n" match, 14 of 15 characters each side
    pytest.param(row(GOLD2), json.dumps(t2("cd /app\n", "ls -al\n")), 28 / 30, 28 / 30, None, id="partial"),
    pytest.param(row(GOLD2), json.dumps(t2("ls -la\n")), ratio("cd /app\nls -la\n", "ls -la\n"),
                 ratio("cd /app\nls -la\n", "ls -la\n"), None, id="partial-missing-command"),
    pytest.param(row(GOLD2, threshold=0.9), json.dumps(t2("cd /app\n", "ls -al\n")), 28 / 30, 28 / 30, None,
                 id="partial-above-threshold"),
    pytest.param(row(GOLD2, threshold=0.95), json.dumps(t2("cd /app\n", "ls -al\n")), 0.0, 28 / 30,
                 "COMMAND_CORRECTNESS_FAILED", id="partial-below-threshold"),
    # wrong
    pytest.param(row(GOLD2), json.dumps(t2("rm -rf /tmp/x\n")), ratio("cd /app\nls -la\n", "rm -rf /tmp/x\n"),
                 ratio("cd /app\nls -la\n", "rm -rf /tmp/x\n"), None, id="wrong-command"),
    pytest.param(row(GOLD2, threshold=0.5), json.dumps(t2("rm -rf /tmp/x\n")), 0.0,
                 ratio("cd /app\nls -la\n", "rm -rf /tmp/x\n"), "COMMAND_CORRECTNESS_FAILED", id="wrong-threshold"),
    # no keystrokes
    pytest.param(row(GOLD2), json.dumps(t2()), 0.0, 0.0, None, id="no-commands"),
    pytest.param(row(DONE2), json.dumps(t2("", complete=True)), 0.0, 0.0, None, id="empty-keystrokes-vs-none"),
    pytest.param(row(t2("", complete=False)), json.dumps(t2("")), 1.0, 1.0, None, id="empty-keystrokes-both"),
    pytest.param(row(GOLD2, threshold=0.1), json.dumps(t2()), 0.0, 0.0, "COMMAND_CORRECTNESS_FAILED",
                 id="no-commands-threshold"),
    # malformed JSON
    pytest.param(row(GOLD2), "", 0.0, None, "JSON_PARSING_FAILED", id="empty"),
    pytest.param(row(GOLD2), "```json\n" + json.dumps(GOLD2) + "\n```", 0.0, None, "JSON_PARSING_FAILED",
                 id="code-fence"),
    pytest.param(row(GOLD2), "Here is my answer: " + json.dumps(GOLD2), 0.0, None, "JSON_PARSING_FAILED",
                 id="prose-before"),
    pytest.param(row(GOLD2), json.dumps(GOLD2)[:-5], 0.0, None, "JSON_PARSING_FAILED", id="truncated"),
    pytest.param(row(GOLD2), json.dumps(GOLD2).replace("0.1", "NaN"), 0.0, None, "JSON_PARSING_FAILED",
                 id="nan-duration"),
    pytest.param(row(GOLD2), "[" * 100_000 + "]" * 100_000, 0.0, None, "JSON_PARSING_FAILED", id="too-deep"),
    pytest.param(row(GOLD2), '{"analysis": "a", "plan": "p", "commands": [], "x": ' + "9" * 5000 + "}", 0.0,
                 None, "JSON_PARSING_FAILED", id="integer-too-long"),
    # schema
    pytest.param(row(GOLD2), json.dumps({"commands": [{"keystrokes": "cd /app\nls -la\n"}]}), 0.0, None,
                 "SCHEMA_CHECK_FAILED", id="t2-missing-analysis-and-plan"),
    pytest.param(row(GOLD2), json.dumps(t2(["cd /app\n"])), 0.0, None, "SCHEMA_CHECK_FAILED",
                 id="keystrokes-not-string"),
    pytest.param(row(GOLD2), json.dumps({**t2("cd /app\n", "ls -la\n"), "task_complete": "false"}), 0.0, None,
                 "SCHEMA_CHECK_FAILED", id="task-complete-string"),
    pytest.param(row(GOLD2), json.dumps([GOLD2]), 0.0, None, "SCHEMA_CHECK_FAILED", id="array"),
    pytest.param(row(GOLD2), '"cd /app"', 0.0, None, "SCHEMA_CHECK_FAILED", id="bare-string"),
    pytest.param(row(GOLD1, "terminus_1"), json.dumps(t2("cd /app\n", "ls -la\n", complete=False)), 0.0, None,
                 "SCHEMA_CHECK_FAILED", id="t2-reply-for-t1"),
    pytest.param(row(GOLD1, "terminus_1"), json.dumps({**t1("cd /app\n", "ls -la\n"), "note": "x"}), 0.0, None,
                 "SCHEMA_CHECK_FAILED", id="t1-extra-key"),
    pytest.param(row(GOLD1, "terminus_1"),
                 json.dumps({**t1(), "commands": [{"keystrokes": "cd /app\nls -la\n", "is_blocking": True}]}), 0.0,
                 None, "SCHEMA_CHECK_FAILED", id="t1-command-without-timeout"),
    pytest.param(row(GOLD2), json.dumps({**t2("cd /app\n", "ls -la\n"), "note": "x"}), 1.0, 1.0, None,
                 id="t2-extra-key-allowed"),
    # harness
    pytest.param({**row(GOLD2), "metadata": {"harness": "terminus_3"}}, json.dumps(GOLD2), 0.0, None,
                 "UNKNOWN_HARNESS", id="unknown-harness"),
    pytest.param({**row(GOLD2), "metadata": {}}, json.dumps(GOLD2), 0.0, None, "UNKNOWN_HARNESS",
                 id="no-harness"),
    pytest.param({**row(GOLD2), "metadata": {}}, "not json", 0.0, None, "JSON_PARSING_FAILED",
                 id="json-checked-before-harness"),
    # task-complete gate
    pytest.param(row(t2("ls\n", complete=True)), json.dumps(t2("ls\n", complete=False)), 0.0, None,
                 "TASK_COMPLETE_CHECK_FAILED", id="gold-complete-reply-not"),
    pytest.param(row(t2("ls\n", complete=True)), json.dumps(t2("ls\n")), 0.0, None, "TASK_COMPLETE_CHECK_FAILED",
                 id="gold-complete-reply-omits-flag"),
    pytest.param(row(t1("ls\n", complete=True), "terminus_1"), json.dumps(t1("ls\n")), 0.0, None,
                 "TASK_COMPLETE_CHECK_FAILED", id="t1-gold-complete-reply-not"),
    pytest.param(row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n", complete=True)), 1.0, 1.0, None,
                 id="gaming-premature-complete-passes-one-way-gate"),
    pytest.param(row(GOLD1, "terminus_1"), json.dumps(t1("cd /app\n", "ls -la\n", complete=True)), 1.0, 1.0, None,
                 id="t1-gaming-premature-complete-passes-one-way-gate"),
    # reasoning
    pytest.param(row(GOLD2), "<think>maybe " + json.dumps(t2("rm -rf /\n")) + "</think>\n" + json.dumps(GOLD2),
                 1.0, 1.0, None, id="think-then-json"),
    pytest.param(row(GOLD2), "reasoning left open by the parser</think>" + json.dumps(GOLD2), 1.0, 1.0, None,
                 id="close-tag-only"),
    pytest.param(row(GOLD2), "<think>still thinking " + json.dumps(GOLD2), 0.0, None, "JSON_PARSING_FAILED",
                 id="unclosed-think"),
]


@pytest.mark.parametrize(("data", "text", "reward", "similarity", "failure"), CASES)
def test_scoring_table(url, data, text, reward, similarity, failure):
    result = _verify(url, data, text)
    assert result["reward"] == pytest.approx(reward)
    assert result["similarity"] == (None if similarity is None else pytest.approx(similarity))
    assert result["failure_reason"] == failure


def test_model_output_is_the_text_after_the_last_think_close(url):
    reply = json.dumps(GOLD2)
    result = _verify(url, row(GOLD2), f"<think>a</think> x </think>\n  {reply}  ")
    assert result["model_output"] == reply


def test_reasoning_items_are_not_graded(url):
    result = _verify(url, row(GOLD2), make_response("I will list the files.", reasoning=json.dumps(GOLD2)))
    assert (result["reward"], result["failure_reason"]) == (0.0, "JSON_PARSING_FAILED")


def test_assistant_messages_are_joined_by_line_feeds(url):
    response = make_response('{"analysis": "a", "plan": "p",')
    second = make_response('"commands": [{"keystrokes": "cd /app\\nls -la\\n"}]}')["output"][0]
    response["output"].append(second)
    result = _verify(url, row(GOLD2), response)
    assert result["reward"] == 1.0
    assert result["model_output"].count("\n") == 1


@pytest.mark.parametrize("text", ["x" * 1_000_000, row(GOLD2)["responses_create_params"]["input"][0]["content"]],
                         ids=["1mb-prose", "prompt-echo"])
def test_huge_or_echoed_prose_scores_zero(url, text):
    assert _verify(url, row(GOLD2), text)["failure_reason"] == "JSON_PARSING_FAILED"


def test_huge_keystrokes_score_zero_uncompared(url):
    result = _verify(url, row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n" * 150_000)))
    assert (result["reward"], result["similarity"], result["failure_reason"]) == (0.0, None, "KEYSTROKES_TOO_LONG")


def test_keystrokes_at_the_limit_are_compared():
    server = TerminalPivotServer({"name": "terminal_pivot", "max_keystroke_chars": len("cd /app\nls -la\n")})
    with serve(server.create_app()) as base:
        assert _verify(base, row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n")))["reward"] == 1.0
        over = _verify(base, row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n ")))
        assert over["failure_reason"] == "KEYSTROKES_TOO_LONG"


def test_many_commands_are_graded(url):
    keystrokes = ["cd /app\n", "ls -la\n"] + ["echo hi\n"] * 6_000  # 48,015 characters: under the 50,000 limit
    result = _verify(url, row(GOLD2), json.dumps(t2(*keystrokes)))
    expected = ratio("cd /app\nls -la\n", "".join(keystrokes))
    assert result["reward"] == pytest.approx(expected) and result["failure_reason"] is None


def test_two_way_completion_gate_scores_premature_completion_zero():
    server = TerminalPivotServer({"name": "terminal_pivot", "require_matching_completion": True})
    with serve(server.create_app()) as base:
        premature = _verify(base, row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n", complete=True)))
        assert (premature["reward"], premature["failure_reason"]) == (0.0, "TASK_COMPLETE_CHECK_FAILED")
        t1_premature = _verify(base, row(GOLD1, "terminus_1"), json.dumps(t1("cd /app\n", "ls -la\n", complete=True)))
        assert t1_premature["failure_reason"] == "TASK_COMPLETE_CHECK_FAILED"
        assert _verify(base, row(GOLD2), json.dumps(t2("cd /app\n", "ls -la\n")))["reward"] == 1.0
        assert _verify(base, row(DONE2), json.dumps(t2(complete=True)))["reward"] == 1.0


@pytest.mark.parametrize("data", OUR_ROWS + NEMO_ROWS, ids=lambda data: data["uuid"][:36])
def test_rows_gold_scores_one_and_other_replies_score_as_specified(url, data):
    gold = json.loads(data["expected_answer"])
    assert _verify(url, data, data["expected_answer"])["reward"] == 1.0
    assert _verify(url, data, "<think>Let me look at the screen.</think>" + json.dumps(gold))["reward"] == 1.0
    changed = {**gold, "commands": [{**c, "keystrokes": c["keystrokes"].upper()} for c in gold["commands"]]}
    joined = "".join(c["keystrokes"] for c in gold["commands"])
    result = _verify(url, data, json.dumps(changed))
    expected = ratio(joined, joined.upper()) if joined else 1.0
    assert result["similarity"] == pytest.approx(expected)
    assert result["reward"] == pytest.approx(expected if expected >= data.get("threshold", 0) else 0.0)
    assert _verify(url, data, "ls -la")["failure_reason"] == "JSON_PARSING_FAILED"
    other = t1("ls\n") if data["metadata"]["harness"] == "terminus_2" else t2("ls\n")
    assert _verify(url, data, json.dumps(other))["failure_reason"] == "SCHEMA_CHECK_FAILED"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"expected_answer": "not json"}, "expected_answer"),
        ({"expected_answer": json.dumps([GOLD2])}, "expected_answer"),
        ({"expected_answer": json.dumps({"analysis": "a"})}, "expected_answer"),
        ({"expected_answer": json.dumps({"commands": [{"duration": 1}]})}, "expected_answer"),
        ({"expected_answer": None}, "expected_answer"),
        ({"threshold": 1.5}, "threshold"),
        ({"threshold": -0.1}, "threshold"),
        ({"metadata": None}, "metadata"),
    ],
    ids=["gold-not-json", "gold-array", "gold-no-commands", "gold-command-without-keystrokes", "gold-null",
         "threshold-above-1", "threshold-negative", "metadata-null"],
)
def test_malformed_rows_are_422_naming_the_field(url, change, field):
    data = {**row(GOLD2), **change}
    answer = httpx.post(f"{url}/verify", json={**data, "response": make_response(json.dumps(GOLD2))})
    assert answer.status_code == 422
    assert field in json.dumps(answer.json()["detail"])


def test_aggregate_metrics_report_each_failure_share(url):
    results = [_verify(url, row(GOLD2), text) for text in (json.dumps(GOLD2), "nope", "nope", '{"commands": 1}')]
    metrics = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": results}).json()
    assert metrics["agent_metrics"]["mean/failure_JSON_PARSING_FAILED"] == 0.5
    assert metrics["agent_metrics"]["mean/failure_SCHEMA_CHECK_FAILED"] == 0.25


def test_same_input_same_reward(url):
    text = json.dumps(t2("cd /app\n", "ls -al\n"))
    assert len({_verify(url, row(GOLD2), text)["reward"] for _ in range(3)}) == 1
