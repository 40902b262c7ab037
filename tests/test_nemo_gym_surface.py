"""The `nemo_gym` surface's parts on their own: `ServerClient` against real servers, the judge-call boundary, the
`reward_profile` metrics against brute force, the prompt files, and the `NeMoGym*` types' NeMo-Gym behaviour.
(Whole NeMo-Gym folders served end to end: `tests/test_nemo_gym_folders.py`.)"""

from __future__ import annotations

import itertools
import json
import random
from http.cookies import SimpleCookie
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
from fastapi import FastAPI, Request
from openai.types.responses import Response as OpenAIResponse
from pydantic import ConfigDict, PrivateAttr

from gymfleet import http
from gymfleet.errors import ConfigError, TransportError
from gymfleet.serving.nemo_gym_server import host_class_for
from gymfleet.testing import free_port, serve
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.judge import JudgeError, call_judge, judge_failsafe, reraise_judge_errors
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputText,
)
from nemo_gym.prompt import PromptConfig, apply_prompt_to_row, fill_prompt
from nemo_gym.reward_profile import compute_pass_majority_metrics, compute_subset_metrics, highest_k_metrics
from nemo_gym.server_utils import SESSION_ID_KEY, ServerClient, get_response_json, raise_for_status
from nemo_gym.verifier_fixture import VerifierFixture, VerifierFixtureError, exercise_verifier_fixture
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
    assert response.error is None and response.tool_choice == "none", "OpenAI's fields read as sent, else None"
    assert "error" not in response.model_dump(exclude_unset=True)
    with pytest.raises(AttributeError):
        response.not_a_response_field  # noqa: B018
    params = NeMoGymResponseCreateParamsNonStreaming(input=[{"role": "user", "content": "hi"}])
    assert params.input == [NeMoGymEasyInputMessage(role="user", content="hi")]
    assert params.model_dump(exclude_none=True)["input"] == [{"role": "user", "content": "hi", "type": "message"}]
    scored = BaseVerifyResponse(responses_create_params=params, response=response, reward=1.0, _ng_rollout_id="x")
    assert "capture_rollout_id" not in scored.model_dump() and scored.mask_sample is False


OPENAI_OBJECT_FIELDS = {  # a value of each field OpenAI's `Response` types as an object (or a list of objects)
    "incomplete_details": {"reason": "max_output_tokens"},
    "error": {"code": "server_error", "message": "boom"},
    "reasoning": {"effort": "high", "summary": "auto"},
    "text": {"format": {"type": "json_object"}},
    "tools": [{"type": "function", "name": "lookup", "parameters": {}, "strict": True}],
    "tool_choice": {"type": "function", "name": "lookup"},
    "prompt": {"id": "p1", "variables": {"x": "y"}},
    "conversation": {"id": "c1"},
}


@pytest.mark.parametrize("name", sorted(OPENAI_OBJECT_FIELDS))
def test_response_fields_openai_types_as_objects_read_as_those_objects(name):
    """A folder reads `body.response.incomplete_details.reason` (arena, indirect_prompt_injection): every field
    OpenAI's Response types as an object reads as under OpenAI's type, and dumps back as sent."""
    base = {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": [],
            "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}
    sent = {**base, name: OPENAI_OBJECT_FIELDS[name]}
    ours, theirs = NeMoGymResponse.model_validate(sent), OpenAIResponse.model_validate(sent)
    assert getattr(ours, name) == getattr(theirs, name) and not isinstance(getattr(ours, name), dict)
    assert ours.model_dump(exclude_unset=True)[name] == OPENAI_OBJECT_FIELDS[name]


class _TinyConfig(BaseResourcesServerConfig):
    answer: str = "42"


class _TinyRequest(BaseVerifyRequest):
    question: str


class _TinyServer(SimpleResourcesServer):
    """A folder written against NeMo-Gym's classes, in the test: `model_post_init`, a tool added after `super()`,
    a `verify` that may fail its judge."""

    config: _TinyConfig
    _answers: dict[str, str] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any) -> None:
        self._answers["default"] = self.config.answer

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        app.post("/lookup")(self.lookup)
        return app

    async def lookup(self, request: Request) -> dict:
        return {"answer": self._answers["default"], "session": request.session[SESSION_ID_KEY]}

    async def verify(self, body: _TinyRequest) -> BaseVerifyResponse:
        if body.question == "JUDGE DOWN":
            raise JudgeError("judge unreachable")
        return BaseVerifyResponse(**body.model_dump(), reward=float(body.response.output_text == self.config.answer))


