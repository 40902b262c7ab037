"""Running programs: limits checked against the server's maxima, a slot and memory from admission, one sandbox per
request.

A `/run` is a batch of one case. A batch runs all its cases in one sandbox (one interpreter start), each case in a
fresh forked process; the service reads one result per case and gives every case its time limit plus a grace
period to be reported, so a launcher the program froze or killed costs at most that.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gymfleet.errors import BadRequestError
from sandbox.admission import Admission
from sandbox.cgroups import Hierarchy, adopt
from sandbox.forked import ForkedRun, ForkServer
from sandbox.isolation import Isolation
from sandbox.memory import MemoryWatch
from sandbox.metrics import SandboxMetrics
from sandbox.models import (
    SETUP_FAILED,
    TIMED_OUT,
    BatchRequest,
    Case,
    RunRequest,
    RunResult,
    broken,
    killed_from_outside,
    to_result,
)
from sandbox.process import Frame, ProtocolError, SandboxProcess, SandboxStartError
from sandbox.warm import WarmPool

log = logging.getLogger(__name__)

CASE_GRACE_S = 3.0
DIRECT_SETUP_S = 0.5
"""Time a direct run's launcher may take to write the files and compile the program before the limit starts."""
EXIT_GRACE_S = 1.0
FORKED_INFRASTRUCTURE = 1
"""A forked run's processes that are not the program's: its init (`sandbox.forkserver`)."""


@dataclass(frozen=True)
class Limits:
    """The limits one request runs under, after defaults and maxima."""

    timeout_s: float
    memory_mb: int
    max_output: int
    wall_timeout_s: float


def decode_archive(archive: str | None) -> bytes | None:
    """The archive's bytes for the launcher (the request model checked that it is base64)."""
    return base64.b64decode(archive) if archive else None


