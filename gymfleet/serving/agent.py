"""`AgentServer`: runs one rollout per `POST /run`.

Routes: `POST /run` (a dataset row in; the resources server's verify answer out), `POST /v1/responses` (one
episode without verification), `POST /aggregate_metrics`. Subclasses implement `run` and `respond`.
Inner calls that fail (model or resources server down, timeouts) surface as HTTP 502 with `error_type` naming the
failure class, never as a hang and never as a reward.

## Admission: rollouts start in arrival order, at most `max_concurrent_rollouts` at a time
A trainer posts a whole step's rollouts at once (NeMo-RL: 4,096, no semaphore). Started all together they share
the fleet's CPU and the upstream in lockstep and all finish at the end, so an asynchronous trainer gets nothing to
train on until the batch is done. So each agent process admits `/run` and `/v1/responses` requests through one
strictly first-in-first-out queue (`Admission`) with at most `max_concurrent_rollouts` in progress: the rest wait
inside the agent, holding their connection; none is dropped or refused. Results then stream back in arrival order at
the same throughput (`bench/nemo_rl_rollouts.py --max-concurrent-rollouts 0,256`).

- The bound is per agent worker process: with `num_workers: N` the agent admits up to N times as many.
- gymfleet's own clients (`run_examples`, `ng_collect_rollouts`) send an agent no more than it admits at once now
  and a margin (`gymfleet.rollouts.dispatch.AgentLines`): each `/run` answer says how many the answering worker
  admits at once now (header `x-gymfleet-admission-level`, `Admission.level`). The rest of a step waits on their
  side, so the agent does not spend its first seconds taking in thousands of requests.
- Other clients (a plain aiohttp loop, NeMo-Gym's own) send the whole step at once. With a bound, the agent reads a
  new connection's `/run` or `/v1/responses` request only while its line is short (fewer waiting than a margin:
  32, or half what it admits at once), at most 32 per event-loop turn; the rest wait unread in their sockets, in
  arrival order, until rollouts end (`gymfleet.serving.read_pacer.IntakePacer`, applied by the fleet's
  `GatedServer`). Any other request is read at once. 4,096 posted at once on 2 cores: the first complete group
  2.6-2.8 s after the call instead of 3.2-3.8 s, the first 1.6-2 s being the client's own connecting.
- A waiting request has no deadline of its own: its caller's deadline covers the wait (and a caller that gives up
  closes its connection, which ends the wait).
- A caller that disconnects while waiting gives up its place: no work is done for it (answered 499, which nobody
  reads, and counted in `gymfleet_rollouts_abandoned_total`). Work already admitted runs to its end.
- `/v1/responses` shares the queue with `/run`: an episode costs the upstream what a rollout does, and a probe of
  the agent by hand must not jump a training step's queue. `/aggregate_metrics` is never queued.
- `max_concurrent_rollouts: 0` (or null) admits everything at once, as NeMo-Gym does.
- After idling, the bound ramps up from 16 to `max_concurrent_rollouts` over `admission_ramp_s` (2 s), so the first
  group of a step runs almost alone and completes first instead of in lockstep with the 255 admitted beside it.
  The ramp counts only time the CPU has room (`admission_hold_on_busy_cpu`, `gymfleet.serving.cpu_busy`): where the
  fleet's own CPU is the bottleneck the bound stays where it saturated the CPU (64-100 rollouts on 2 cores),
  since more in progress would only queue and make every result later; a policy on a GPU elsewhere leaves the CPUs
  idle, or makes rollouts wait (a second or more each, or 0.3 s even the quickest), and gets
  `max_concurrent_rollouts` within the 2 s.
- A waiting body is read and parsed as JSON (a malformed one is answered 422 at once) but validated against its
  schema only when its turn comes (a schema error is then a 422 too): validating thousands of waiting bodies up
  front kept the event loop from the admitted rollouts for seconds.

`GET /metrics` adds `gymfleet_rollouts_in_progress`, `gymfleet_rollouts_waiting` (gauges),
`gymfleet_rollouts_admission_limit` (0: unbounded), `gymfleet_rollouts_admission_level` (the bound now, below the limit
while ramping or held), `gymfleet_rollout_wait_seconds` (histogram of the time a request waited for its turn) and
`gymfleet_rollouts_abandoned_total` and `gymfleet_rollouts_unread` (requests waiting unread for room in the line).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response as StarletteResponse

from gymfleet.metrics import LATENCY_BUCKETS_S
from gymfleet.serving.admission import (
    ADMISSION_LEVEL_HEADER,
    DEFAULT_MAX_CONCURRENT_ROLLOUTS,
    Admission,
    waiting_margin,
)
from gymfleet.serving.aggregate import aggregate_metrics
from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.cpu_busy import CpuBusy
from gymfleet.serving.read_pacer import IntakePacer
from gymfleet.serving.resources import AggregateMetricsRequest, VerifyResponse
from gymfleet.serving.server import PROTOCOL_DOCS, JSONResponse, RouteDoc, Server, ServerConfig, add_route
from gymfleet.wire import ResponseCreateParams

log = logging.getLogger(__name__)


class AgentServerConfig(ServerConfig):
    """Fields every agent accepts."""

    skip_verification: bool = False
    """Return the episode with `reward = skip_verification_reward` instead of calling `/verify`."""
    skip_verification_reward: float = 0.0
    max_concurrent_rollouts: int | None = Field(default=DEFAULT_MAX_CONCURRENT_ROLLOUTS, ge=0)
    """Most `/run` and `/v1/responses` requests in progress at once in each agent worker process (`num_workers`
    multiplies it); later ones wait their turn in arrival order (see the module docstring). 0 or null: no bound.

    Why 256, measured with `bench/nemo_rl_rollouts.py` (1,024 weather rollouts posted at once, scripted upstream, on
    a loaded 2-core machine): unbounded 92 rollouts/s with the first result at 7.9 s; bound 64: 110/s, 1.4 s;
    128: 155/s, 1.3 s; 256: 149/s, 1.4 s; 512: 130/s, 3.8 s. From 128 up the fleet's CPU is saturated, and a
    bound far above that only brings the lockstep back (each admitted wave finishes together); 256 leaves room
    for rollouts that wait on the upstream longer than the scripted one. Size it to what the policy serves at once
    behind this agent: about (rollouts/s the policy sustains) x (seconds one rollout takes), e.g. 1,024 for one
    vLLM data-parallel rank with `max_num_seqs: 1024` when one environment has the policy to itself; the agents
    of several environments share the policy, so each needs its share only. Too low starves the upstream
    (throughput falls); too high lets every admitted rollout progress in lockstep again. Where the fleet's own CPU is
    the bottleneck, the agent keeps fewer in progress on its own (`admission_hold_on_busy_cpu`). A step posted at
    once whose rollouts cost alike has its median result at about 0.5 + (rollouts in progress) / (2 x rollouts) of
    its wall time (`docs/scaling-out.md`)."""


    admission_ramp_s: float = Field(default=2.0, ge=0)
    """After idling, the bound starts at 16 rollouts (one GRPO group) and rises evenly to `max_concurrent_rollouts`
    over this many seconds; 0: the full bound at once. Admitted together, the first 256 rollouts of a step progress
    in lockstep and the first group completes only when most of them do; admitted 16 first, the first group is
    done in a fraction of a second, and within the ramp the fleet is as busy (`bench/nemo_rl_rollouts.py`). What it
    can cost: up to about `admission_ramp_s / 2` seconds of the bound's capacity per step, when rollouts wait on a
    slow policy rather than on CPU. Only time the CPU has room counts (`admission_hold_on_busy_cpu`)."""
    admission_hold_on_busy_cpu: bool = True
    """Count only the time the CPU has room towards `admission_ramp_s`: while the CPUs this agent runs on were busy
    85% of the last half second or more (its container's quota or cpuset, else the machine), or this process used
    85% of a core, the bound stays where it is (`gymfleet.serving.cpu_busy`). Where the fleet's own CPU is the
    bottleneck (a scripted or CPU-served policy, environments grading on the same cores), more rollouts in progress
    add no throughput and make every result later; where the policy is a GPU server elsewhere, the CPUs idle and
    the bound reaches `max_concurrent_rollouts` within `admission_ramp_s`, as before. Rollouts that take a second or
    more on average, or 0.3 s even at their quickest (`gymfleet.serving.admission.SLOW_ROLLOUT_S`,
    `WAITING_ROLLOUT_S`), wait on their policy, not on this CPU alone: they ramp up however busy it is. Turn it off
    when something else keeps this machine's CPUs busy while a fast policy still has room (the agent logs once per
    step when it holds)."""


class RunRequest(BaseModel):
    """`/run` body: a dataset row. Every field is kept and forwarded to the resources server."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: ResponseCreateParams


