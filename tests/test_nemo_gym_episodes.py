"""NeMo-Gym's Environment Server contracts on gymfleet: `task_materialization`, the episode types, an Environment
Server's lifecycle (`base_environment_server`, served on a real port) and `rollout_observability`'s records."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ValidationError

from gymfleet.testing import serve
from nemo_gym.base_environment_server import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupContext,
    HandledEpisodeError,
)
from nemo_gym.config_types import AggregateMetrics, AggregateMetricsRequest
from nemo_gym.episode_types import (
    BaseEpisodeRequest,
    BaseEpisodeResponse,
    EpisodeFailure,
    EpisodeId,
    TaskId,
    is_materialized_task_row,
)
from nemo_gym.rollout_correlation import current_rollout_id
from nemo_gym.rollout_observability import AgentObservationBundle, TrajectoryRecord
from nemo_gym.server_utils import ServerClient
from nemo_gym.task_materialization import materialize_task

ROUTING = {"agent_ref": {"name": "a"}, "task_source": "s", "skills_ref": "k", "_ng_rollout_index": 2}


def test_materialize_takes_the_first_id_present_else_the_position_and_keeps_only_task_fields():
    rng = random.Random(3)
    for _ in range(400):
        fields = {f"f{n}": rng.choice([n, "v", None, [1]]) for n in range(rng.randint(0, 3))}
        ids = {key: rng.choice([rng.randint(0, 99), None, "id"]) for key in ("task_id", "problem_id", "instance_id")
               if rng.random() < 0.5}
        index = rng.randint(0, 9)
        row = {**fields, **ROUTING, **ids, "_ng_task_index": index}
        before = dict(row)
        task = materialize_task(row, taskset="env:val")
        present = [ids[key] for key in ("task_id", "problem_id", "instance_id") if ids.get(key) is not None]
        assert task["task_id"] == {"taskset": "env:val", "task_id": str(present[0] if present else index)}, row
        assert task["task_input"] == {**fields, **ids}
        assert row == before and is_materialized_task_row(task)


@pytest.mark.parametrize("row, task_index", [({"q": 1}, None), ({"q": 1}, -1), ({"q": 1}, True), ({"q": 1}, "3"),
                                             ({"q": 1, "_ng_task_index": 1.0}, None),
                                             ({"task_id": {"taskset": "t", "task_id": "1"}}, 0),
                                             ({"task_input": {}}, 0)])
def test_rows_without_an_id_or_position_or_already_materialized_are_refused(row, task_index):
    with pytest.raises(ValueError, match="task_index|already materialized"):
        materialize_task(row, taskset="t", task_index=task_index)


def test_episode_ids_reserve_the_attempt_suffix_and_key_retries_by_it():
    for rollout_id, attempt in itertools.product(["r1", "task-0-3", "x.y_z"], [0, 1, 12]):
        episode = EpisodeId(rollout_id=rollout_id, attempt=attempt)
        assert episode.capture_key == (f"{rollout_id}-a{attempt}" if attempt else rollout_id)
    for suffix in ("-a1", "-a9", "-a10", "-a123"):
        with pytest.raises(ValidationError, match="reserved"):
            EpisodeId(rollout_id="r" + suffix)
    assert EpisodeId(rollout_id="r-a0").capture_key == "r-a0", "-a0 names no retry, so it stays usable"


def test_failures_leave_unknown_kind_and_stage_out_and_a_response_has_exactly_one_outcome():
    assert EpisodeFailure(failure_reason="x", terminal=False).model_dump() == {"failure_reason": "x",
                                                                                "terminal": False}
    full = EpisodeFailure(failure_reason="x", terminal=True, failure_kind="judge_failed", stage="verification")
    assert full.model_dump()["stage"] == "verification"
    ids = {"episode_id": {"rollout_id": "r"}, "task_id": {"taskset": "t", "task_id": "0"}}
    for outcome in ({}, {"result": 1, "failure": {"failure_reason": "x", "terminal": True}}):
        with pytest.raises(ValidationError, match="exactly one of result or failure"):
            BaseEpisodeResponse[int].model_validate({**ids, **outcome})


class Question(BaseModel):
    text: str


class Request(BaseEpisodeRequest[Question]):
    pass


class Response(BaseEpisodeResponse[str]):
    pass


class EchoEnvironment(BaseEnvironmentServer[Request, Response]):
    request_model = Request
    response_model = Response
    cleaned: list[str] = []
    gate: Any = None

    async def run(self, request: Request, cleanup: CleanupContext) -> Response:
        text = request.task.task_input.text
        cleanup.register_cleanup("first", self._note("first"))
        cleanup.register_cleanup("broken", self._broken)
        early = cleanup.register_cleanup("early", self._note("early"))
        await early.close()
        await early.close()
        if text == "handled":
            raise HandledEpisodeError(EpisodeFailure(failure_reason="no answer", terminal=False, stage="agent"))
        if text == "crash":
            raise KeyError("boom")
        if text in ("hang", "hold"):
            await self.gate.wait()
        if text == "wrong id":
            return Response(episode_id={"rollout_id": "other"}, task_id=request.task.task_id, result="x")
        return Response(episode_id=request.episode_id, task_id=request.task.task_id,
                        result=f"{text} @ {current_rollout_id()}")

    def _note(self, name: str) -> Any:
        async def note() -> None:
            self.cleaned.append(name)
        return note

    async def _broken(self) -> None:
        self.cleaned.append("broken")
        raise RuntimeError("cleanup failed")

    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        return AggregateMetrics(agent_metrics={"n": len(body.verify_responses)}, key_metrics={})


def _episode(text: str, attempt: int = 0) -> dict:
    return {"episode_id": {"rollout_id": "r7", "attempt": attempt},
            "task": {"task_id": {"taskset": "t", "task_id": "3"}, "task_input": {"text": text}}}


def _environment(**limits: Any) -> EchoEnvironment:
    config = BaseEnvironmentServerConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="echo",
                                         cleanup_timeout_seconds=5, **limits)
    server = EchoEnvironment(config=config, server_client=ServerClient())
    server.cleaned, server.gate = [], asyncio.Event()
    return server


def test_an_environment_server_answers_results_and_every_failure_as_a_typed_episode_response():
    server = _environment(default_episode_timeout_seconds=0.5)
    with serve(server.setup_webserver()) as url:
        answers = {text: httpx.post(f"{url}/run", json=_episode(text, attempt=2), timeout=30).json()
                   for text in ("hi", "handled", "crash", "hang")}
        assert httpx.post(f"{url}/run", json=_episode("wrong id"), timeout=30).status_code == 500
        assert httpx.post(f"{url}/run", json={"episode_id": {"rollout_id": "r"}}, timeout=30).status_code == 422
        metrics = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": [{}, {}]}, timeout=30).json()
    assert answers["hi"]["result"] == "hi @ r7-a2", "the episode runs under its attempt's capture key"
    assert answers["handled"]["failure"] == {"failure_reason": "no answer", "terminal": False, "stage": "agent"}
    assert answers["crash"]["failure"] == {"failure_reason": "Unhandled environment server error: KeyError: 'boom'",
                                           "terminal": True}
    assert answers["hang"]["failure"] == {"failure_reason": "Episode timed out", "terminal": False}
    assert all(answer["episode_id"] == {"rollout_id": "r7", "attempt": 2} for answer in answers.values())
    assert server.cleaned == ["early", "broken", "first"] * 5, "early closes run once; the rest unwind last first"
    assert metrics["agent_metrics"] == {"n": 2}


async def test_admission_past_the_queue_timeout_is_a_non_terminal_admission_failure():
    with pytest.raises(ValidationError, match="queue_timeout_seconds is required"):
        _environment(max_concurrent_episodes=1)
    server = _environment(max_concurrent_episodes=1, queue_timeout_seconds=0.05)
    holder = asyncio.create_task(server.run_request(Request.model_validate(_episode("hold"))))
    await asyncio.sleep(0)
    refused = await server.run_request(Request.model_validate(_episode("hi")))
    assert refused.failure == EpisodeFailure(failure_reason="Episode admission timed out", terminal=False,
                                             stage="admission")
    server.gate.set()
    assert (await holder).result == "hold @ r7"
    assert (await server.run_request(Request.model_validate(_episode("hi")))).result == "hi @ r7", "slot released"


def _has_cycle(parents: dict[str, str | None]) -> bool:
    for start in parents:
        seen, node = set(), start
        while node in parents:
            if node in seen:
                return True
            seen.add(node)
            node = parents[node]
    return False


def test_observation_bundles_refuse_parent_cycles_and_duplicate_invocations_as_brute_force_finds_them():
    rng = random.Random(7)
    for _ in range(300):
        names = [f"i{n}" for n in range(rng.randint(1, 5))]
        parents = {name: rng.choice([*names, None, "outside"]) for name in names}
        records = [{"kind": "agent_invocation", "invocation_id": name, "parent_invocation_id": parent}
                   for name, parent in parents.items()]
        records.append({"kind": "sandbox", "role": "agent", "outcome": "oom"})
        if _has_cycle(parents):
            with pytest.raises(ValidationError, match="cycle"):
                AgentObservationBundle(source="h", records=records)
        else:
            assert len(AgentObservationBundle(source="h", records=records).records) == len(records)
    with pytest.raises(ValidationError, match="unique"):
        AgentObservationBundle(source="h", records=[{"kind": "agent_invocation", "invocation_id": "a"}] * 2)
    with pytest.raises(ValidationError, match="completed_at must not precede"):
        AgentObservationBundle(source="h", records=[{"kind": "tool_call", "invocation_id": "a", "tool_call_id": "t",
                                                     "started_at": 2.0, "completed_at": 1.0}])


def test_trajectory_records_keep_their_turns_and_ids_consistent():
    turn = {"invocation_id": "a", "task_id": "t", "rollout_id": "r", "turn_no": 1, "timestamp": 0.0, "step_count": 0}
    assert TrajectoryRecord(task_id="t", rollout_id="r", turns=[turn]).schema_version == "1.0"
    for bad, reason in (({"turns": [turn, turn]}, "turn number"),
                        ({"turns": [{**turn, "rollout_id": "x"}]}, "identity"),
                        ({"model_calls": [{"model_call_id": "m"}] * 2}, "model_call_id"),
                        ({"invocations": [{"invocation_id": "a"}] * 2}, "invocation_id")):
        with pytest.raises(ValidationError, match=reason):
            TrajectoryRecord(task_id="t", rollout_id="r", **bad)
    with pytest.raises(ValidationError, match="model_call_id or both"):
        TrajectoryRecord(task_id="t", rollout_id="r", turns=[{**turn, "model_calls": [{"response_id": "x"}]}])
    assert TaskId(taskset="t", task_id="0") == TaskId.model_validate({"taskset": "t", "task_id": "0"})
