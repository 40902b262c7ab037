"""The `nemo_gym` surface's parts on their own: `ServerClient` against real servers, the judge-call boundary, the
`reward_profile` metrics against brute force, the prompt files, and the `NeMoGym*` types' NeMo-Gym behaviour.
(Whole NeMo-Gym folders served end to end: `tests/test_nemo_gym_folders.py`.)"""

from __future__ import annotations

import itertools
import random
from http.cookies import SimpleCookie
from urllib.parse import urlsplit

import aiohttp
import pytest
from fastapi import FastAPI, Request

from gymfleet import http
from gymfleet.errors import TransportError
from gymfleet.testing import free_port, serve
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.judge import JudgeError, call_judge, reraise_judge_errors
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
)
from nemo_gym.prompt import PromptConfig, apply_prompt_to_row, fill_prompt
from nemo_gym.reward_profile import compute_pass_majority_metrics, compute_subset_metrics, highest_k_metrics
from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status
from responses_api_models.scripted_model.app import ScriptedModel

SCRIPT = {"name": "judge", "rules": [{"match": "BROKEN", "status": 500}], "default": {"text": "[[A=B]]"}}


def _config(name: str, url: str, server_type: str = "responses_api_models") -> dict:
    parts = urlsplit(url)
    return {name: {server_type: {"impl": {"host": parts.hostname, "port": parts.port}}}}


def _echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"body": await request.json(), "cookie": request.cookies.get("c"), "query": dict(request.query_params),
                "header": request.headers.get("x-test")}

    return app


@pytest.fixture(scope="module")
def echo_url():
    with serve(_echo_app()) as url:
        yield url


@pytest.fixture(scope="module")
def judge_url():
    with serve(ScriptedModel(SCRIPT).create_app()) as url:
        yield url


async def test_server_client_resolves_names_and_answers_like_aiohttp(echo_url):
    client = ServerClient(head_server_config=None, global_config_dict=_config("echo", echo_url, "resources_servers"))
    cookies = SimpleCookie()
    cookies["c"] = "v1"
    answer = await client.post(server_name="echo", url_path="/echo", json=BaseRunRequest(
        responses_create_params={"input": "hi"}), cookies=cookies, params={"q": "1"}, headers={"x-test": "yes"},
                               timeout=aiohttp.ClientTimeout(total=30))
    assert answer.ok and answer.status == 200
    await raise_for_status(answer)
    data = await get_response_json(answer)
    assert data == {"body": {"responses_create_params": {"input": "hi"}}, "cookie": "v1", "query": {"q": "1"},
                    "header": "yes"}, "a pydantic body is sent without its unset fields, as NeMo-Gym sends it"
    assert await answer.json() == data and (await answer.text()).startswith("{")
    with pytest.raises(TypeError, match="unsupported option"):
        await client.post(server_name="echo", url_path="/echo", proxy="http://elsewhere")
    await http.close()


async def test_a_failed_status_is_both_aiohttps_error_and_gymfleets(echo_url):
    client = ServerClient(global_config_dict=_config("echo", echo_url, "resources_servers"))
    answer = await client.get(server_name="echo", url_path="/missing")
    with pytest.raises(aiohttp.ClientResponseError) as caught:
        await raise_for_status(answer)
    assert isinstance(caught.value, TransportError) and caught.value.status == 404
    assert caught.value.response_content == await answer.read()
    await http.close()


async def test_judge_failures_reach_the_folder_as_judge_error(judge_url):
    client = ServerClient(global_config_dict={**_config("judge", judge_url),
                                              **_config("gone", f"http://127.0.0.1:{free_port()}")})
    params = NeMoGymResponseCreateParamsNonStreaming(input=[NeMoGymEasyInputMessage(role="user", content="A or B?")])
    verdict = await call_judge(client, server_name="judge", url_path="/v1/responses", json=params,
                               response_model=NeMoGymResponse)
    assert isinstance(verdict, NeMoGymResponse) and "[[A=B]]" in verdict.output_text
    broken = NeMoGymResponseCreateParamsNonStreaming(input="BROKEN")
    with pytest.raises(JudgeError, match="HTTP 500"):
        await call_judge(client, server_name="judge", url_path="/v1/responses", json=broken,
                         response_model=NeMoGymResponse)
    with pytest.raises(JudgeError, match="cannot reach"):
        await call_judge(client, server_name="gone", url_path="/v1/responses", json=params,
                         response_model=NeMoGymResponse)
    with pytest.raises(JudgeError, match="ValidationError"):  # an answer that is not the model is a failed call
        await call_judge(client, server_name="judge", url_path="/v1/responses", json=params,
                         response_model=BaseVerifyResponse)
    await http.close()


