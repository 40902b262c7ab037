"""simple_agent: seed the session, loop model ⇄ tools, verify.

`/run` does what NeMo-Gym's simple_agent does: `POST <resources>/seed_session` with the whole row, then the
episode, then `POST <resources>/verify` with the row plus the episode's `response`, cookies carried explicitly
between every call. The episode calls the model server's `/v1/responses` with the original input plus everything
produced so far; it stops when the model answers without calling a tool, when the answer is incomplete (e.g.
`max_output_tokens` hit), or after `max_steps` model calls. Tool calls are POSTed to `<resources>/<tool name>`;
their answer body (whatever its status) becomes the `function_call_output` the model reads next, except a 410
`session_lost` (the environment restarted mid-episode and its session is gone: `gymfleet.serving.sessions`), which
ends the rollout as a 502 `session_lost`. Arguments that are not a JSON object, and tools the row did not offer,
become an error message for the model instead of a call.

The returned `response` holds every item of the episode (model outputs and tool outputs) and `usage` summed over
model calls.

A model call that fails ends the rollout: `/run` answers 502 whose `error_type` is the model server's own
(`upstream_error`, `timeout`, `connection_error`, ...). Model calls are retried only when the model server cannot
be reached; its 502s already come after its own bounded upstream retries, so they are not retried again here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from pydantic import Field

from gymfleet.http import RetryPolicy
from gymfleet.serving.agent import AgentServer, AgentServerConfig, RunRequest
from gymfleet.serving.convert import tool_call_arguments
from gymfleet.serving.server import ServerRef
from gymfleet.serving.sessions import SESSION_LOST, SESSION_LOST_STATUS

RESTART_RIDE_S = 10.0
"""How long a call that cannot connect keeps trying (`RetryPolicy.connect_retry_s`) when no session state is at stake:
a model server, or an environment about to be seeded, that its supervisor restarts (1 s backoff plus start-up) then
costs only the rollouts that were in flight when it died. Tool calls and `/verify` do not ride over a restart: the
session they belong to died with the old process, so they fail typed rather than score a lost session."""
TOOL_RETRY = RetryPolicy(max_attempts=3, retry_statuses=frozenset())
"""Tool calls are retried on failures to connect only: a tool's error answer is the model's to read, and a call whose
connection dropped after it was sent may have changed the environment (not `idempotent`: `gymfleet.http`)."""
SEED_RETRY = RetryPolicy(connect_retry_s=RESTART_RIDE_S)
"""`/seed_session`: the default policy (connect failures, 429/502/503/504), riding over a restart."""
MODEL_RETRY = RetryPolicy(max_attempts=3, retry_statuses=frozenset(), connect_retry_s=RESTART_RIDE_S)
"""Model calls are retried on failures to connect only (one whose connection dropped after it was sent may still be
generating, so it is not repeated). A model server already retries its upstream's 429s and
5xx within its own bound (`vllm_model`'s `upstream_max_attempts`) and answers 502 when that is spent; retrying the
502 here would multiply the bound (and a hung upstream's deadline) by this policy's attempts."""


class SimpleAgentConfig(AgentServerConfig):
    """simple_agent's fields."""

    resources_server: ServerRef
    """The environment: `{type: resources_servers, name: <instance>}` or the instance name."""
    model_server: ServerRef
    """The policy model server: `{type: responses_api_models, name: policy_model}` or the instance name."""
    max_steps: int | None = None
    """Most model calls per episode (None: until the model stops calling tools)."""
    model_timeout_s: float = 900.0
    """Deadline for one model call (long generations take minutes)."""
    tool_timeout_s: float = 120.0
    verify_timeout_s: float = 900.0
    """Deadline for `/verify`; the resources server's own `verify_timeout_s` should be shorter."""
    restart_ride_s: float = Field(default=RESTART_RIDE_S, ge=0)
    """How long `/seed_session` and model calls that cannot connect keep trying (`RESTART_RIDE_S`)."""


def conversation(params: dict[str, Any]) -> tuple[list[dict[str, Any]], set[str]]:
    """A request's `input` as a list of items (a string is one user message), and the names of the tools it offers."""
    original = params["input"]
    if isinstance(original, str):
        original = [{"role": "user", "content": original}]
    return original, {tool.get("name") for tool in params.get("tools") or []}


class SimpleAgent(AgentServer):
    """The default agent."""

    config: SimpleAgentConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.seed_retry = replace(SEED_RETRY, connect_retry_s=self.config.restart_ride_s)
        self.model_retry = replace(MODEL_RETRY, connect_retry_s=self.config.restart_ride_s)

    async def run(self, body: RunRequest, raw: dict[str, Any], cookies: dict[str, str]):
        env = self.config.resources_server
        cookies = await self.seed(raw, cookies)
        params = raw["responses_create_params"]
        if self.config.skip_verification:
            response, cookies = await self.respond(params, cookies)
            return {**raw, "response": response, "reward": self.config.skip_verification_reward,
                    "verification_skipped": True}, cookies
        response, cookies = await self.respond(params, cookies)
        verified = await self.client.post(
            env, "/verify", json={**raw, "response": response}, cookies=cookies,
            timeout_s=self.config.verify_timeout_s,
        )
        verified.raise_for_status()
        return verified.json(), {**cookies, **verified.cookies}

    async def seed(self, raw: dict[str, Any], cookies: dict[str, str]) -> dict[str, str]:
        """`POST /seed_session` with the whole row; returns the cookies with the session's added."""
        seeded = await self.client.post(self.config.resources_server, "/seed_session", json=raw, cookies=cookies,
                                        timeout_s=60.0, retry=self.seed_retry)
        seeded.raise_for_status()
        return {**cookies, **seeded.cookies}

    async def respond(self, params: dict[str, Any], cookies: dict[str, str]):
        original, offered = conversation(params)
        produced: list[dict[str, Any]] = []
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        step = 0
        while True:
            step += 1
            answer = await self.client.post(
                self.config.model_server, "/v1/responses", json={**params, "input": original + produced},
                cookies=cookies, timeout_s=self.config.model_timeout_s, retry=self.model_retry,
            )
            answer.raise_for_status()
            cookies = {**cookies, **answer.cookies}
            response = answer.json()
            _, calls = record_turn(response, produced, usage)
            if response.get("incomplete_details") or not calls:
                break
            for call in calls:
                output, cookies = await self._call_tool(call, offered, cookies)
                produced.append({"type": "function_call_output", "call_id": call["call_id"], "output": output})
            if self.config.max_steps is not None and step >= self.config.max_steps:
                break
        final_usage = {**(response.get("usage") or {}), **usage}
        return {**response, "output": produced, "usage": final_usage}, cookies

    async def _call_tool(self, call: dict[str, Any], offered: set, cookies: dict[str, str]):
        name = call.get("name") or ""
        if name not in offered:
            return json.dumps({"error": f"unknown tool {name!r}; available: {sorted(offered)}"}), cookies
        try:
            arguments = tool_call_arguments(call.get("arguments") or "")
        except ValueError as exc:
            return json.dumps({"error": f"Invalid tool call arguments: {exc}"}), cookies
        result = await self.client.post(
            self.config.resources_server, f"/{name}", json=arguments, cookies=cookies,
            timeout_s=self.config.tool_timeout_s, retry=TOOL_RETRY,
        )
        # The environment restarted mid-episode and lost the session: not the model's to read.
        if result.status == SESSION_LOST_STATUS and result.failure_class == SESSION_LOST:
            result.raise_for_status()
        return result.text, {**cookies, **result.cookies}


def record_turn(
    response: dict[str, Any], produced: list[dict[str, Any]], usage: dict[str, int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Add one model answer to an episode: its output items to `produced`, its token counts to `usage`. Returns its
    output items and the function calls among them."""
    outputs = response.get("output") or []
    produced.extend(outputs)
    for key in usage:
        usage[key] += (response.get("usage") or {}).get(key) or 0
    return outputs, [item for item in outputs if item.get("type") == "function_call"]
