r"""ns_tools: math with a stateful Python tool, graded by delegating to `math_with_judge`.

The model (`simple_agent`, `max_steps: 50`) may call `stateful_python_code_exec` any number of times; each rollout
has its own persistent Python session in the sandbox service (`sandbox/`), so variables, imports and functions
from one call are there in the next, as in a notebook. The reward is not computed here: the row and the response
go to a verifier environment's `/verify` (by default `math_with_judge`) and its reward is copied. NeMo-Gym's
`ns_tools` rows and tool definitions work unchanged (spec §2.12, §1.4).

## Task fields
- `question`, `expected_answer`: read by the verifier (math_with_judge: the problem and the gold answer).
- `verifier_type` (optional): which entry of `verifiers` grades the row; null or absent: `default_verifier`. A
  name that is not configured is a 422.
- `responses_create_params`: the prompt (asking for the answer in `\boxed{}`) and the tool definition
  `stateful_python_code_exec(code: str)`.
- Any other field (`id`, `subset_for_metrics`, `reference_solution`, ...) is echoed untouched and passed on to the
  verifier.

## Reward
The verifier's `reward` for the same row and response (math_with_judge: 1.0 when the last `\boxed{}` of the
assistant text equals `expected_answer`, else 0.0). Tool outputs never count as the answer: math_with_judge reads
only assistant message text. The response adds:
- `extracted_answer`: the verifier's, when it gives one (null otherwise);
- `delegated_response`: the fields the verifier added to the row (`reward`, `extracted_answer`, `library_reward`,
  `library_reason`, `judge_evaluations`, ...), not its echo of the row;
- `num_tool_calls`, `total_tool_execution_time_seconds`, `avg_tool_call_time_seconds`, `tool_timeout_count`:
  the rollout's tool calls (calls that reached the sandbox; time is what the sandbox reports running them).

Failures, kept out of rewards (`_ng_failure_class`): `transport_failed` when the verifier cannot be reached, answers
a 5xx or something that is not a graded row; the verifier's own failure passes on as `judge_failed` or
`sandbox_failed` (others as `transport_failed`); `sandbox_failed` when a tool call of this rollout could not run
because the sandbox failed (the model read an error that was not its fault, so the rollout is not scored). A
verifier's 4xx (the row lacks what it needs) is passed on as our 422.

## Config
- `verifiers` ({math_with_judge: math_with_judge}): verifier name -> resources server instance
  (`{type: resources_servers, name: ...}` or a plain name). `default_verifier` (math_with_judge): used when the
  row names none. Checked at startup in a fleet.
- `verifier_timeout_s` (280): deadline for the delegated `/verify` (below this server's `verify_timeout_s`, 300).
- `sandbox` (sandbox): the sandbox instance; `sandbox_url` instead names a sandbox outside the fleet.
- `exec_timeout_s` (10, NeMo-Skills' `exec_timeout_s`): CPU seconds per tool call; the sandbox allows
  `wall_time_factor` (2) times that in wall-clock time, so `time.sleep` is bounded too.
- `memory_mb` (512): memory of one rollout's session. The sandbox holds it in its memory budget from `/seed_session`
  to `/verify`, so budget / `memory_mb` rollouts have a session at once; the next ones' sessions wait in the
  sandbox's queue (their first tool call waits).
- `max_output_chars` (1000, NeMo-Skills' default `max_output_characters`): the tool output the model reads is cut
  to this many characters, with a note saying so.
- `session_idle_s` (600): a rollout's session untouched this long is closed (the sandbox's own idle expiry is 600 s
  too). `max_sessions` (1024): sessions open at once; past it the least recently used is closed.

## Tools
`POST /stateful_python_code_exec` with `{"code": "..."}` runs the code in the rollout's session (keyed by the
signed session cookie; the session is opened at `/seed_session`, or at the first call of a rollout that was not
seeded; a session seeded before this server crashed and was restarted, or closed as idle or least recently used
(below), answers HTTP 410 `session_lost`: `gymfleet.serving.sessions`, `gymfleet.serving.session_store`). The
answer is HTTP 200 `text/plain`: what the code printed to stdout then stderr, without the final newline; a final
expression's value is shown as in a notebook. An exception shows its traceback (model code's
frames only); past the time limit the output ends with a `TimeoutError` note (variables set before the call are
kept); running out of memory ends with a `MemoryError` note. If the code ended the session (`os._exit`, a crash,
the session's CPU budget), the next call starts a fresh one and its output begins with a note that earlier state
is gone. Other arguments (NeMo-Skills' hidden `session_id`, `timeout`) are ignored. Arguments that are not an
object with a string `code` answer 200 `{"error": ...}`; any other tool name answers 200
`{"error": "Unknown tool: <name>"}`. When the sandbox fails (unreachable, 5xx, overloaded past retries) the answer
is HTTP 503 `{"error": ..., "error_type": "sandbox_failed"}` and the rollout's `/verify` is a `sandbox_failed` row.
Sessions are closed at `/verify`, after `session_idle_s` idle, past `max_sessions`, and when the server stops
(a session still waiting in the sandbox's queue is closed once it opens; `/verify` does not wait for it).

## Departures from NeMo-Gym
- The Python tool runs in gymfleet's bubblewrap sandbox (`gymfleet.grading.sandbox_client` sessions), not NeMo-Skills'
  container and `ToolManager`; there is no MCP exposure and no `nemo_skills_tools` / `sandbox_host` / `sandbox_port`
  / `disable_session_restore` keys. As with NeMo-Gym's `disable_session_restore: true`, a lost session is not
  rebuilt by replaying earlier calls; the model is told instead.
- Which packages the code may import is the sandbox's interpreter's: with the sandbox's defaults
  (`/usr/bin/python3`, `site_packages: false`) only the standard library; NeMo-Skills' image has sympy and numpy.
- Sessions are closed on idle expiry and past `max_sessions`, not only at `/verify`.
- A verifier failure, a verifier that cannot be reached or a tool call the sandbox failed is a failure row, never
  a reward; NeMo-Gym raises (a 500) or shows the model the error and scores the rollout.
- `delegated_response` holds what the verifier added, not its whole echo of the row; `tool_request_timeout_count`
  is gone (such a call makes the row a failure).

## Version history
- v1: initial: one sandbox session per rollout, per-call CPU limit, output cut, reward delegated over HTTP.
- v2: a tool call on a session closed as idle or least recently used is HTTP 410 `session_lost` (the rollout ends
  as a failure row), not run in a fresh session the model was not told about.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import PlainTextResponse
from starlette.responses import Response as StarletteResponse

from gymfleet.errors import ConfigError, JudgeError, SandboxError, ServerRefError, TransportError
from gymfleet.grading.sandbox_client import RunResult, SandboxClient, SandboxSession, SessionGoneError
from gymfleet.http import RetryPolicy
from gymfleet.serving.bodies import read_json
from gymfleet.serving.resources import (
    ResourcesServer,
    SeedSessionRequest,
    VerifyRequest,
    VerifyResponse,
)
from gymfleet.serving.sandboxed import SandboxedConfig
from gymfleet.serving.server import JSONResponse, ServerRef, add_route
from gymfleet.serving.session_store import SessionStore
from gymfleet.serving.sessions import session_id

log = logging.getLogger(__name__)

_ROW: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("ns_tools_row")
"""The `/verify` body as received, passed on to the verifier verbatim (a dump of the parsed models is not)."""

TOOL_NAME = "stateful_python_code_exec"
VERIFY_RETRY = RetryPolicy(max_attempts=3, idempotent=True)
"""A verifier's `/verify` is a pure function of the row, so a dropped connection is retried too."""
DELEGATED_FAILURES: dict[str, type[Exception]] = {"judge_failed": JudgeError, "sandbox_failed": SandboxError}
RESTARTED = "[the Python session had ended; this call ran in a fresh one: earlier variables and imports are gone]\n"
KERNEL_FRAME = re.compile(r'^  File "<gymfleet-[a-z]+>", line \d+, in \S+\n', re.MULTILINE)
"""The sandbox kernel's own traceback frames: `  File "<gymfleet-kernel>", line 343, in attempt` (model frames
read `  File "<cell 3>", line 1, in <module>` and stay)."""