ADMITTED_ROUTES = ("/run", "/v1/responses")
"""The routes that wait for a turn (`AgentServer.admitted`)."""

PROTOCOL_DOCS["/run"] = RouteDoc(RunRequest, VerifyResponse, "One rollout: the environment's /verify answer")


class AgentServer(Server):
    """Base class of agents."""

    config: AgentServerConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        saturated = CpuBusy.here().saturated if self.config.admission_hold_on_busy_cpu else None
        self.admission = Admission(self.config.max_concurrent_rollouts, ramp_s=self.config.admission_ramp_s,
                                   saturated=saturated)
        if self.admission.limit is not None:  # read a burst's requests as the line has room (read_pacer.py)
            self.intake = IntakePacer(ADMITTED_ROUTES, self._line_short)
            self.admission.on_room = self.intake.wake
        registry = self.metrics.registry
        Gauge("gymfleet_rollouts_in_progress", "Rollouts (/run, /v1/responses) admitted and running",
              registry=registry).set_function(lambda: self.admission.in_progress)
        Gauge("gymfleet_rollouts_waiting", "Rollouts waiting for their turn (max_concurrent_rollouts)",
              registry=registry).set_function(lambda: self.admission.waiting)
        Gauge("gymfleet_rollouts_admission_limit", "max_concurrent_rollouts of this worker (0: unbounded)",
              registry=registry).set(self.admission.limit or 0)
        Gauge("gymfleet_rollouts_admission_level", "Rollouts this worker admits at once now (0: unbounded)",
              registry=registry).set_function(lambda: self.admission.level() or 0)
        self._waited = Histogram("gymfleet_rollout_wait_seconds", "Time a rollout waited for its turn",
                                 buckets=LATENCY_BUCKETS_S, registry=registry)
        self._abandoned = Counter("gymfleet_rollouts_abandoned", "Rollouts whose caller left while they waited",
                                  registry=registry)
        Gauge("gymfleet_rollouts_unread", "Rollout requests not read yet: their connections wait for room in the line",
              registry=registry).set_function(lambda: len(self.intake.waiting) if self.intake is not None else 0)

    def _line_short(self) -> bool:
        """Is the admission line short enough to read another rollout request (`IntakePacer.hungry`)?"""
        return self.admission.waiting < waiting_margin(self.admission.level() or 0)

    async def run(self, body: RunRequest, raw: dict[str, Any], cookies: dict[str, str]) -> tuple[dict, dict]:
        """One rollout; returns (verify result, cookies to re-emit)."""
        raise NotImplementedError

    async def respond(self, params: dict[str, Any], cookies: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """One episode (model ⇄ tools) without verification; returns (response, cookies)."""
        raise NotImplementedError

    async def aggregate(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        return aggregate_metrics(verify_responses)

    @asynccontextmanager
    async def admitted(self, request: Request) -> AsyncIterator[bool]:
        """Hold a rollout slot for the block; yields False (holding nothing) if the caller left while waiting."""
        started = time.perf_counter()
        if not await self.admission.enter(lambda: _disconnected(request)):
            self._abandoned.inc()
            log.info("%s %s: the caller left while waiting for its turn; nothing was run",
                     request.method, request.url.path)
            yield False
            return
        admitted = time.perf_counter()
        self._waited.observe(admitted - started)
        try:
            yield True
        finally:
            self.admission.leave(time.perf_counter() - admitted)

    def routes(self, app: FastAPI) -> None:
        # The body is read and parsed (orjson, microseconds) before the turn, and validated against its schema
        # (pydantic over the openai types, about a millisecond) after: 4,096 rollouts posted at once would otherwise
        # keep the event loop validating waiting bodies for seconds while the admitted ones wait for it.
        async def run_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            async with self.admitted(request) as admitted:
                if not admitted:
                    return StarletteResponse(status_code=499)  # nobody reads it; it counts in /metrics
                body = validate(RunRequest, raw)
                result, cookies = await self.run(body, raw, dict(request.cookies))
            response = _with_cookies(JSONResponse(result), cookies)
            if (level := self.admission.level()) is not None:  # how many the client may keep here (dispatch.py)
                response.headers[ADMISSION_LEVEL_HEADER] = str(level)
            return response

        async def responses_route(request: Request) -> StarletteResponse:
            raw = await read_json(request)
            async with self.admitted(request) as admitted:
                if not admitted:
                    return StarletteResponse(status_code=499)
                validate(ResponseCreateParams, raw)
                response, cookies = await self.respond(raw, dict(request.cookies))
            return _with_cookies(JSONResponse(response), cookies)

        async def aggregate_route(request: Request) -> StarletteResponse:
            body = validate(AggregateMetricsRequest, await read_json(request))
            return JSONResponse(await self.aggregate(body.verify_responses))

        add_route(app, "/run", run_route)  # the admitted routes: ADMITTED_ROUTES
        add_route(app, "/v1/responses", responses_route)
        add_route(app, "/aggregate_metrics", aggregate_route)


async def _disconnected(request: Request) -> None:
    """Return when the client closes its connection (the body is read already, so the next ASGI message is the
    disconnect: uvicorn sends it when the connection drops)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _with_cookies(response: StarletteResponse, cookies: dict[str, str]) -> StarletteResponse:
    for name, value in cookies.items():
        response.set_cookie(name, value, httponly=True, samesite="lax")
    return response