async def test_reraise_judge_errors_relabels_only_the_wrapped_call():
    async def fails():
        raise KeyError("prompt field")

    with pytest.raises(JudgeError, match="KeyError"):
        await reraise_judge_errors(fails())
    with pytest.raises(JudgeError, match="^as is$"):
        await reraise_judge_errors(_raise(JudgeError("as is")))


async def _raise(error: Exception):
    raise error


def _brute_pass_at_k(values: list[int], k: int) -> float:
    subsets = list(itertools.combinations(values, k))
    return sum(1.0 for subset in subsets if any(subset)) / len(subsets)


def test_pass_at_k_is_the_chance_that_k_draws_hold_a_success():
    rng = random.Random(7)
    for _ in range(200):
        tasks = [[{"reward": rng.choice([0.0, 1.0]), "extracted_answer": rng.choice(["A", "B", None])}
                  for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(1, 5))]
        metrics, scores, names, max_k = compute_pass_majority_metrics(tasks, answer_key="extracted_answer")
        assert max_k == max(len(task) for task in tasks) and names == ["accuracy", "no_answer"]
        for k in range(1, max_k + 1):
            eligible = [task for task in tasks if len(task) >= k]
            expected = 100 * sum(_brute_pass_at_k([int(row["reward"]) for row in task], k)
                                 for task in eligible) / len(eligible)
            assert metrics[f"pass@{k}/accuracy"] == pytest.approx(expected)
            firsts = [sum(row["reward"] for row in task[:k]) / len(task[:k]) for task in tasks]
            assert metrics[f"pass@1[avg-of-{k}]/accuracy"] == pytest.approx(100 * sum(firsts) / len(firsts))


def test_majority_and_highest_k_and_subsets():
    tasks = [[{"reward": 1.0, "a": "x", "level": "easy"}, {"reward": 1.0, "a": "x"}, {"reward": 0.0, "a": "y"}],
             [{"reward": 0.0, "a": None, "level": "hard"}, {"reward": 0.0, "a": None}, {"reward": 1.0, "a": "z"}]]
    metrics, *_ = compute_pass_majority_metrics(tasks, answer_key="a")
    assert metrics["majority@3/accuracy"] == pytest.approx(100 * (1.0 + 1.0) / 2), "x wins task 1, z alone task 2"
    assert metrics["pass@3/no_answer"] == pytest.approx(50.0)
    assert highest_k_metrics(metrics, "pass@{k}", score_names=["accuracy"]) == {"pass@3/accuracy": 100.0}
    top = highest_k_metrics(metrics, "pass@1[avg-of-{k}]", exclude_names=["no_answer"])
    assert set(top) == {"pass@1[avg-of-3]/accuracy"}, "spread statistics and excluded names are left out"
    subsets = compute_subset_metrics(tasks, "level")
    assert subsets["easy/pass@1/accuracy"] == pytest.approx(100 * 2 / 3) and "hard/pass@3/accuracy" in subsets


def test_prompt_files_fill_rows_and_name_a_missing_field():
    config = PromptConfig(system="Be brief.", user="Q: {question}")
    assert fill_prompt(config, {"question": "2+2?"}) == [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": "Q: 2+2?"}]
    row = {"question": "2+2?", "responses_create_params": {"temperature": 0.5}}
    assert apply_prompt_to_row(row, config)["responses_create_params"]["temperature"] == 0.5
    assert "input" not in row["responses_create_params"], "the row itself is not changed"
    with pytest.raises(KeyError, match="question"):
        fill_prompt(config, {"other": 1})


def test_nemo_gym_items_build_with_nemo_gyms_defaults_and_equal_what_dicts_validate_into():
    message = NeMoGymResponseOutputMessage(id="m", content=[NeMoGymResponseOutputText(text="hi", annotations=[])])
    response = NeMoGymResponse(id="r", created_at=0, model="m", object="response", output=[
        {"id": "m", "content": [{"type": "output_text", "text": "hi", "annotations": []}], "role": "assistant",
         "status": "completed", "type": "message"}], parallel_tool_calls=False, tool_choice="none", tools=[])
    assert response.output == [message] and response.output_text == "hi"
    params = NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": "hi"}])
    assert params.input == [NeMoGymEasyInputMessage(role="user", content="hi")]
    assert params.model_dump(exclude_none=True)["input"] == [{"role": "user", "content": "hi", "type": "message"}]
    scored = BaseVerifyResponse(responses_create_params=params, response=response, reward=1.0, _ng_rollout_id="x")
    assert "capture_rollout_id" not in scored.model_dump() and scored.mask_sample is False
