"""The service's side of the fork server (`sandbox.forkserver`): one warm interpreter in a sandbox, asked for one
fresh, isolated sandbox per one-shot Python run.

`ForkServer.fork()` hands the fork server four pipe ends over its socket (the request pipe's read end, the
program's stdout and stderr, the status pipe), learns the pid of the new run's init (pid 1 of the run's PID
namespace, a child of the fork server), finds it on the host (its `NSpid` at the fork server's level) and returns a
`ForkedRun`: a `SandboxProcess` whose program waits for its request. The runner (`Runner.take_warm`, through the
warm pool, `sandbox.warm`) moves the init and the program into the run's cgroups, then sends the request; the
outcome is the `@@GF-EXIT` status the fork server writes when the run's init exits (or a setup failure's result
frame, written by the program's process before any model code runs). The program never holds the status pipe.

A fork server killed from outside (the host's OOM killer, an operator) takes its runs with it: their status pipes
close with no status, and each is reported `sandbox_failed` with the signal that killed it; the next `fork()`
starts a new fork server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import weakref
from typing import Any

from sandbox.cgroups import RunCgroup
from sandbox.isolation import SHM_MB, Isolation
from sandbox.launcher import READY
from sandbox.pipes import PipeReader, PipeWriter
from sandbox.process import (
    KILL_GRACE_S,
    OUTSIDE_KILL_WAIT_S,
    STDERR_KEEP_BYTES,
    SandboxProcess,
    SandboxStartError,
    _children,
    encode,
)

log = logging.getLogger(__name__)

EXIT_TAG = b"@@GF-EXIT "
FORKED_TAG = b"@@GF-FORKED "
LINE_MAX_BYTES = 256


_SERVERS: weakref.WeakSet[ForkServer] = weakref.WeakSet()


def server_pids() -> set[int]:
    """The processes of every fork server of this process (they are not any run's)."""
    return {pid for server in list(_SERVERS) for pid in server.pids()}


async def _killed_from_outside(popen: subprocess.Popen, wait_s: float) -> str | None:
    """The signal's name if the fork server's bwrap died of a signal this service did not send, else None."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(popen.wait, wait_s)
    if popen.returncode is None or popen.returncode >= 0 or getattr(popen, "killed_by_service", False):
        return None
    try:
        return signal.Signals(-popen.returncode).name
    except ValueError:
        return f"signal {-popen.returncode}"


def _nspid(pid: int) -> list[str]:
    """The process's pids, from the host's PID namespace down to its own (`NSpid` in its status)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("NSpid:"):
                return line.split()[1:]
    return []


class RunInit:
    """The `popen` of a forked run: its init, a child of the fork server (not ours to wait for); its `returncode` is
    the status the fork server reported, bwrap-style (the program's, or 128 + the signal)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self.pidfd = os.pidfd_open(pid)

    def gone(self) -> bool:
        poller = select.poll()  # not select(): descriptors past 1023 are common under load
        poller.register(self.pidfd, select.POLLIN)
        return bool(poller.poll(0))

    def poll(self) -> int | None:
        return self.returncode

    async def exited_within(self, timeout_s: float) -> bool:
        if self.gone():
            return True
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(self.pidfd, lambda: exited.done() or exited.set_result(None))
        try:
            async with asyncio.timeout(timeout_s):
                await exited
            return True
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(self.pidfd)


class ForkedRun(SandboxProcess):
    """One run forked by the fork server (see the module's docstring)."""

    def __init__(self, server: ForkServer, init: RunInit, readers: list[PipeReader], request: PipeWriter):
        super().__init__(init, [readers[0], None, *readers[1:]], request, None, True, None)  # type: ignore[arg-type]
        self.server = server
        self.server_popen = server.popen
        self.workdir = server.isolation.workdir
        self.pids: RunCgroup | None = None
        """Its pids cgroup (v1), removed by `close()`; on v2 its memory cgroup limits its processes."""
        self.lost = False
        """Set when the status pipe closed with no status (the fork server was killed)."""

    @property
    def stderr_text(self) -> str:
        return self.server.stderr_text

    def alive(self) -> bool:
        return not (self.init.gone() or self._stdout.eof or self._stdout.buffer or self._stdin.closed)

    @property
    def init(self) -> RunInit:
        return self.popen  # type: ignore[return-value]

    async def next_result(self):
        line = await self._stdout.readline(LINE_MAX_BYTES)
        if line is None:
            self.lost = True
            self.init.returncode = 128 + signal.SIGKILL
            return None
        if line.startswith(EXIT_TAG):
            try:
                self.init.returncode = int(line[len(EXIT_TAG):])
            except ValueError:
                self.init.returncode = 255
            return None
        self._stdout.buffer[:0] = line  # a result frame (a setup failure)
        return await super().next_result()

    async def stop(self, *, grace_s: float = 0.0) -> None:
        """Let the run end by itself for up to `grace_s`, else kill its init (which ends its PID namespace) and the
        processes below it."""
        init = self.init
        try:
            if await init.exited_within(grace_s):
                return
        except asyncio.CancelledError:  # the request was cancelled: still never leave the run running
            self._kill()
            raise
        self._kill()
        await init.exited_within(KILL_GRACE_S)

    def _kill(self) -> None:
        for pid in [*_children(self.init.pid), self.init.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def killed_from_outside(self, *, wait_s: float = OUTSIDE_KILL_WAIT_S) -> str | None:
        """The signal that killed the fork server from outside, when it took this run with it; else None."""
        if not self.lost or self.server_popen is None:
            return None
        return await _killed_from_outside(self.server_popen, wait_s)

    async def close(self, *, grace_s: float = 0.0) -> None:
        try:
            await self.stop(grace_s=grace_s)
        finally:
            self._stdin.close()
            for reader in (self._stdout, *self._output):
                reader.close()
            os.close(self.init.pidfd)
            for cgroup in (self.cgroup, self.pids):
                if cgroup is not None:
                    await cgroup.remove()


class ForkServer:
    """The fork server's sandbox, started on first use and again after it died."""

    def __init__(self, isolation: Isolation, *, workspace_mb: int, startup_timeout_s: float):
        self.isolation = isolation
        self.workspace_mb = workspace_mb
        self.startup_timeout_s = startup_timeout_s
        self.popen: subprocess.Popen | None = None
        self.host_pid = 0
        """The fork server's own process (the launcher inside the sandbox), whose children are the runs' inits."""
        self._socket: socket.socket | None = None
        self._stdout: PipeReader | None = None
        self._stderr: PipeReader | None = None
        self._forked: dict[bytes, asyncio.Future] = {}
        self._known: dict[int, int] = {}
        """Host pid -> the fork server's pid, of its children seen so far."""
        self._level = 0
        """The depth of the fork server's PID namespace (its pids are that field of its children's `NSpid`)."""
        self._serial = 0
        self._lock = asyncio.Lock()
        self._reading: asyncio.Task | None = None
        _SERVERS.add(self)

    @property
    def stderr_text(self) -> str:
        return bytes(self._stderr.buffer).decode("utf-8", "replace").strip() if self._stderr else ""

    def pids(self) -> set[int]:
        """The fork server's own processes: bwrap outside, the sandbox's init, the fork server."""
        if self.popen is None or self.popen.poll() is not None:
            return set()
        return {self.popen.pid, *_children(self.popen.pid), self.host_pid}

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None and self._stdout is not None \
            and not self._stdout.eof

    async def fork(self) -> ForkedRun:
        """A run forked by the fork server, its program waiting for its request.

        Raises:
            SandboxStartError: the fork server could not be started, or did not fork.
        """
        async with self._lock:
            if not self.running():
                await self._restart()
        self._serial += 1
        token = self._serial.to_bytes(8, "big")  # matches the fork server's answer to this request
        request_r, request_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        loop = asyncio.get_running_loop()
        forked = self._forked[token.hex().encode()] = loop.create_future()
        try:
            socket.send_fds(self._socket, [token], [request_r, out_w, err_w, status_w])
        except OSError as exc:
            for fd in (request_r, request_w, out_r, out_w, err_r, err_w, status_r, status_w):
                os.close(fd)
            raise SandboxStartError(f"the sandbox fork server is gone: {exc}") from exc
        finally:
            for fd in (request_r, out_w, err_w, status_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
        readers = [PipeReader(loop, status_r, max_buffer=1 << 20),
                   *(PipeReader(loop, fd, max_buffer=0, keep_head=True) for fd in (out_r, err_r))]
        writer = PipeWriter(loop, request_w)
        try:
            async with asyncio.timeout(self.startup_timeout_s):
                pid = await forked
            init = RunInit(self._host_pid_of(pid))
        except BaseException as exc:
            writer.close()
            for reader in readers:
                reader.close()
            if isinstance(exc, (TimeoutError, OSError, LookupError)):
                raise SandboxStartError(f"the sandbox fork server did not fork a run: {exc!r}; "
                                        f"{self.stderr_text or 'no error output'}") from exc
            raise
        finally:
            self._forked.pop(token.hex().encode(), None)
        return ForkedRun(self, init, readers, writer)

    def _host_pid_of(self, pid: int) -> int:
        """The host pid of the fork server's child `pid` (as the fork server sees it: in the child's `NSpid`, the
        field at the fork server's level; the last one is 1, its pid in its own PID namespace).

        Raises:
            LookupError: no such child (it failed and exited already).
        """
        children = _children(self.host_pid)
        self._known = {child: self._known[child] for child in children if child in self._known}
        for child in children:
            if child not in self._known and len(pids := _nspid(child)) > self._level:
                self._known[child] = int(pids[self._level])
            if self._known.get(child) == pid:
                return child
        raise LookupError(f"the fork server's child {pid} is gone")

    async def _restart(self) -> None:
        if self.popen is not None:
            log.warning("the sandbox fork server ended (%s): starting a new one; %s", self.popen.poll(),
                        self.stderr_text or "no error output")
            await self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.popen = subprocess.Popen(self.isolation.forkserver_argv, stdin=theirs, stdout=out_w, stderr=err_w,
                                          env=self.isolation.env, start_new_session=True)
        except OSError as exc:
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            ours.close()
            raise SandboxStartError(f"cannot start the sandbox fork server: {exc}") from exc
        finally:
            theirs.close()
        os.close(out_w)
        os.close(err_w)
        loop = asyncio.get_running_loop()
        self._socket = ours
        self._stdout = PipeReader(loop, out_r, max_buffer=1 << 20)
        self._stderr = PipeReader(loop, err_r, max_buffer=STDERR_KEEP_BYTES, keep_head=True)
        request: dict[str, Any] = {
            "mode": "forkserver", "language": "python", "forkserver": self.isolation.forkserver_code,
            "workdir": self.isolation.workdir, "pidns": True, "workspace_bytes": self.workspace_mb << 20,
            "shm_bytes": SHM_MB << 20, "env": self.isolation.program_env,
        }
        line = None
        try:
            await loop.sock_sendall(ours, encode(self.isolation.launcher_code) + encode(request))
            async with asyncio.timeout(self.startup_timeout_s):
                line = await self._stdout.readline(len(READY))
            problem = "exited before it was ready"
        except TimeoutError:
            problem = f"was not ready within {self.startup_timeout_s:g}s"
        except OSError:  # it is gone already (its stderr says why)
            problem = "exited before it was ready"
        init = _children(self.popen.pid)
        launcher = _children(init[0]) if init else []
        if line != READY or not launcher:
            await self._stderr.wait_eof(timeout_s=1.0)
            stderr = self.stderr_text or "no error output"
            await self.close()
            raise SandboxStartError(f"the sandbox fork server {problem}: {stderr}")
        self.host_pid = launcher[0]
        self._level = len(_nspid(self.host_pid)) - 1
        self._reading = asyncio.create_task(self._read_forked(self._stdout))

    async def _read_forked(self, stdout: PipeReader) -> None:
        """Hand each `@@GF-FORKED <token> <pid>` line to the `fork()` waiting for it."""
        while (line := await stdout.readline(LINE_MAX_BYTES)) is not None:
            parts = line.split()
            if len(parts) == 3 and parts[0] == FORKED_TAG.strip() and (waiter := self._forked.get(parts[1])):
                if not waiter.done():
                    pid = int(parts[2])
                    waiter.set_result(pid) if pid else waiter.set_exception(OSError("the fork server refused"))
        for waiter in self._forked.values():
            if not waiter.done():
                waiter.set_exception(OSError("the fork server ended"))

    async def close(self) -> None:
        """Stop the fork server: end of its input, then a kill if it is still there after a moment."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        popen = self.popen
        if popen is not None:
            try:
                await asyncio.to_thread(popen.wait, 1.0)
            except subprocess.TimeoutExpired:
                popen.killed_by_service = True  # type: ignore[attr-defined]
                for pid in [*_children(popen.pid), popen.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                await asyncio.to_thread(popen.wait)
        if self._reading is not None:
            self._reading.cancel()
            self._reading = None
        for reader in (self._stdout, self._stderr):
            if reader is not None:
                reader.close()
        self._stdout = self._stderr = None