class NsToolsConfig(SandboxedConfig):
    """ns_tools' fields (the module docstring explains each)."""

    default_verifier: str = "math_with_judge"
    """The verifier for rows that name none (NeMo-Gym's key)."""
    verifiers: dict[str, ServerRef] = {"math_with_judge": "math_with_judge"}
    """Verifier name -> resources server instance (NeMo-Gym's key)."""
    verifier_timeout_s: float = Field(default=280.0, gt=0)
    """Deadline for one delegated `/verify` attempt."""
    exec_timeout_s: float = Field(default=10.0, gt=0)
    """CPU seconds per tool call (wall clock: the sandbox's `wall_time_factor` times this)."""
    memory_mb: int = Field(default=512, ge=16)
    """Memory of one rollout's session."""
    max_output_chars: int = Field(default=1000, ge=1)
    """Characters of tool output the model reads."""
    session_idle_s: float = Field(default=600.0, gt=0)
    """A session untouched this long is closed."""
    max_sessions: int = Field(default=1024, ge=1)
    """Sessions open at once; the least recently used is closed first."""


class NsToolsRequest(VerifyRequest):
    """A row to grade."""

    verifier_type: str | None = None


class NsToolsResponse(VerifyResponse):
    """The graded row."""

    extracted_answer: Any = None
    delegated_response: dict[str, Any]
    num_tool_calls: int
    total_tool_execution_time_seconds: float
    avg_tool_call_time_seconds: float
    tool_timeout_count: int