def _tiny_row(question: str, text: str) -> dict:
    output = [{"id": "m", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}]
    return {"responses_create_params": {"input": question}, "question": question,
            "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output}}


def test_a_folder_class_written_in_the_test_is_served_with_its_overrides():
    config = _TinyConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="tiny")
    server = _TinyServer(config=config, server_client=ServerClient())
    with serve(server.setup_webserver()) as url:
        looked = httpx.post(f"{url}/lookup", timeout=10)
        assert looked.json()["answer"] == "42" and looked.cookies.get("_TinyServer___tiny"), "model_post_init ran"
        assert looked.json()["session"] == httpx.post(f"{url}/lookup", cookies=dict(looked.cookies),
                                                      timeout=10).json()["session"]
        right = httpx.post(f"{url}/verify", json=_tiny_row("Q?", "42"), timeout=10).json()
        assert right["reward"] == 1.0 and "question" not in right, "BaseVerifyResponse declares no question"
        down = httpx.post(f"{url}/verify", json=_tiny_row("JUDGE DOWN", "42"), timeout=10).json()
        assert (down["_ng_failure_class"], down["mask_sample"], down["reward"]) == ("judge_failed", True, 0.0)
        assert down["question"] == "JUDGE DOWN", "a failure row echoes the whole request"
        seed = {"resources_session_id": "s1", "episode_id": {"rollout_id": "r1"},
                "task_id": {"taskset": "t", "task_id": "0"}, "task_data": {}}
        assert httpx.post(f"{url}/seed_session", json=seed, timeout=10).json()["resources_session_id"] == "s1"
        closed = httpx.post(f"{url}/close_session", json={"resources_session_id": "s1",
                                                          "episode_id": {"rollout_id": "r1"}}, timeout=10)
        assert closed.json() == {"resources_session_id": "s1"}
        assert httpx.post(f"{url}/seed_session", json=_tiny_row("Q?", "x"), timeout=10).json() == {}


class _StrictConfig(_TinyConfig):
    model_config = ConfigDict(extra="forbid")  # arena's and nemo_user_sim's configs refuse keys they do not declare


class _StrictServer(_TinyServer):
    config: _StrictConfig


def test_a_folder_config_that_forbids_extra_keys_gets_its_yaml_not_gymfleets_own_fields():
    """The folder's config class validates what its instance config gave (and the fields it declares), as under
    NeMo-Gym; gymfleet's own instance fields (`num_replicas`, `max_request_body_mb`, ...) stay gymfleet's."""
    given = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py", "name": "strict", "domain": "knowledge",
             "answer": "7"}
    host = host_class_for(_StrictServer)(given, {})
    assert host.folder.config.model_dump() == {**given, "num_workers": None, "expose_tools_over_mcp": False}
    assert host.config.num_replicas == 1, "gymfleet still reads its own fields"
    with pytest.raises(ConfigError, match=r"strict\.unknown_key: Extra inputs are not permitted"):
        host_class_for(_StrictServer)({**given, "unknown_key": 1}, {})


class _OneWorkerConfig(_TinyConfig):
    num_workers: Literal[1] = 1  # terminal_bench_4 narrows the base class's Optional[int]


class _OneWorkerServer(_TinyServer):
    config: _OneWorkerConfig


def test_a_field_the_folder_narrows_gets_the_folders_default_where_the_yaml_gives_none():
    given = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py", "name": "one", "answer": "7"}
    assert host_class_for(_OneWorkerServer)(given, {}).folder.config.num_workers == 1


async def test_judge_failsafe_answers_a_judge_error_with_nemo_gyms_row():
    server = _TinyServer(config=_TinyConfig(host="h", port=1, entrypoint="app.py", name="t"),
                         server_client=ServerClient())
    request = _TinyRequest.model_validate(_tiny_row("JUDGE DOWN", "42"))
    answer = json.loads((await judge_failsafe(server.verify)(request)).body)
    assert answer["_ng_failure_class"] == "judge_failed" and answer["_ng_failure_judge_error"] == "judge unreachable"
    assert answer["instance_config"] == {"mask_sample": True} and answer["question"] == "JUDGE DOWN"
    assert (await judge_failsafe(server.verify)(_TinyRequest.model_validate(_tiny_row("Q", "42")))).reward == 1.0


async def test_verifier_fixtures_check_every_case(tmp_path):
    cases = tmp_path / "cases.jsonl"
    good = _tiny_row("Q", "42")
    lines = [{"name": "right", "kind": "full_reward", "request": good, "expected_reward": 1.0},
             {"name": "wrong", "kind": "zero_reward", "request": _tiny_row("Q", "41"), "expected_reward": 0.0},
             {"name": "bad", "kind": "malformed", "request": {"question": "Q"}, "expected_error": "response"}]
    cases.write_text("".join(json.dumps(line) + "\n" for line in lines))
    fixture = VerifierFixture(server_factory=lambda: _TinyServer(
        config=_TinyConfig(host="h", port=1, entrypoint="app.py", name="t"), server_client=ServerClient()),
        request_model=_TinyRequest, cases_path=cases)
    results = await exercise_verifier_fixture(fixture, reward_range=(0.0, 1.0), determinism="unknown")
    assert [(result.name, result.observed_rewards) for result in results] == [
        ("right", (1.0,)), ("wrong", (0.0,)), ("bad", ())]
    lines[1]["expected_reward"] = 1.0
    cases.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(VerifierFixtureError, match="case 'wrong': expected 1.0, scored 0.0"):
        await exercise_verifier_fixture(fixture, reward_range=(0.0, 1.0), determinism="unknown")
    cases.write_text(json.dumps(lines[0]) + "\n")
    with pytest.raises(VerifierFixtureError, match="lacks cases of kind malformed, zero_reward"):
        await exercise_verifier_fixture(fixture, reward_range=(0.0, 1.0), determinism="unknown")
