"""Sessions: one long-lived sandbox per session, running the kernel (`sandbox.kernel`) until deleted or idle.

A session is created with optional files and limits (its memory limit covers the whole session; its timeout is the
default per exec). It holds its `memory_mb` of the admission memory budget from creation (waiting in the queue for
it like a run) until it is deleted, expires or ends: its kernel keeps its memory between execs. Execs of one
session run one at a time, each holding a run slot like any run, but no more memory. The code runs in a worker
process that cannot reach the protocol, and nothing of it runs between execs (`sandbox.kernel`). An exec that
outlives its time limit and cannot be interrupted, whose worker dies (`os._exit`, a crash, the memory watch) or
that spends the session's CPU time (`session_cpu_s`) ends the session, as does one that kills the kernel (the
result says so; the next exec is a 404). Sessions idle longer than `session_idle_timeout_s` are deleted; at most
`max_sessions` are open at once (beyond that, 429).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gymfleet.errors import BadRequestError
from sandbox.admission import Overloaded
from sandbox.launcher import SESSION_ENDED
from sandbox.models import ExecRequest, RunResult, SessionRequest
from sandbox.process import SandboxProcess
from sandbox.runner import Limits, Runner, decode_archive

log = logging.getLogger(__name__)


class SessionNotFound(Exception):
    """No open session with that id (never created, deleted, expired or ended)."""


@dataclass
class Session:
    id: str
    process: SandboxProcess
    limits: Limits
    release_memory: Callable[[], None]
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False


class Sessions:
    """The open sessions of one server."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self.config = runner.config
        self._open: dict[str, Session] = {}
        self._starting = 0

    def __len__(self) -> int:
        return len(self._open)

    async def create(self, request: SessionRequest) -> Session:
        if len(self._open) + self._starting >= self.config.max_sessions:
            message = f"{len(self._open)} sessions open (max_sessions {self.config.max_sessions}); retry later"
            raise Overloaded(message, 5, reason="max_sessions")
        limits = self.runner.limits(request.timeout_s, request.memory_mb, request.max_output_bytes)
        payload = self.runner.payload(
            "session", "python", limits, files=request.files, archive=decode_archive(request.archive),
            kernel=self.runner.isolation.kernel_code, session_cpu_s=self.config.session_cpu_s,
        )  # fmt: skip
        self._starting += 1
        try:
            release_memory = await self.runner.admission.acquire(limits.memory_mb, slot=False)
            try:
                process = await self._start(payload, limits)
            except BaseException:
                release_memory()
                raise
        finally:
            self._starting -= 1
        session = Session(secrets.token_hex(16), process, limits, release_memory)
        self._open[session.id] = session
        self.runner.metrics.sessions.set(len(self._open))
        return session

    async def _start(self, payload: dict, limits: Limits) -> SandboxProcess:
        """A session sandbox whose kernel is ready.

        Raises:
            BadRequestError: the files or archive could not be set up.
        """
        process = await self.runner.start(payload)
        try:
            result, frame = await self.runner.next_result(process, limits)
        except BaseException:
            await process.close()
            raise
        if frame is None or result.status != "ok":
            await process.close()
            raise BadRequestError(f"could not set up the session: {result.message or result.stderr}")
        return process

    async def exec(self, session_id: str, request: ExecRequest) -> RunResult:
        session = self._get(session_id)
        limits = self.runner.limits(request.timeout_s or session.limits.timeout_s, session.limits.memory_mb,
                                    session.limits.max_output)
        async with session.lock:
            if session.closed:
                raise SessionNotFound(session_id)
            async with self.runner.admission.slot():  # no memory: the session holds its own
                session.process.send({
                    "language": request.language, "code": request.code, "timeout_s": limits.timeout_s,
                    "wall_timeout_s": limits.wall_timeout_s,
                    "stdin": (request.stdin or "").encode(),
                })  # fmt: skip
                self.runner.memory.watch(session.process, limits.memory_mb << 20, direct=False)
                try:
                    result, frame = await self.runner.next_result(session.process, limits)
                except asyncio.CancelledError:
                    # The caller went away mid-command: the kernel runs code whose result nobody will read, and
                    # the next command would read it. The session ends (and its memory is freed) now.
                    log.info("session %s: its caller went away during a command; closing it", session_id)
                    await asyncio.shield(self.delete(session_id))
                    raise
                finally:
                    self.runner.memory.unwatch(session.process)
            session.last_used = time.monotonic()
        if frame is None or frame.flags & SESSION_ENDED:
            await self.delete(session_id)
            message = "; ".join(part for part in (result.message, "the session has ended") if part)
            result = result.model_copy(update={"message": message})
        self.runner.metrics.observe(request.language, result.status, result.duration_s)
        return result

    async def delete(self, session_id: str) -> bool:
        session = self._open.pop(session_id, None)
        if session is None:
            return False
        session.closed = True
        self.runner.metrics.sessions.set(len(self._open))
        try:
            await session.process.close()
        finally:
            session.release_memory()
        return True

    def _get(self, session_id: str) -> Session:
        session = self._open.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    async def expire_forever(self) -> None:
        """Delete idle sessions, forever (a background task of the server)."""
        idle_s = self.config.session_idle_timeout_s
        while True:
            await asyncio.sleep(min(max(idle_s / 4, 0.05), 5.0))
            now = time.monotonic()
            for session in [s for s in self._open.values() if now - s.last_used > idle_s and not s.lock.locked()]:
                log.info("session %s idle for %.0fs: deleting", session.id, now - session.last_used)
                await self.delete(session.id)

    async def close_all(self) -> None:
        for session_id in list(self._open):
            await self.delete(session_id)
