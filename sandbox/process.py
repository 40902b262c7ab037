"""One running sandbox, seen from the service: start it, send it frames, read its results, kill it.

Pipes are driven with the event loop's `add_reader`/`add_writer` and the exit is awaited on a pidfd, so this works
the same under asyncio and uvloop and needs no child-watcher threads. The process is spawned with
`subprocess.Popen` without `preexec_fn` or uid switches, so CPython uses `vfork`: starting a sandbox does not
copy the server's page tables.

Trust boundary: everything up to the launcher's ready line is infrastructure (a failure there is
`SandboxStartError`, answered 503); everything after it may have been touched by the program under test (garbage
is `ProtocolError`, which the caller reports as the program's fault).

Direct mode (one Python case): the launcher runs the program itself instead of forking (a fork of the interpreter
costs about a millisecond of copied pages), so the program's stdout and stderr are pipes read here, truncated
at `max_output`; the program holds no protocol descriptor, so no frame comes after the ready line: bwrap's exit
status is the outcome (the program's status, or 128 + the signal that ended it; 129-192 read as signals, so a
normal exit with one of those codes is reported as that signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import select
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from sandbox.cgroups import RunCgroup
from sandbox.isolation import Isolation
from sandbox.launcher import EXITED, READY, SETUP_FAILED, SIGNALED
from sandbox.pipes import PipeReader, PipeWriter, ProtocolError

RESULT_TAG = b"@@GF-RESULT"
STDERR_KEEP_BYTES = 16384
HEADER_MAX_BYTES = 256
KILL_GRACE_S = 2.0
MAX_SIGNAL = 64
OUTSIDE_KILL_WAIT_S = 1.0
"""How long a sandbox whose channel closed is given to exit before its exit status is read (`killed_from_outside`)."""


class SandboxStartError(Exception):
    """The sandbox could not be started (bubblewrap or the interpreter failed): an infrastructure failure."""


@dataclass(frozen=True)
class Frame:
    """One case's raw outcome as the launcher reported it (see `sandbox.launcher`)."""

    kind: int
    code: int
    duration_s: float
    cpu_s: float
    stdout: bytes
    stderr: bytes
    flags: int


def encode(payload: Any) -> bytes:
    """A launcher frame: 10 ASCII digits of length, then the marshal blob."""
    blob = payload if isinstance(payload, bytes) else marshal.dumps(payload)
    return b"%010d" % len(blob) + blob


