"""The code-execution service: runs untrusted programs in bubblewrap sandboxes, one-shot, batched or in sessions.

Routes (JSON in and out; shapes in `sandbox.models`):

- `POST /run`: one program (`language` python|bash, `code`, `stdin`, `args`, `files`, `archive`, `timeout_s`,
  `memory_mb`, `max_output_bytes`) -> `{status, stdout, stderr, return_code, duration_s, truncated,
  stdout_truncated, message}` with status `ok|failed|timeout|oom|killed`, or `sandbox_failed` when the host killed
  the sandbox from outside (infrastructure, `sandbox.models`). `timeout_s` is CPU time per process; the
  wall-clock limit is `wall_time_factor` times it, so runs slowed down by their neighbours are not timed out for it.
  `memory_mb` bounds each process's address space and all the memory of the run's processes together, files in
  its tmpfs and memfds included: counted by a memory cgroup of the run's own where the service can make one
  (kernel buffers, SysV shared memory and memfds in flight in sockets too; `sandbox.cgroups`), else by sampling
  its processes (`sandbox.memory`; `memory_accounting` chooses).
  `archive` is a base64 tar (a repository snapshot) unpacked into the workspace before `files` are written.
- `POST /run_batch`: one program, many `cases` (`stdin`, `args`), optional `stop_on_failure` and Python `prelude`
  -> `{results: [...]}`; all cases share one sandbox, each runs in a fresh process.
- `POST /sessions` (optional `files`, `archive`, limits) -> `{session_id, idle_timeout_s}`; `POST /sessions/{id}/exec`
  (`code`, `language`, `stdin`, `timeout_s`) -> a run result, with Python state kept between execs;
  `DELETE /sessions/{id}`.
- `GET /info`: isolation mode and limits. Plus the base server's `GET /` and `GET /metrics`.

Admission (`sandbox.admission`): a request runs when a run slot (`max_concurrent_runs`) and its `memory_mb` fit:
the `memory_mb` of everything admitted at once stays within `memory_budget_mb` (default: a share of the machine's
available memory); the rest wait in one first-come-first-served queue. A run or batch holds its `memory_mb` (once:
a batch's cases run one at a time in its sandbox) and a slot while it runs. A session holds its `memory_mb` from
creation until it is deleted, expires or ends, since its kernel keeps its memory between execs; its execs then need
only a slot (they may pass a request waiting for memory, so an idle session's next exec is never stuck behind it).
`GET /metrics` shows the budget, the memory admitted and the requests waiting for memory.

Overload is a 429 with `Retry-After` (never a hang); an unknown session is a 404; limits above the configured
maxima, or a `memory_mb` above the whole memory budget (it could never be admitted), are a 400; a sandbox that
cannot start is a 503 (infrastructure). The program's own failures are 200s with their status.

Start-up: the server answers `GET /` (a fleet's readiness probe) as soon as it can take requests into its queue
(bubblewrap found, memory accounting detected: a missing bubblewrap fails start-up saying how to fix it), and
prepares the rest in its warm-up (`SandboxServer.warm_up`, an `async` `Server.warm_up`): the runtime compiled by the
sandbox's interpreter and its /etc filled, the fork server and the warm sandboxes started, and the isolation
self-test (one real run in a real sandbox). Every request that runs, opens or touches a sandbox waits for it,
counted against the queue (`max_concurrent_runs` + `queue_length` may wait; beyond, a 429), so none is served
half-prepared. If the self-test fails (bubblewrap unable to make namespaces here), every such request is refused
with a 500 `isolation_failed` whose detail is the check's error and how to fix it; `python -m sandbox --check` runs
the same preparation and exits with it. In a fleet, the supervisor's readiness probe waits for the self-test's
verdict (`ready_after_warm_up`: `GET /` says `warming`, `ok` or `failed` with the error to the fleet's token,
`gymfleet.serving.warm_up`), so `ng_run` is ready only once the sandbox can isolate and stops with the check's error
and its fix when it cannot, while the other servers start beside it. Run it with `python -m sandbox` or as a fleet
instance (`sandbox/configs/sandbox.yaml`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from pydantic import Field
from starlette.responses import Response

from gymfleet.errors import ConfigError
from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.server import JSONResponse, Server, ServerConfig, add_route, dump
from sandbox import cgroups, isolation
from sandbox.admission import Admission, Overloaded, machine_memory_budget_mb
from sandbox.metrics import SandboxMetrics
from sandbox.models import BatchRequest, BatchResult, ExecRequest, RunRequest, SessionCreated, SessionRequest
from sandbox.process import SandboxStartError
from sandbox.runner import Runner
from sandbox.sessions import SessionNotFound, Sessions

log = logging.getLogger(__name__)

MAX_DEFAULT_WARM = 8


class SandboxConfig(ServerConfig):
    """The sandbox service's fields."""

    isolation: Literal["bwrap", "none"] = "bwrap"
    """`bwrap` (bubblewrap namespaces; required in production) or `none` (development only, logged loudly)."""
    python: str | None = None
    """Interpreter that runs Python programs (default /usr/bin/python3, else this server's)."""
    site_packages: bool = False
    """Let programs import the interpreter's site-packages (costs a few ms per run: no `-S`)."""
    bwrap: str = "bwrap"
    """The bubblewrap binary: a name on PATH or a path."""
    sandbox_uid: int = 65534
    """Uid sandboxes run as when the service runs as root (the kernel exempts root from process limits)."""
    max_concurrent_runs: int | None = None
    """Sandboxes running at once; default CPU cores x `runs_per_core`."""
    runs_per_core: int = 2
    memory_budget_mb: int | None = Field(None, ge=16)
    """Memory (MiB) that the runs and sessions admitted at once may ask for, as the sum of their `memory_mb`; the
    rest wait in the queue. Default (null): 75% of the memory available when the server starts (psutil, or the
    container's cgroup limit if less)."""
    queue_length: int = 4096
    """Requests that may wait for a slot or memory; beyond that the answer is 429 with Retry-After."""
    admission_timeout_s: float | None = Field(600.0, gt=0)
    """Longest a request waits in the queue; past it the answer is 429 with Retry-After (null: no bound), so a
    queued run never starts long after its caller gave up."""
    startup_timeout_s: float = 30.0
    wall_time_factor: float = 2.0
    """Wall-clock limit = `timeout_s` x this (the CPU time limit is `timeout_s`): a program slowed down by other runs
    sharing the CPU is not timed out for it. 1.0 makes `timeout_s` a pure wall-clock limit."""
    default_timeout_s: float = 10.0
    max_timeout_s: float = 120.0
    default_memory_mb: int = 1024
    max_memory_mb: int = 8192
    default_output_bytes: int = 1 << 20
    max_output_bytes: int = 16 << 20
    max_processes: int = 64
    """Processes and threads a run may have at once (RLIMIT_NPROC, counted per sandbox)."""
    max_file_mb: int = 64
    max_open_files: int = 256
    workspace_mb: int = 256
    """Size of the tmpfs workspace (/workspace, /tmp) each sandbox gets."""
    max_batch_cases: int = 10_000
    max_sessions: int = 64
    session_idle_timeout_s: float = 600.0
    session_cpu_s: int = 3600
    """CPU seconds a whole session may use."""
    warm_sandboxes: int | None = Field(None, ge=0)
    """Sandboxes kept started ahead for one-shot Python runs (`sandbox.warm`: each used by one run only, then
    replaced), so a run does not wait for its sandbox to start; default: the run slots, at most 8; 0: none."""
    fork_server: bool = True
    """One-shot Python runs forked from a warm interpreter (`sandbox.forkserver`: each in namespaces, a workspace, a
    memory cgroup and limits of its own, from a state no run has touched) instead of a sandbox started per run."""
    memory_accounting: Literal["auto", "cgroup", "rss"] = "auto"
    """How a run's `memory_mb` is counted: `cgroup` (a memory cgroup per run and session, v2 or v1: everything
    counted, kernel buffers included; a start-up error where none can be made), `rss` (sampling the processes,
    their tmpfs files and memfds; `sandbox.memory`), `auto` (cgroup where possible, else rss, logged)."""


