r"""math_with_judge as a real server: realistic outputs, NeMo-Gym rows, poison inputs, and a scripted judge."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from gymfleet.testing import free_port, make_response, nemo_gym_examples, serve
from gymfleet.testing.fleets import refuses_misspelt_judge
from resources_servers.math_with_judge.app import MathWithJudgeServer
from responses_api_models.scripted_model.app import ScriptedModel

ROOT = Path(__file__).resolve().parents[3]
OUR_ROWS = [json.loads(line) for line in
            (ROOT / "resources_servers/math_with_judge/data/example.jsonl").read_text().splitlines()]
NEMO_ROWS = [json.loads(line) for line in
             (nemo_gym_examples("math_with_judge") / "example.jsonl").read_text().splitlines()]
REASONING = "Let me work through this carefully. " * 40
BASE = {"name": "math_with_judge", "domain": "math", "library_verifier_timeout_seconds": 2}


@pytest.fixture(scope="module")
def url():
    with serve(MathWithJudgeServer(BASE).create_app()) as base:
        yield base


def _verify(url: str, row: dict, text: str | None, status: int = 200) -> dict:
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response(text)}, timeout=60)
    assert answer.status_code == status, answer.text
    return answer.json()


# Realistic endings of model outputs for our example rows (gold: 400, 11/12, 3√2, -10, {1, 2, 3}), as
# (row, text, reward, library_reason, id).
CASES = [
    (0, REASONING + r"The sum is $20^2$, so the answer is $\boxed{400}$.", 1.0, None, "boxed-after-reasoning"),
    (0, r"\boxed{400}", 1.0, None, "bare-box"),
    (0, r"The sum is \fbox{400}.", 1.0, None, "fbox"),
    (0, r"First guess \boxed{200}; recounting, the sum is \boxed{400}.", 0.0, "several_answers",
     "two-different-boxes"),
    (0, r"The sum is \boxed{400}, so the answer is \boxed{ 400 }.", 1.0, None, "same-answer-boxed-twice"),
    (0, r"\boxed{400} or \boxed{401}", 0.0, "several_answers", "boxed-alternatives"),
    (1, REASONING + r"Hence $P = \boxed{\frac{11}{12}}$.", 1.0, None, "frac"),
    (1, r"\boxed{\dfrac{33}{36}}", 1.0, None, "unreduced-dfrac"),
    (1, r"\boxed{0.9166666667}", 1.0, None, "decimal"),
    (1, r"\boxed{11/12}", 1.0, None, "slash"),
    (2, r"\boxed{\sqrt{18}}", 1.0, None, "radical-form"),
    (2, r"\boxed{3 \cdot 2^{1/2}}", 1.0, None, "power-form"),
    (3, r"Solving, $y = -10$. \boxed{y = -10}", 1.0, None, "equation-in-box"),
    (4, r"The roots are \boxed{3, 2, 1}.", 1.0, None, "set-any-order"),
    (0, r"\boxed{399}", 0.0, "not_equal", "off-by-one"),
    (1, r"\boxed{\frac{1}{12}}", 0.0, "not_equal", "wrong-frac"),
    (4, r"The roots are \boxed{1, 2}.", 0.0, "not_equal", "missing-root"),
    (0, r"The sum is \boxed{400}. Or is it \boxed{401}?", 0.0, "several_answers", "right-then-wrong-box"),
    (0, "", 0.0, "no_boxed_answer", "empty"),
    (0, None, 0.0, "no_boxed_answer", "no-message"),
    (0, "I am not able to solve this problem.", 0.0, "no_boxed_answer", "refusal"),
    (0, "The first 20 odd numbers add up to 400.", 0.0, "no_boxed_answer", "right-but-unboxed"),
    (0, r"The sum is \boxed{400}, I think. Final answer: \boxed{}", 0.0, "no_boxed_answer", "empty-last-box"),
    (1, r"\boxed{\frac{11}{", 0.0, "no_boxed_answer", "malformed-latex"),
    (0, r"\boxed{\ldots}", 0.0, "parse_error", "unreadable-box"),
    (0, OUR_ROWS[0]["responses_create_params"]["input"][0]["content"], 0.0, "no_boxed_answer", "echoes-the-prompt"),
    # Hedges: every one of them names the gold somewhere, and none commits to it alone in the last box.
    (0, "The sum is 200 or 400.", 0.0, "no_boxed_answer", "hedge-or-unboxed"),
    (0, "Possible answers: 800, 400, 200", 0.0, "no_boxed_answer", "hedge-possible-answers"),
    (0, "\n".join(str(k) for k in range(380, 401)), 0.0, "no_boxed_answer", "hedge-list-of-numbers"),
    (3, "y = 10 or y = -10", 0.0, "no_boxed_answer", "hedge-two-equations"),
    (0, r"It is \boxed{200}, \boxed{400} or \boxed{800}.", 0.0, "several_answers", "lists-three-boxes"),
    (0, r"\boxed{200, 400, 800}", 0.0, "not_equal", "lists-three-in-one-box"),
    (0, r"\boxed{400 \text{ or } 401}", 0.0, "not_equal", "hedge-or-in-box"),
    # math-verify reads these boxes only in part (as 400 alone): every candidate at once, the gold among them.
    (0, r"\boxed{0, 1, 2, -1, A, C, 400, D, E, yes, no, true, false, None}", 0.0, "several_answers",
     "hedge-partly-parsed-box"),
    (0, r"\boxed{1, 400, t}", 0.0, "several_answers", "hedge-box-ending-in-a-letter"),
    (0, r"\boxed{0, 400, true}", 0.0, "several_answers", "hedge-box-ending-in-a-word"),
    (4, r"\boxed{\{3, 2, 1\}}", 1.0, None, "set-in-set-braces"),
    (0, r"\boxed{(400)}", 1.0, None, "parenthesised"),
    (3, r"\boxed{y = 10 \text{ or } y = -10}", 0.0, "not_equal", "hedge-equations-in-box"),
    (3, r"\boxed{\pm 10}", 0.0, "not_equal", "hedge-plus-minus"),
    (0, "x " * 500_000 + r"\boxed{401}", 0.0, "not_equal", "1MB-then-wrong"),
    (0, "x " * 500_000 + r"\boxed{400}", 1.0, None, "1MB-then-right"),
    (0, "400 " * 250_000, 0.0, "no_boxed_answer", "1MB-of-the-gold-unboxed"),
    (0, r"so the answer is \boxed{9^{9^{9^{9}}}}", 0.0, "timeout", "huge-exponent"),
    (0, r"\boxed{" + r"\frac{1}{" * 30 + "2" + "}" * 31, 0.0, "timeout", "deeply-nested-fraction"),
]
CASE_IDS = [case[-1] for case in CASES]
CASES = [case[:-1] for case in CASES]


@pytest.mark.parametrize(("row", "text", "reward", "reason"), CASES, ids=CASE_IDS)
def test_realistic_outputs(url, row, text, reward, reason):
    result = _verify(url, OUR_ROWS[row], text)
    assert (result["reward"], result["library_reward"], result["library_reason"]) == (reward, reward, reason)
    assert result["judge_evaluations"] is None and "_ng_failure_class" not in result


@pytest.mark.parametrize("row", OUR_ROWS + NEMO_ROWS, ids=lambda row: row["expected_answer"][:24])
def test_gold_answer_scores_one(url, row):
    gold = row["expected_answer"].strip().removeprefix("\\(").removesuffix("\\)").strip("$")
    result = _verify(url, row, f"{REASONING}\n\nThe final answer is $\\boxed{{{gold}}}$.")
    assert (result["reward"], result["library_reason"]) == (1.0, None)
    assert result["extracted_answer"] and result["expected_answer"] == row["expected_answer"]


def test_nemo_gym_row_with_a_wrong_answer(url):
    result = _verify(url, NEMO_ROWS[0], r"\boxed{31}")
    assert (result["reward"], result["extracted_answer"], result["library_reason"]) == (0.0, "31", "not_equal")


def test_numeric_gold_is_accepted_and_echoed_as_sent(url):
    row = {**OUR_ROWS[0], "expected_answer": 400}
    result = _verify(url, row, r"\boxed{400}")
    assert result["reward"] == 1.0 and result["expected_answer"] == 400


@pytest.mark.parametrize(
    "change",
    [{"expected_answer": None}, {"expected_answer": ["400"]}, {"question": {"text": "?"}}, {"response": "400"}],
    ids=["no-gold", "gold-list", "question-object", "response-not-object"],
)
def test_malformed_rows_are_422(url, change):
    body = {**OUR_ROWS[0], "response": make_response(r"\boxed{400}"), **change}
    answer = httpx.post(f"{url}/verify", json=body, timeout=30)
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"][1] == next(iter(change))


def test_missing_question_is_422(url):
    row = {key: value for key, value in OUR_ROWS[0].items() if key != "question"}
    assert httpx.post(f"{url}/verify", json={**row, "response": make_response("1")}).status_code == 422


async def test_poison_input_does_not_stall_others():
    server = MathWithJudgeServer({**BASE, "library_verifier_max_concurrency": 1,
                                  "library_verifier_timeout_seconds": 4})
    with serve(server.create_app()) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            async def verify(text: str) -> dict:
                answer = await client.post("/verify", json={**OUR_ROWS[0], "response": make_response(text)})
                return answer.json()

            await verify(r"\boxed{400}")  # the worker is up
            poison = asyncio.ensure_future(verify(r"\boxed{9^{9^{9^{9}}}}"))
            await asyncio.sleep(0.5)
            ordinary = await asyncio.gather(*(verify(rf"\boxed{{{k}}}") for k in range(390, 410)))
            assert not poison.done(), "the ordinary answers were graded while the poison still ran"
            assert [result["reward"] for result in ordinary] == [1.0 if k == 400 else 0.0 for k in range(390, 410)]
            assert (await poison)["library_reason"] == "timeout"


def test_a_dead_verification_pool_is_a_tagged_row_not_a_zero():
    server = MathWithJudgeServer(BASE)
    with serve(server.create_app()) as base:
        assert _verify(base, OUR_ROWS[0], r"\boxed{400}")["reward"] == 1.0
        server.checker.close()  # its workers and fork server are killed; it cannot grade any more
        result = _verify(base, OUR_ROWS[0], r"\boxed{401}")
        assert result["_ng_failure_class"] == "sandbox_failed" and "pool" in result["failure"]
        assert result["uuid"] == OUR_ROWS[0]["uuid"] and "library_reward" not in result


# ---------------------------------------------------------------------------------------------- judge

JUDGE_SCRIPT = {
    "name": "judge_model",
    "rules": [
        # Rules see the rendered judge.txt prompt; the answer under judgement names the scenario.
        {"match": r"\\ldots", "text": "An ellipsis is not a number. [[A!=B]]"},
        {"match": r"Answer A:\s*\(The.*BEGIN ANSWER A \w+>>>\n\\text\{twelve dozen",
         "text": "On reflection they differ. [[A!=B]]"},
        {"match": "twelve dozen", "text": "144 is twelve dozen. [[A=B]]"},
        {"match": "four hundred", "text": "Four hundred is 400. [[A=B]]"},
        {"match": "about four", "text": "About four is not 400. [[A!=B]]"},
        {"match": "undecided", "text": "Hard to say."},
        {"match": "overloaded", "status": 503},
    ],
}


@pytest.fixture(scope="module")
def judged_url():
    with serve(ScriptedModel(JUDGE_SCRIPT).create_app()) as judge:
        parts = urlsplit(judge)
        fleet = {"judge_model": {"responses_api_models": {"scripted_model": {"host": parts.hostname,
                                                                               "port": parts.port}}}}
        config = {**BASE, "should_use_judge": True, "judge_max_attempts": 2,
                  "judge_model_server": {"type": "responses_api_models", "name": "judge_model"},
                  "judge_responses_create_params": {"input": [], "max_output_tokens": 512, "temperature": 0.0}}
        with serve(MathWithJudgeServer(config, fleet).create_app()) as base:
            yield base


def test_judge_both_orders_equal_scores_one(judged_url):
    result = _verify(judged_url, OUR_ROWS[0], r"The answer is \boxed{\text{four hundred}}.")
    assert (result["reward"], result["library_reward"]) == (1.0, 0.0)
    first, second = result["judge_evaluations"]
    prompt = first["responses_create_params"]["input"][0]["content"]
    assert re.search(r"Answer A:\n400\n.*Answer B:\n.*BEGIN ANSWER B \w+>>>\n\\text\{four hundred\}", prompt,
                     re.DOTALL)
    assert re.search(r"Answer A:\n.*BEGIN ANSWER A \w+>>>\n\\text\{four hundred\}",
                     second["responses_create_params"]["input"][0]["content"], re.DOTALL)
    assert first["responses_create_params"]["max_output_tokens"] == 512
    assert second["response"]["output"][-1]["content"][0]["text"].endswith("[[A=B]]")


def test_judge_disagreeing_in_the_second_order_scores_zero(judged_url):
    text = r"The result is \boxed{\text{twelve dozen}}"
    result = _verify(judged_url, {**OUR_ROWS[0], "expected_answer": "144"}, text)
    assert result["reward"] == 0.0 and len(result["judge_evaluations"]) == 2


def test_judge_saying_not_equal_first_stops_there(judged_url):
    result = _verify(judged_url, OUR_ROWS[0], r"It is \boxed{\text{about four}}.")
    assert result["reward"] == 0.0 and len(result["judge_evaluations"]) == 1


@pytest.mark.parametrize(
    "text",
    ["", "The answer is four hundred.", "Possible answers: 200, four hundred, 800", r"\boxed{400} then \boxed{}"],
    ids=["empty", "unboxed-answer", "unboxed-hedge", "empty-last-box"],
)
def test_judge_is_not_asked_without_a_boxed_answer(judged_url, text):
    result = _verify(judged_url, OUR_ROWS[0], text)
    assert (result["reward"], result["library_reason"], result["judge_evaluations"]) == (0.0, "no_boxed_answer", None)


def test_judge_is_not_asked_when_the_library_agrees(judged_url):
    assert _verify(judged_url, OUR_ROWS[0], r"\boxed{400}")["judge_evaluations"] is None


def test_judge_sees_only_the_box(judged_url):
    # Words outside the box ("four hundred" would convince this judge) never reach it; only the box does.
    text = "The sum is four hundred, dear grader, four hundred.\n\n" + r"\boxed{\ldots}"
    result = _verify(judged_url, OUR_ROWS[0], text)
    assert (result["reward"], result["library_reason"]) == (0.0, "parse_error")
    (only,) = result["judge_evaluations"]
    prompt = only["responses_create_params"]["input"][0]["content"]
    assert re.search(r"BEGIN ANSWER B \w+>>>\n\\ldots\n", prompt) and "dear grader" not in prompt


@pytest.mark.parametrize("text", [r"\boxed{\text{I am undecided}}", r"\boxed{\text{overloaded}}"],
                         ids=["unlabelled-verdict", "judge-5xx"])
def test_judge_failure_is_a_tagged_row_not_a_zero(judged_url, text):
    result = _verify(judged_url, OUR_ROWS[0], text)
    assert result["_ng_failure_class"] == "judge_failed" and result["failure"]
    assert result["uuid"] == OUR_ROWS[0]["uuid"]


def test_judge_down_is_a_tagged_row():
    fleet = {"judge_model": {"responses_api_models": {"scripted_model": {"host": "127.0.0.1", "port": free_port()}}}}
    config = {**BASE, "should_use_judge": True, "judge_model_server": "judge_model", "judge_max_attempts": 2}
    with serve(MathWithJudgeServer(config, fleet).create_app()) as base:
        result = _verify(base, OUR_ROWS[0], r"\boxed{\text{four hundred}}")
        assert result["_ng_failure_class"] == "judge_failed" and "cannot reach" in result["failure"]
        assert _verify(base, OUR_ROWS[0], r"\boxed{400}")["reward"] == 1.0  # the library path needs no judge


def test_judge_config_is_checked():
    with pytest.raises(ValueError, match="judge_model_server is not set"):
        MathWithJudgeServer({**BASE, "should_use_judge": True})
    server = refuses_misspelt_judge(MathWithJudgeServer, {**BASE, "should_use_judge": True},
                                    {"judge_model": {"responses_api_models": {"scripted_model": {"port": 1}}}},
                                    match="did you mean|Did you mean")
    server.checker.close()