class ExecArguments(BaseModel):
    """`stateful_python_code_exec`'s arguments."""

    model_config = ConfigDict(extra="ignore")
    code: str


@dataclass
class Rollout:
    """One rollout's sandbox session (opened in the background), its lock and its tool-call tallies."""

    opening: asyncio.Task[SandboxSession]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    calls: int = 0
    exec_s: float = 0.0
    timeouts: int = 0
    sandbox_failure: str | None = None
    closed: bool = False


class NsToolsServer(ResourcesServer):
    """Serves the stateful Python tool on per-rollout sandbox sessions and delegates the reward."""

    config: NsToolsConfig
    reverify_mode = "stateless"  # the reward reads the response only; the session's state is never consulted
    reward_libraries = ()

    def __init__(self, *args: Any, clock: Callable[[], float] = time.monotonic, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sandbox = SandboxClient(self.config.sandbox, url=self.config.sandbox_url, config=self.client)
        self.rollouts: SessionStore[Rollout] = SessionStore(
            self.config.session_idle_s, self.config.max_sessions, name=self.config.name or "ns_tools", clock=clock,
            close=self._close)

    async def startup(self) -> None:
        await super().startup()
        if self.global_config:  # in a fleet: a missing sandbox or verifier fails now, not on the first rollout
            names = list(self.config.verifiers.values())
            names += [] if self.config.sandbox_url else [self.config.sandbox]
            for name in names:
                try:
                    self.client.url_of(name)
                except ServerRefError as exc:
                    hint = ("ns_tools.yaml lists sandbox/configs/sandbox.yaml and "
                            "resources_servers/math_with_judge/configs/math_with_judge.yaml; keep them listed.")
                    raise ConfigError(f"ns_tools needs instance {name!r}: {exc}", hint=hint) from exc
        self.rollouts.start_sweeping()

    async def shutdown(self) -> None:
        await self.rollouts.close_all()
        await super().shutdown()

    def routes(self, app: FastAPI) -> None:
        super().routes(app)
        add_route(app, f"/{TOOL_NAME}", self._exec_route)
        add_route(app, "/{tool}", self._unknown_tool_route)  # last: the fixed routes take precedence

    # ---- sessions -------------------------------------------------------------------------------------------

    async def seed_session(self, body: SeedSessionRequest) -> dict:
        self._open(session_id())
        return {}

    def _open(self, key: str) -> Rollout:
        rollout = Rollout(opening=self._start_opening())
        old = self.rollouts.put(key, rollout)
        if old is not None:  # seeded again: start from a clean state
            self.rollouts.close_later(old)
        return rollout

    def _start_opening(self) -> asyncio.Task[SandboxSession]:
        task = asyncio.create_task(self.sandbox.session(timeout_s=self.config.exec_timeout_s,
                                                        memory_mb=self.config.memory_mb))
        task.add_done_callback(_log_open_failure)
        return task

    async def _close(self, rollout: Rollout) -> None:
        """Delete the rollout's sandbox session once any call in flight on it is done. A failure to delete is
        logged, not raised: the sandbox's own idle expiry reclaims the session."""
        async with rollout.lock:
            rollout.closed = True
            try:
                session = await rollout.opening
                await session.close()
            except SandboxError as exc:
                log.warning("could not close a sandbox session: %s", exc)

    # ---- the tool -------------------------------------------------------------------------------------------

    async def _exec_route(self, request: Request) -> StarletteResponse:
        data = await read_json(request) if await request.body() else None
        try:
            arguments = ExecArguments.model_validate(data if data is not None else {})
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(arguments)'}: {e['msg']}"
                                for e in exc.errors()[:3])
            return JSONResponse({"error": f"invalid arguments for tool {TOOL_NAME!r}: {problem}"})
        key = session_id()
        rollout = self.rollouts.peek(key)
        if rollout is None:
            if self.rollouts.lost(key):
                return self.rollouts.lost_answer(f"POST /{TOOL_NAME}")
            rollout = self._open(key)  # a rollout that was not seeded
        else:
            self.rollouts.touch(key)
            self.rollouts.expire()
        async with rollout.lock:
            if not rollout.closed:
                return await self._call(key, rollout, arguments.code)
        if self.rollouts.lost(key):  # evicted while this call waited for the lock
            return self.rollouts.lost_answer(f"POST /{TOOL_NAME}")
        rollout = self._open(key)  # closed by /verify while this call waited: run in a fresh session
        async with rollout.lock:
            return await self._call(key, rollout, arguments.code)

    async def _call(self, key: str, rollout: Rollout, code: str) -> StarletteResponse:
        """Run one call holding the rollout's lock: the output as text, or a 503 when the sandbox failed."""
        try:
            output = await self._execute(rollout, code)
        except SandboxError as exc:
            log.warning("rollout %s: the Python tool failed for lack of a sandbox: %s", key, exc)
            rollout.sandbox_failure = str(exc)
            return JSONResponse({"error": f"the Python tool is unavailable: {exc}", "error_type": "sandbox_failed"},
                                status_code=503)
        finally:
            if self.rollouts.peek(key) is rollout:
                self.rollouts.touch(key)
        return PlainTextResponse(output)

    async def _execute(self, rollout: Rollout, code: str) -> str:
        note = ""
        session = await self._session(rollout)
        try:
            result = await session.exec(code, timeout_s=self.config.exec_timeout_s)
        except SessionGoneError:  # the previous call (or the sandbox's idle expiry) ended it
            rollout.opening = self._start_opening()
            session, note = await rollout.opening, RESTARTED
            result = await session.exec(code, timeout_s=self.config.exec_timeout_s)
        rollout.calls += 1
        rollout.exec_s += result.duration_s
        rollout.timeouts += result.status == "timeout"
        return note + format_output(result, self.config.max_output_chars)

    async def _session(self, rollout: Rollout) -> SandboxSession:
        """The rollout's session; opening it again if the last attempt failed."""
        if rollout.opening.done() and rollout.opening.exception() is not None:
            rollout.opening = self._start_opening()
        return await rollout.opening

    async def _unknown_tool_route(self, request: Request) -> StarletteResponse:
        return JSONResponse({"error": f"Unknown tool: {request.path_params['tool']}"})

    # ---- the reward -----------------------------------------------------------------------------------------

    async def _verify_row(self, body: VerifyRequest, raw: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        token = _ROW.set(raw)
        try:
            return await super()._verify_row(body, raw, timeout_s)
        finally:
            _ROW.reset(token)

    async def verify(self, body: NsToolsRequest) -> NsToolsResponse:
        rollout = self.rollouts.pop(session_id())
        if rollout is not None:
            if rollout.opening.done():
                await self._close(rollout)
            else:  # still queued in the sandbox (waiting for memory): the grade need not wait for it to close
                self.rollouts.close_later(rollout)
            if rollout.sandbox_failure is not None:
                raise SandboxError(f"a tool call of this rollout failed in the sandbox: {rollout.sandbox_failure}")
        name = body.verifier_type or self.config.default_verifier
        verifier = self.config.verifiers.get(name)
        if verifier is None:
            raise RequestValidationError([{
                "type": "value_error", "loc": ("body", "verifier_type"),
                "msg": f"unknown verifier {name!r}; configured: {sorted(self.config.verifiers)}"}])
        row = _ROW.get()
        graded = await self._delegate(verifier, row)
        added = {key: value for key, value in graded.items() if key not in row}
        calls = rollout.calls if rollout else 0
        exec_s = rollout.exec_s if rollout else 0.0
        return NsToolsResponse.echo(
            body, reward=graded["reward"], extracted_answer=graded.get("extracted_answer"),
            delegated_response=added, num_tool_calls=calls, total_tool_execution_time_seconds=exec_s,
            avg_tool_call_time_seconds=exec_s / calls if calls else 0.0,
            tool_timeout_count=rollout.timeouts if rollout else 0,
        )

    async def _delegate(self, verifier: str, row: dict[str, Any]) -> dict[str, Any]:
        """The verifier's graded row; raises the failure that says whose fault it was."""
        try:
            answer = await self.client.post(verifier, "/verify", json=row, timeout_s=self.config.verifier_timeout_s,
                                            retry=VERIFY_RETRY)
        except ServerRefError as exc:
            raise TransportError(f"no verifier to delegate to: {exc}", failure_class="connection_error") from exc
        if 400 <= answer.status < 500 and answer.status not in (408, 429):
            raise RequestValidationError([{"type": "verifier_rejected", "loc": ("body",),
                                           "msg": f"verifier {verifier!r} rejected the row: {answer.text[:500]}"}])
        answer.raise_for_status()
        try:
            graded = answer.json()
        except ValueError as exc:
            raise TransportError(f"verifier {verifier!r} answered non-JSON: {answer.text[:300]!r}") from exc
        if not isinstance(graded, dict):
            raise TransportError(f"verifier {verifier!r} answered {answer.text[:300]!r}, not a graded row")
        failure = graded.get("_ng_failure_class")
        if failure:
            error = DELEGATED_FAILURES.get(failure, TransportError)
            raise error(f"verifier {verifier!r} could not grade the row ({failure}): {graded.get('failure')}")
        reward = graded.get("reward")
        if not isinstance(reward, int | float) or isinstance(reward, bool):
            raise TransportError(f"verifier {verifier!r} answered no numeric reward: {str(graded)[:300]}")
        return graded


def format_output(result: RunResult, max_chars: int) -> str:
    """What the model reads for one call: stdout then stderr (kernel frames dropped, final newline removed), a note
    when the call timed out, ran out of memory or was killed, and the whole cut to `max_chars` characters."""
    text = result.stdout + KERNEL_FRAME.sub("", result.stderr)
    text = text.removesuffix("\n")
    note = {"timeout": "TimeoutError", "oom": "MemoryError", "killed": "Killed"}.get(result.status)
    if note:
        kept = " (variables set before this call are kept)" if result.status == "timeout" else ""
        text += ("\n" if text else "") + f"{note}: {result.message}{kept}"
    if len(text) > max_chars:
        return text[:max_chars] + f"\n[output cut: {len(text)} characters, the first {max_chars} shown]"
    if result.truncated:
        return text + "\n[output cut by the sandbox]"
    return text


def _log_open_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not open a sandbox session: %s", task.exception())