class IsolationFailed(Exception):
    """The sandbox's warm-up (isolation self-test) failed: every request that needs a sandbox is refused with it."""


class SandboxServer(Server):
    """Runs untrusted code."""

    config: SandboxConfig
    ray_resources_default = {"num_cpus": 4}  # its runs are child processes: a replica wants cores of its own
    ready_after_warm_up = True  # the isolation self-test: a fleet whose sandbox cannot isolate does not start

    def __init__(self, config, global_config=None):
        super().__init__(config, global_config)
        slots = self.config.max_concurrent_runs or (os.cpu_count() or 1) * self.config.runs_per_core
        if self.config.warm_sandboxes is None:
            self.config.warm_sandboxes = min(slots, MAX_DEFAULT_WARM)
        self.admission = Admission(slots, self.config.queue_length, self._memory_budget_mb(),
                                   self.config.admission_timeout_s)
        self.sandbox_metrics = SandboxMetrics(self.metrics.registry, self.admission)
        self.runner: Runner | None = None
        """Set by `startup`; requests reach it through `prepared()`, once `warm_up` has started its sandboxes."""
        self.sessions: Sessions | None = None
        self._background: list[asyncio.Task] = []
        self._early = 0
        """Requests waiting for the warm-up to finish."""

    def _memory_budget_mb(self) -> int:
        """The configured `memory_budget_mb`, or a share of the machine's; it must hold one default run.

        Raises:
            ConfigError: the budget is below `default_memory_mb` (every run that does not say otherwise would be
                refused).
        """
        config = self.config
        budget = config.memory_budget_mb or machine_memory_budget_mb()
        if budget < config.default_memory_mb:
            where = "memory_budget_mb" if config.memory_budget_mb else f"the automatic memory budget ({budget} MiB)"
            raise ConfigError(f"{where} is below default_memory_mb ({config.default_memory_mb} MiB): no run could "
                              "use the default", hint="raise memory_budget_mb or lower default_memory_mb")
        return budget

    async def startup(self) -> None:
        """What requests need to be taken in (the command line, memory accounting, the runner and its queue); the
        rest, which starts sandboxes, is `warm_up`'s.

        Raises:
            ConfigError: bubblewrap or the interpreter is missing, or cgroup memory accounting was asked for where
                none can be made (the message says how to fix it).
        """
        config = self.config
        prepared = isolation.prepare(config.isolation, python=config.python, bwrap=config.bwrap,
                                     workspace_mb=config.workspace_mb, sandbox_uid=config.sandbox_uid,
                                     site_packages=config.site_packages, finished=False)
        try:
            hierarchy = cgroups.detect(config.memory_accounting)
        except cgroups.CgroupUnavailable as exc:
            prepared.close()
            raise ConfigError(f"memory_accounting: cgroup, but {exc}",
                              hint="run the service where it can make memory cgroups, or use auto or rss") from exc
        pids = cgroups.detect_pids(hierarchy) if config.fork_server else None
        if config.fork_server and pids is None and prepared.pidns:
            log.warning("no per-run pids cgroup can be made here: one-shot Python runs start a sandbox each instead "
                        "of being forked (forked runs share a user namespace: RLIMIT_NPROC would count them together)")
        self.runner = Runner(config, prepared, self.admission, self.sandbox_metrics, hierarchy, pids)
        self.sandbox_metrics.count_cgroups(hierarchy)
        self.sessions = Sessions(self.runner)

    async def warm_up(self) -> None:
        """Compile the runtime with the sandbox's interpreter and fill its /etc (`Isolation.finish`), start the fork
        server and the warm sandboxes, and check isolation with one real run (the server answers `GET /` meanwhile;
        requests wait for this: `prepared`).

        Raises:
            ConfigError: isolation does not work here (the message says how to fix it).
        """
        runner = self.runner
        try:
            await asyncio.to_thread(runner.isolation.finish)
            if runner.warm is not None:
                runner.warm.fill()
            await self._check_isolation()
        except BaseException:  # a failed check, or the server stopping meanwhile: nothing is left running
            await runner.close()
            raise
        self._background = [asyncio.create_task(self.sessions.expire_forever()),
                            asyncio.create_task(runner.memory.run_forever())]
        log.info("sandbox ready: isolation %s, %d concurrent runs, memory budget %d MiB, queue %d",
                 runner.isolation.mode, self.admission.max_running, self.admission.memory_budget_mb,
                 self.admission.max_queued)

    async def _check_isolation(self) -> None:
        try:
            result = await self.runner.run(RunRequest(code="print('ok')", timeout_s=30))
        except SandboxStartError as exc:
            raise ConfigError(f"sandbox isolation ({self.config.isolation}) does not work here: {exc}",
                              hint=isolation.INSTALL_HINT) from exc
        if result.status != "ok" or result.stdout != "ok\n":
            raise ConfigError(f"the sandbox's self-test failed: {result.model_dump()}", hint=isolation.INSTALL_HINT)

    async def prepared(self) -> Runner:
        """The runner, once `warm_up` has finished; a request arriving before waits for it, in line with the queue.

        Raises:
            Overloaded: more requests than the service holds (`max_concurrent_runs` + `queue_length`) wait already.
            IsolationFailed: the warm-up failed (every request after it is refused the same way).
        """
        early = self._warming is not None and not self._warming.done()
        if early and self._early >= self.admission.max_running + self.admission.max_queued:
            raise Overloaded("the sandbox is still starting and its queue is full", retry_after_s=1)
        self._early += early
        try:
            await self.warmed()
        except Exception as exc:  # noqa: BLE001 - the warm-up's own error (a ConfigError saying how to fix it)
            raise IsolationFailed(str(exc)) from exc
        finally:
            self._early -= early
        return self.runner

    async def shutdown(self) -> None:
        for task in self._background:
            task.cancel()
        if self.sessions is not None:
            await self.sessions.close_all()
        if self.runner is not None:
            await self.runner.close()
            await self.runner.drain()
            self.runner.isolation.close()
        await super().shutdown()

    def routes(self, app: FastAPI) -> None:
        add_route(app, "/run", self._run)
        add_route(app, "/run_batch", self._run_batch)
        add_route(app, "/sessions", self._create_session)
        add_route(app, "/sessions/{session_id}/exec", self._exec)
        add_route(app, "/sessions/{session_id}", self._delete_session, methods=("DELETE",))
        add_route(app, "/info", self._info, methods=("GET",))
        app.add_exception_handler(Overloaded, self._on_overloaded)
        app.add_exception_handler(SessionNotFound, self._on_session_not_found)
        app.add_exception_handler(SandboxStartError, self._on_start_error)
        app.add_exception_handler(IsolationFailed, self._on_isolation_failed)

    async def _run(self, request: Request) -> Response:
        body = validate(RunRequest, await read_json(request))
        runner = await self.prepared()
        return await _while_connected(request, runner.run(body), lambda result: JSONResponse(dump(result)))

    async def _run_batch(self, request: Request) -> Response:
        body = validate(BatchRequest, await read_json(request))
        runner = await self.prepared()
        return await _while_connected(request, runner.run_batch(body),
                                      lambda results: JSONResponse(dump(BatchResult(results=results))))

    async def _create_session(self, request: Request) -> Response:
        body = validate(SessionRequest, await read_json(request))
        await self.prepared()
        idle_s = self.config.session_idle_timeout_s
        return await _while_connected(request, self.sessions.create(body), lambda session: JSONResponse(
            dump(SessionCreated(session_id=session.id, idle_timeout_s=idle_s))))

    async def _exec(self, request: Request) -> Response:
        body = validate(ExecRequest, await read_json(request))
        await self.prepared()
        return await _while_connected(request, self.sessions.exec(request.path_params["session_id"], body),
                                      lambda result: JSONResponse(dump(result)))

    async def _delete_session(self, request: Request) -> Response:
        await self.prepared()
        if not await self.sessions.delete(request.path_params["session_id"]):
            raise SessionNotFound(request.path_params["session_id"])
        return JSONResponse({"deleted": True})

    async def _info(self, request: Request) -> Response:
        fields = ("default_timeout_s", "max_timeout_s", "default_memory_mb", "max_memory_mb", "max_output_bytes",
                  "max_processes", "workspace_mb", "max_sessions")
        runner = await self.prepared()
        return JSONResponse({
            "isolation": runner.isolation.mode, "python": runner.isolation.python,
            "max_concurrent_runs": self.admission.max_running, "queue_length": self.admission.max_queued,
            "memory_budget_mb": self.admission.memory_budget_mb,
            "memory_accounting": str(runner.cgroups or "rss"),
            **{name: getattr(self.config, name) for name in fields},
        })  # fmt: skip

    async def _on_overloaded(self, request: Request, exc: Overloaded) -> Response:
        self.sandbox_metrics.rejected.labels(exc.reason).inc()
        return JSONResponse({"detail": str(exc), "error_type": "overloaded"}, status_code=429,
                            headers={"Retry-After": str(exc.retry_after_s)})

    async def _on_session_not_found(self, request: Request, exc: SessionNotFound) -> Response:
        detail = f"no open session {exc}: it was deleted, expired after idling, or ended"
        return JSONResponse({"detail": detail, "error_type": "session_not_found"}, status_code=404)

    async def _on_isolation_failed(self, request: Request, exc: IsolationFailed) -> Response:
        log.error("%s %s: refused: the sandbox's start-up check failed: %s", request.method, request.url.path, exc)
        self.metrics.failures.labels("isolation_failed").inc()
        return JSONResponse({"detail": f"{self.config.name}: {exc}", "error_type": "isolation_failed"},
                            status_code=500)

    async def _on_start_error(self, request: Request, exc: SandboxStartError) -> Response:
        log.error("%s %s: %s", request.method, request.url.path, exc)
        self.metrics.failures.labels("sandbox_start_failed").inc()
        return JSONResponse({"detail": str(exc), "error_type": "sandbox_unavailable"}, status_code=503)


async def _while_connected(request: Request, work: Any, answer: Callable[[Any], Response]) -> Response:
    """Run `work` (a run, a session's start or command, waiting for admission first) unless its caller hangs up
    first: then it is cancelled, so a run still queued never starts, a running one is killed (`sandbox.runner` tears
    its sandbox down), a session still starting is never opened and one whose command is cut off is closed
    (`sandbox.sessions`)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("%s %s: the caller went away; its run was cancelled", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it; 499 is what the request counts as in /metrics
    return answer(task.result())


async def _disconnected(request: Request) -> None:
    """Return when the client of `request` (whose body was read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