class Runner:
    """Starts sandboxes for requests and turns their frames into results."""

    def __init__(self, config: Any, isolation: Isolation, admission: Admission, metrics: SandboxMetrics,
                 cgroups: Hierarchy | None = None, pids: Hierarchy | str | None = None):
        self.config = config
        self.cgroups = cgroups
        """Where each sandbox gets a memory cgroup of its own (`sandbox.cgroups`); None: the sampling watch."""
        self.isolation = isolation
        self.admission = admission
        self.metrics = metrics
        self.memory = MemoryWatch()
        self._cleanups: set[asyncio.Task] = set()
        self.warm: WarmPool | None = None
        """Sandboxes started ahead for one-shot Python runs (`sandbox.warm`); None: each run starts its own."""
        self.forkserver: ForkServer | None = None
        """Where one-shot Python runs are forked (`sandbox.forkserver`); None: each starts a sandbox of its own."""
        self.pids = pids
        """Forked runs' process limits (`cgroups.detect_pids`): a pids hierarchy, "memory" (v2), or None."""
        if isolation.pidns and config.fork_server and isolation.forkserver_argv and pids is not None:
            self.forkserver = ForkServer(isolation, workspace_mb=config.workspace_mb,
                                         startup_timeout_s=config.startup_timeout_s)
        if isolation.pidns and config.warm_sandboxes:
            self.warm = WarmPool(config.warm_sandboxes, self._spawn_warm)

    async def _spawn_warm(self) -> SandboxProcess:
        """A direct-run sandbox started ahead (its memory cgroup is made when a run takes it: `take_warm`): forked
        by the fork server, or a sandbox of its own."""
        if self.forkserver is not None:
            return await self.forkserver.fork()
        return await SandboxProcess.spawn(self.isolation, timeout_s=self.config.startup_timeout_s, direct=True)

    async def close(self) -> None:
        """Stop the warm sandboxes and the fork server (at server shutdown)."""
        if self.warm is not None:
            await self.warm.close()
        if self.forkserver is not None:
            await self.forkserver.close()

    async def take_warm(self, payload: dict[str, Any]) -> SandboxProcess:
        """A warm sandbox (`sandbox.warm`), moved into a memory cgroup of its own limited to the run's memory (where
        cgroups are used), and sent its request.

        Raises:
            SandboxStartError: no sandbox could be started, or its cgroup made.
        """
        process = await self.warm.take()
        try:
            groups = []
            if self.cgroups is not None:
                process.cgroup = self.cgroups.create(payload["memory_bytes"])
                groups.append(process.cgroup)
            if isinstance(process, ForkedRun):  # its own process limit: runs share the fork server's user namespace
                processes = payload["max_processes"] + FORKED_INFRASTRUCTURE
                payload = {**payload, "max_processes": None}
                if isinstance(self.pids, Hierarchy):
                    process.pids = self.pids.create(processes)
                    groups.append(process.pids)
                elif process.cgroup is not None:
                    process.cgroup.set_process_limit(processes)
            if groups:
                await asyncio.to_thread(adopt, groups, process.popen.pid)
        except BaseException as exc:
            await process.close()
            if isinstance(exc, OSError):
                raise SandboxStartError(f"cannot move a warm sandbox into its cgroups: {exc}") from exc
            raise
        process.begin(payload)
        return process

    def limits(self, timeout_s: float | None, memory_mb: int | None, max_output: int | None) -> Limits:
        """Fill defaults and refuse values above the server's maxima or memory budget (a 400 naming the limit)."""
        config = self.config
        limits = Limits(
            timeout_s if timeout_s is not None else config.default_timeout_s,
            memory_mb if memory_mb is not None else config.default_memory_mb,
            max_output if max_output is not None else config.default_output_bytes,
            (timeout_s if timeout_s is not None else config.default_timeout_s) * config.wall_time_factor,
        )
        for name, value, maximum in (
            ("timeout_s", limits.timeout_s, config.max_timeout_s),
            ("memory_mb", limits.memory_mb, config.max_memory_mb),
            ("max_output_bytes", limits.max_output, config.max_output_bytes),
        ):
            if value > maximum:
                raise BadRequestError(f"{name}={value:g} is above this sandbox's maximum of {maximum:g}")
        self.admission.check_memory(limits.memory_mb)
        return limits

    def payload(self, mode: str, language: str, limits: Limits, **fields: Any) -> dict[str, Any]:
        """The launcher request (see `sandbox.launcher`)."""
        config = self.config
        return {
            "mode": mode,
            "language": language,
            "timeout_s": limits.timeout_s,
            "wall_timeout_s": limits.wall_timeout_s,
            "memory_bytes": limits.memory_mb << 20,
            "max_output": limits.max_output,
            "max_processes": config.max_processes,
            "max_file_bytes": config.max_file_mb << 20,
            "max_open_files": config.max_open_files,
            "bash": "/bin/bash",
            **fields,
        }

    async def start(self, payload: dict[str, Any], direct: bool = False) -> SandboxProcess:
        """A started sandbox, in a memory cgroup of its own limited to the payload's memory where cgroups are used.

        Raises:
            SandboxStartError: it could not be started, or its cgroup made.
        """
        cgroup = None
        if self.cgroups is not None:
            try:
                cgroup = self.cgroups.create(payload["memory_bytes"])
            except OSError as exc:
                raise SandboxStartError(f"cannot make the sandbox's memory cgroup: {exc}") from exc
        return await SandboxProcess.start(self.isolation, payload, timeout_s=self.config.startup_timeout_s,
                                          direct=direct, cgroup=cgroup)

    async def direct_result(self, process: SandboxProcess, limits: Limits) -> RunResult:
        """The result of a direct-mode run (see `sandbox.process`): the wall-clock limit is enforced here."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(limits.wall_timeout_s + DIRECT_SETUP_S):
                frame = await process.next_result()
        except TimeoutError:
            await process.stop()
            frame = Frame(TIMED_OUT, 0, time.monotonic() - started, 0.0, b"", b"", 0)
        except ProtocolError:
            frame = None  # the program wrote to its launcher's channel; its exit status still counts
        outcome = await process.direct_result(frame, time.monotonic() - started)
        if frame is None and (outside := await self.outside_kill(process, outcome.duration_s)):
            return outside
        return self.memory_verdict(process, to_result(outcome, limits), limits)

    async def outside_kill(self, process: SandboxProcess, duration_s: float = 0.0) -> RunResult | None:
        """A `sandbox_failed` result when the host killed the sandbox (its channel closed), else None."""
        signal_name = await process.killed_from_outside()
        if signal_name is None or process.cgroup is not None and process.cgroup.ran_out(peek=True):
            return None  # the kernel's OOM killer, for the run's own limit: `memory_verdict` says `oom`
        log.warning("sandbox %d was killed from outside by %s: reported as sandbox_failed", process.popen.pid,
                    signal_name)
        return killed_from_outside(signal_name, duration_s)

    def memory_verdict(self, process: SandboxProcess, result: RunResult, limits: Limits) -> RunResult:
        """`result`, or `oom` when the memory watch killed the program's processes meanwhile (`sandbox.memory`)."""
        held = self.memory.take(process)
        if not held:
            return result
        if process.cgroup is None:
            message = f"ran out of memory: its processes together held {held >> 20} MiB (limit {limits.memory_mb} MiB)"
        else:
            message = (f"ran out of memory: its processes, files and kernel buffers together reached {held >> 20} MiB "
                       f"(limit {limits.memory_mb} MiB, counted by its memory cgroup)")
        return result.model_copy(update={"status": "oom", "message": message})

    async def run(self, request: RunRequest) -> RunResult:
        case = Case.model_construct(stdin=request.stdin, args=request.args)  # validated with the request
        fields = {name: getattr(request, name) for name in request.model_fields_set if name not in ("stdin", "args")}
        batch = BatchRequest.model_construct(**fields, cases=[case])
        return (await self.run_batch(batch))[0]

    async def run_batch(self, request: BatchRequest) -> list[RunResult]:
        if len(request.cases) > self.config.max_batch_cases:
            maximum = self.config.max_batch_cases
            raise BadRequestError(f"{len(request.cases)} cases; this sandbox takes at most {maximum}")
        limits = self.limits(request.timeout_s, request.memory_mb, request.max_output_bytes)
        payload = self.payload(
            "run",
            request.language,
            limits,
            code=request.code,
            files=request.files,
            archive=decode_archive(request.archive),
            prelude=request.prelude,
            stop_on_failure=request.stop_on_failure,
            cases=[{"stdin": (case.stdin or "").encode(), "args": case.args} for case in request.cases],
        )
        direct = len(request.cases) == 1 and request.language == "python" and self.isolation.pidns
        release = await self.admission.acquire(limits.memory_mb)  # once: the cases run one at a time
        try:
            if direct and self.warm is not None:
                process = await self.take_warm(payload)
            else:
                process = await self.start(payload, direct=direct)
        except BaseException:
            release()
            raise
        results: list[RunResult] = []
        self.memory.watch(process, limits.memory_mb << 20, direct=direct)
        try:
            if direct:
                results.append(await self.direct_result(process, limits))
                clean = True
            else:
                clean = await self.collect(process, len(request.cases), limits, request.stop_on_failure, results)
        except BaseException:
            await self._finish(process, release, clean=False)
            raise
        # Answer now; the sandbox's teardown finishes in the background, still holding its slot.
        task = asyncio.create_task(self._finish(process, release, clean=clean))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        for result in results:
            self.metrics.observe(request.language, result.status, result.duration_s)
        return results

    async def _finish(self, process: SandboxProcess, release: Callable[[], None], *, clean: bool) -> None:
        """A launcher that reported every case exits by itself at once; anything else is killed now."""
        self.memory.unwatch(process)
        try:
            await process.close(grace_s=EXIT_GRACE_S if clean else 0.0)
        except Exception:
            log.exception("could not clean a sandbox up")
        finally:
            release()

    async def drain(self) -> None:
        """Wait for background teardowns (at server shutdown)."""
        while self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)

    async def collect(
        self, process: SandboxProcess, count: int, limits: Limits, stop: bool, results: list[RunResult]
    ) -> bool:
        """Append up to `count` results; a silent, dead or garbled launcher ends the list with a failed case.

        Returns:
            Whether the launcher reported normally to the end (then it is exiting by itself).
        """
        while len(results) < count and not (stop and results and results[-1].status != "ok"):
            result, frame = await self.next_result(process, limits)
            results.append(result)
            if frame is None:
                return False
            if frame.kind == SETUP_FAILED:
                break
        return True

    async def next_result(self, process: SandboxProcess, limits: Limits) -> tuple[RunResult, Frame | None]:
        """One result, with its frame; no frame when the launcher is gone, silent or garbled (the program's doing)."""
        try:
            async with asyncio.timeout(limits.wall_timeout_s + CASE_GRACE_S):
                frame = await process.next_result()
        except TimeoutError:
            message = f"the program froze the sandbox's supervisor past the {limits.wall_timeout_s:g}s time limit"
            return broken(message, "timeout", limits.wall_timeout_s), None
        except ProtocolError as exc:
            return broken(f"the program tampered with the sandbox's supervisor ({exc})"), None
        if frame is None:
            if outside := await self.outside_kill(process):
                return outside, None
            return self.memory_verdict(process, broken("the program killed the sandbox's supervisor"), limits), None
        return self.memory_verdict(process, to_result(frame, limits), limits), frame