class SandboxProcess:
    """A started sandbox whose launcher said it is ready."""

    def __init__(
        self,
        popen: subprocess.Popen,
        readers: list[PipeReader],
        stdin: PipeWriter,
        host_dir: str | None,
        pidns: bool = True,
        cgroup: RunCgroup | None = None,
    ):
        self.popen = popen
        self._stdout, self._stderr, *self._output = readers
        self._stdin = stdin
        self._host_dir = host_dir
        self.pidns = pidns
        self.cgroup = cgroup
        """The sandbox's memory cgroup (`sandbox.cgroups`), removed by `close()`; None where memory is sampled."""
        self.max_frame_bytes = 0
        self.workdir = ""
        """Where the program's files go, as the launcher sees it."""
        self.direct_fds: tuple[int, ...] = ()
        """The launcher's descriptors of a direct run's stdout and stderr pipes (none: not made for a direct run)."""
        self.memory_exceeded_bytes = 0
        """Set (to what they held) when the memory watch killed the program's processes (`sandbox.memory`)."""
        self.stopped_by_service = False
        """Set when `stop()` had to kill the outer process itself (so its signal death is not the host's doing)."""

    @classmethod
    async def start(
        cls, isolation: Isolation, request: dict[str, Any], *, timeout_s: float, direct: bool = False,
        cgroup: RunCgroup | None = None,
    ) -> SandboxProcess:
        """Start a sandbox (in `cgroup`, before it is sent any code), wait for its ready line, send it `request`.

        Raises:
            SandboxStartError: it did not come up within `timeout_s` (the message carries bwrap's stderr).
        """
        process = await cls.spawn(isolation, timeout_s=timeout_s, direct=direct, cgroup=cgroup)
        process.begin(request)
        return process

    @classmethod
    async def spawn(
        cls, isolation: Isolation, *, timeout_s: float, direct: bool = False, cgroup: RunCgroup | None = None,
    ) -> SandboxProcess:
        """Start a sandbox (in `cgroup`, before it is sent any code), send it the launcher and wait for its ready
        line; it then waits for its request (`begin`). `direct`: with the pipes of a direct run's program output.

        Raises:
            SandboxStartError: it did not come up within `timeout_s` (the message carries bwrap's stderr).
        """
        host_dir = tempfile.mkdtemp(prefix="gymfleet-run-") if isolation.mode == "none" else None
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(5 if direct else 3)]
        child_ends = [pipes[0][0]] + [write_end for _, write_end in pipes[1:]]
        try:
            popen = subprocess.Popen(
                isolation.argv,
                stdin=pipes[0][0],
                stdout=pipes[1][1],
                stderr=pipes[2][1],
                pass_fds=child_ends[3:],
                env=isolation.env,
                cwd=host_dir,
                start_new_session=True,
            )
        except OSError as exc:
            for fd in (fd for pipe in pipes for fd in pipe):
                os.close(fd)
            if cgroup is not None:
                await cgroup.remove()
            raise SandboxStartError(f"cannot start the sandbox ({isolation.argv[0]}): {exc}") from exc
        for fd in child_ends:
            os.close(fd)
        loop = asyncio.get_running_loop()
        readers = [
            PipeReader(loop, pipes[1][0], max_buffer=1 << 20),
            PipeReader(loop, pipes[2][0], max_buffer=STDERR_KEEP_BYTES, keep_head=True),
            *(PipeReader(loop, read_end, max_buffer=0, keep_head=True) for read_end, _ in pipes[3:]),
        ]
        process = cls(popen, readers, PipeWriter(loop, pipes[0][1]), host_dir, isolation.pidns, cgroup)
        process.workdir = host_dir or isolation.workdir
        process.direct_fds = tuple(write_end for _, write_end in pipes[3:])  # their numbers in the sandbox
        if cgroup is not None:
            try:
                await asyncio.to_thread(cgroup.adopt, popen.pid)  # v1: waits for an RCU grace period
            except BaseException as exc:
                await process.close()
                if isinstance(exc, OSError):
                    raise SandboxStartError(f"cannot move the sandbox into its cgroup {cgroup.path}: {exc}") from exc
                raise
        process.send(isolation.launcher_code)
        problem = "exited before it was ready"
        try:
            async with asyncio.timeout(timeout_s):
                line = await process._stdout.readline(len(READY))
        except TimeoutError:
            line, problem = None, f"was not ready within {timeout_s:g}s"
        except ProtocolError:
            line = None
        except BaseException:
            await process.close()
            raise
        if line != READY:
            await process.close()
            raise SandboxStartError(f"the sandbox {problem}: {process.stderr_text or 'no error output'}")
        return process

    def begin(self, request: dict[str, Any]) -> None:
        """Send the request to a sandbox that said it is ready (`spawn`): from here on, the program may run."""
        max_output = request.get("max_output", 0)
        request = {**request, "workdir": self.workdir, "pidns": self.pidns}
        if self.direct_fds:  # the program's own stdout and stderr, handed through bwrap under their numbers here
            request.update(mode="direct", stdout_fd=self.direct_fds[0], stderr_fd=self.direct_fds[1])
        self._stdout.max_buffer = 4 * max_output + (1 << 20)
        for reader in self._output:
            reader.max_buffer = max_output
        self.max_frame_bytes = 2 * max_output
        self.send(request)

    def alive(self) -> bool:
        """Whether a sandbox waiting for its request (`spawn`) is still there to take it."""
        stdout = self._stdout
        return self.popen.poll() is None and not (stdout.eof or stdout.buffer or self._stdin.closed)

    @property
    def stderr_text(self) -> str:
        """What the launcher and bwrap wrote to stderr (kept for diagnostics, truncated)."""
        return bytes(self._stderr.buffer).decode("utf-8", "replace").strip()

    def result_pending(self) -> bool:
        """Whether the launcher wrote something not read yet (a result frame: the case it reports has ended)."""
        if self._stdout.buffer or self._stdout.eof:
            return True
        try:
            return bool(select.select([self._stdout.fd], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def send(self, payload: Any) -> None:
        self._stdin.write(encode(payload))

    async def next_result(self) -> Frame | None:
        """The next result frame, or None when the launcher is gone.

        Raises:
            ProtocolError: the channel carried something else.
        """
        header = await self._stdout.readline(HEADER_MAX_BYTES)
        if header is None:
            return None
        parts = header.split()
        if len(parts) != 8 or parts[0] != RESULT_TAG:
            raise ProtocolError(f"unexpected output on the launcher channel: {header[:80]!r}")
        try:
            kind, code, duration_us, cpu_us, out_len, err_len, flags = (int(part) for part in parts[1:])
        except ValueError as exc:
            raise ProtocolError(f"malformed result header: {header[:80]!r}") from exc
        if min(out_len, err_len, duration_us, cpu_us) < 0 or out_len + err_len > self.max_frame_bytes:
            raise ProtocolError(f"result header out of bounds: {header[:80]!r}")
        body = await self._stdout.read(out_len + err_len)
        if body is None:
            return None
        return Frame(kind, code, duration_us / 1e6, cpu_us / 1e6, body[:out_len], body[out_len:], flags)

    async def direct_result(self, frame: Frame | None, duration_s: float) -> Frame:
        """Complete a direct-mode outcome with the program's output. `frame` is the launcher's report (or a timeout
        the caller made), or None when the program ended the launcher: bwrap's exit status then tells how."""
        if frame is None:
            await self.stop(grace_s=2.0)
            code = self.popen.returncode
            kind, code = (SIGNALED, code - 128) if 128 < code <= 128 + MAX_SIGNAL else (EXITED, code)
            frame = Frame(kind, code, duration_s, 0.0, b"", b"", 0)
        elif frame.kind == SETUP_FAILED:
            return frame
        for reader in self._output:
            await reader.wait_eof(timeout_s=1.0)
        out, err = (bytes(reader.buffer) for reader in self._output)
        flags = (1 if self._output[0].truncated else 0) | (2 if self._output[1].truncated else 0)
        return Frame(frame.kind, frame.code, frame.duration_s, frame.cpu_s, out, err, flags)

    async def stop(self, *, grace_s: float = 0.0) -> None:
        """Let the sandbox end by itself for up to `grace_s`, else kill it; reap it either way.

        The sandbox's init (bwrap's PID 1) is killed first, so the kernel kills the whole PID namespace and the
        outer bwrap reaps it and exits: killing the outer bwrap first would orphan the init to whatever reaps
        orphans on this host (a container's init may never do it).
        """
        if self.popen.poll() is None and not await _exited_within(self.popen, grace_s):
            for pid in _children(self.popen.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if not await _exited_within(self.popen, KILL_GRACE_S):
                self.stopped_by_service = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                await _exited_within(self.popen, None)

    async def killed_from_outside(self, *, wait_s: float = OUTSIDE_KILL_WAIT_S) -> str | None:
        """The signal's name if the outer process (bwrap) died of a signal this service did not send, else None.

        Only the host can do that (its OOM killer, an operator): the program runs in a PID namespace of its own and
        cannot signal that process, so it is an infrastructure failure. Waits up to `wait_s` for the outer process
        to exit (called when the sandbox's channel has closed). Always None without a PID namespace, where the outer
        process is the launcher, which the program can signal.
        """
        if not self.pidns or not await _exited_within(self.popen, wait_s):
            return None
        code = self.popen.returncode
        if code >= 0 or self.stopped_by_service:
            return None
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"

    async def close(self, *, grace_s: float = 0.0) -> None:
        """`stop()`, then release the pipes (and, without isolation, the run's folder)."""
        try:
            await self.stop(grace_s=grace_s)
            await self._stderr.wait_eof(timeout_s=1.0)
        finally:
            self._stdin.close()
            for reader in (self._stdout, self._stderr, *self._output):
                reader.close()
            if self._host_dir is not None:
                shutil.rmtree(self._host_dir, ignore_errors=True)
            if self.cgroup is not None:
                await self.cgroup.remove()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listing:
            return [int(child) for child in listing.read().split()]
    except OSError:
        return []


async def _exited_within(popen: subprocess.Popen, timeout_s: float | None) -> bool:
    """Whether the process exited (and is reaped) within `timeout_s` (None: wait as long as it takes)."""
    if popen.poll() is not None:
        return True
    if timeout_s is not None and timeout_s <= 0:
        return False
    try:
        async with asyncio.timeout(timeout_s):
            await _wait_exit(popen)
    except TimeoutError:
        return False
    except asyncio.CancelledError:  # the request was cancelled: still never leave the sandbox running
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(5)
        raise
    return True


async def _wait_exit(popen: subprocess.Popen) -> None:
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(popen.pid)
    except ProcessLookupError:
        popen.wait()
        return
    exited = loop.create_future()
    loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    popen.wait()
