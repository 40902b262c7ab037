"""swe_agent: a long tool loop over a repository session (swebench), stopping cleanly at the context limit.

`/run` is simple_agent's (`POST <resources>/seed_session` with the row, the episode, `POST <resources>/verify`
with the row plus the episode's `response`, cookies carried between every call), with what a software-engineering
episode needs:
- Hundreds of steps: `max_steps` (200) model calls; the episode also ends when the model answers without a tool
  call (it is done) or its answer is incomplete.
- The context limit ends the episode, not the rollout: when the model server says the conversation no longer fits
  (an incomplete answer, as `vllm_model` gives for an upstream context overflow, or an HTTP 400 naming the context
  length, as vLLM and `scripted_model` give), or when the conversation would pass `max_context_chars`, the episode
  stops with everything done so far and is verified as it stands: the environment grades the repository's state.
- Tool outputs longer than `max_tool_output_chars` are cut in the middle before the model reads them.
- The diff is collected by the environment from the session at `/verify` (`resources_servers/swebench`); the agent
  never sends file contents of its own.
- A seed answer carrying `error` (the environment could not prepare the repository) skips the episode: `/verify`
  then reports the failure row.

The answer is the verify result plus `agent_stop_reason` (`done`, `max_steps`, `context_limit`, `incomplete`,
`seed_failed`), `agent_steps` (model calls made) and `agent_tool_call_s` (each tool call's round trip, seconds).

Model calls that fail otherwise end the rollout with HTTP 502, as in simple_agent; tool calls that fail to connect
are retried, others become the model's to read.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agents.simple_agent.app import SimpleAgent, SimpleAgentConfig, conversation, record_turn
from gymfleet.errors import TransportError
from gymfleet.grading.text import clip_middle
from gymfleet.serving.agent import RunRequest

CONTEXT_MARKERS = ("maximum context length", "context length", "context window", "too many tokens",
                   "prompt is too long")


class SWEAgentConfig(SimpleAgentConfig):
    """swe_agent's fields."""

    max_steps: int | None = 200
    """Most model calls per episode."""
    max_context_chars: int | None = None
    """Stop before a model call whose conversation (JSON) would be longer than this; None: only the model server's
    own limit stops the episode."""
    max_tool_output_chars: int = 20_000
    """A tool output longer than this is cut in the middle."""
    tool_timeout_s: float = 300.0
    verify_timeout_s: float = 900.0


def is_context_overflow(error: TransportError) -> bool:
    """Whether a model server's 4xx says the prompt does not fit the context."""
    if error.status is None or not 400 <= error.status < 500:
        return False
    body = (error.response_content or b"").decode("utf-8", "replace").lower()
    return any(marker in body or marker in str(error).lower() for marker in CONTEXT_MARKERS)


class SWEAgent(SimpleAgent):
    """Runs software-engineering episodes."""

    config: SWEAgentConfig

    async def run(self, body: RunRequest, raw: dict[str, Any], cookies: dict[str, str]):
        env = self.config.resources_server
        seeded = await self.client.post(env, "/seed_session", json=raw, cookies=cookies, timeout_s=300.0)
        seeded.raise_for_status()
        cookies = {**cookies, **seeded.cookies}
        answer = seeded.json()
        if isinstance(answer, dict) and answer.get("error"):
            response, stop, steps, timings = _empty_response(), "seed_failed", 0, []
        else:
            response, cookies, stop, steps, timings = await self._episode(raw["responses_create_params"], cookies)
        extra = {"agent_stop_reason": stop, "agent_steps": steps, "agent_tool_call_s": timings}
        if self.config.skip_verification:
            return {**raw, "response": response, "reward": self.config.skip_verification_reward,
                    "verification_skipped": True, **extra}, cookies
        verified = await self.client.post(env, "/verify", json={**raw, "response": response}, cookies=cookies,
                                          timeout_s=self.config.verify_timeout_s)
        verified.raise_for_status()
        result = {**verified.json(), **extra}
        return result, {**cookies, **verified.cookies}

    async def respond(self, params: dict[str, Any], cookies: dict[str, str]):
        response, cookies, *_ = await self._episode(params, cookies)
        return response, cookies

    async def _episode(self, params: dict[str, Any], cookies: dict[str, str]):
        """(response, cookies, stop reason, model calls made, seconds per tool call)."""
        original, offered = conversation(params)
        produced: list[dict[str, Any]] = []
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        last: dict[str, Any] = _empty_response()
        steps, stop, timings = 0, "done", []
        limit = self.config.max_context_chars
        while True:
            request = {**params, "input": original + produced}
            if limit is not None and len(json.dumps(request)) > limit:
                stop = "context_limit"
                break
            steps += 1
            answer = await self.client.post(self.config.model_server, "/v1/responses", json=request, cookies=cookies,
                                            timeout_s=self.config.model_timeout_s, retry=self.model_retry)
            if not answer.ok:
                error = _error(answer)
                if is_context_overflow(error):
                    stop = "context_limit"
                    break
                raise error
            cookies = {**cookies, **answer.cookies}
            last = answer.json()
            outputs, calls = record_turn(last, produced, usage)
            if last.get("incomplete_details"):  # vllm_model's answer to a context overflow is an empty incomplete one
                stop = "incomplete" if calls or _text(outputs) else "context_limit"
                break
            if not calls:
                break
            for call in calls:
                started = time.perf_counter()
                output, cookies = await self._call_tool(call, offered, cookies)
                timings.append(round(time.perf_counter() - started, 4))
                produced.append({"type": "function_call_output", "call_id": call["call_id"],
                                 "output": clip_middle(output, self.config.max_tool_output_chars)})
            if self.config.max_steps is not None and steps >= self.config.max_steps:
                stop = "max_steps"
                break
        response = {**last, "output": produced, "usage": {**(last.get("usage") or {}), **usage}}
        return response, cookies, stop, steps, timings


def _error(answer) -> TransportError:
    try:
        answer.raise_for_status()
    except TransportError as exc:
        return exc
    raise AssertionError("an answer that is not ok must raise")


def _text(outputs: list[dict[str, Any]]) -> str:
    return "".join(part.get("text") or "" for item in outputs if item.get("type") == "message"
                   for part in item.get("content") or [] if isinstance(part, dict))


def _empty_response() -> dict[str, Any]:
    """A Responses object with no output (an episode that never called the model)."""
    return {"id": "resp_swe_agent_none", "object": "response", "created_at": 0, "model": "none", "output": [],
            "status": "completed", "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}
