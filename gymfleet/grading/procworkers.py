"""The processes behind `gymfleet.grading.procpool.ProcessPool`: what runs in them, and the pool's handles on them.

Child side: `_zygote_main` is the fork server (a fresh interpreter that imports the pool's `preload` modules and runs
its `initializer` once, then forks one worker per request), `_worker_main` the worker body (`target(*args)` for every
`args` received on its socket, under an address-space limit). Workers die with the zygote (parent-death signal).

Parent side: `Zygote` starts the fork server and asks it for workers (`Zygote.fork`, blocking: call it from a
thread); `Worker` is one worker's pid, pidfd and channel (`kill` goes through the pidfd, so a recycled pid is never
hit); `cpu_seconds` reads a process's CPU time from `/proc`. Scheduling, deadlines and demotion are the pool's
(`gymfleet.grading.procpool`). Linux only.

Each item is one message each way on a `Channel` (a length-prefixed pickle on a Unix socket: one `write` to send,
usually one `read` to receive; `multiprocessing.connection` spends a pickler object per send and two reads per
receive). Every reply carries the worker's own CPU time (`time.process_time()`) as it sends it, so the pool knows
what an item's budget starts from without reading `/proc` per item.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import os
import pickle
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Channel", "Worker", "Zygote", "cpu_seconds"]

_PR_SET_PDEATHSIG = 1
_PID = struct.Struct("!i")
_LENGTH = struct.Struct("!Q")
_FIRST_READ = 1 << 16


class Channel:
    """Pickled messages over a connected stream socket, each prefixed with its length (blocking)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def send(self, message: Any) -> None:
        """Send `message` (raises `OSError` once the other end is gone)."""
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        view = memoryview(_LENGTH.pack(len(data)) + data)
        while view:
            view = view[os.write(self._fd, view):]

    def recv(self) -> Any:
        """The next message (raises `EOFError` once the other end is gone)."""
        chunk = os.read(self._fd, _FIRST_READ)
        while len(chunk) < _LENGTH.size:
            more = os.read(self._fd, _LENGTH.size - len(chunk)) if chunk else b""
            if not more:
                raise EOFError("the other end of the channel closed")
            chunk += more
        (length,) = _LENGTH.unpack_from(chunk)
        end = _LENGTH.size + length
        if len(chunk) < end:
            parts, have = [chunk], len(chunk)
            while have < end:
                more = os.read(self._fd, end - have)
                if not more:
                    raise EOFError("the other end of the channel closed mid-message")
                parts.append(more)
                have += len(more)
            chunk = b"".join(parts)
        return pickle.loads(memoryview(chunk)[_LENGTH.size:end])

    def poll(self, timeout_s: float) -> bool:
        """Whether a message (or the end) is ready within `timeout_s`."""
        readable, _, _ = select.select([self._fd], [], [], timeout_s)
        return bool(readable)

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


# ---------------------------------------------------------------------------------------------- child side


def _zygote_main(control_fd: int) -> None:
    """Fork server body: load the pool's code once, then fork one worker per request until the pool goes away."""
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business; it shuts us down
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps dead workers: no zombies
    preload, payload = pickle.loads(control.recv(1 << 20))
    for name in preload:
        importlib.import_module(name)
    target, initializer, memory_mb = pickle.loads(payload)
    if initializer is not None:
        initializer()
    control.send(b"ready")
    zygote = os.getpid()
    while True:
        try:
            _message, fds, _flags, _address = socket.recv_fds(control, 16, 1)
        except OSError:
            return
        if not fds:  # the pool closed its end
            return
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                control.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _die_with_parent(zygote)
                _worker_main(Channel(fds[0]), target, memory_mb)
            except BaseException:  # noqa: BLE001 - a worker must never return into the zygote's loop
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        control.send(_PID.pack(pid))


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the zygote died before the signal was armed
        os._exit(1)


def _worker_main(conn: Channel, target: Callable[..., Any], memory_mb: int | None) -> None:
    """Worker body: answer `target(*args)` for every `args` received, until the socket closes. Each reply is
    `(kind, value, cpu)`: `cpu` is this process's CPU seconds as it replies (the start of the next item's budget)."""
    if memory_mb:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, hard))
    conn.send(("ready", os.getpid(), time.process_time()))
    while True:
        try:
            args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            kind, value = "ok", target(*args)
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never fatal to the worker
            kind, value = "raise", f"{type(exc).__name__}: {str(exc)[:500]}"
        conn.send((kind, value, time.process_time()))


# ---------------------------------------------------------------------------------------------- parent side

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process `pid` has used so far; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS



class Worker:
    __slots__ = ("pid", "pidfd", "conn", "demoted", "busy", "demote_timer", "cpu")

    def __init__(self, pid: int, conn: Channel):
        self.pid = pid
        self.conn = conn
        self.demoted = False
        self.busy = False
        self.demote_timer: asyncio.TimerHandle | None = None
        self.cpu: float | None = None
        """The worker's CPU seconds as of its last message (None before its first)."""
        try:
            # Signals go through a pidfd, so a recycled pid can never be hit by mistake.
            self.pidfd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.pidfd = None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kill()
        self.conn.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class Zygote:
    """The parent's handle on the fork server: start it, ask it for workers, stop it."""

    def __init__(self, payload: bytes, preload: Sequence[str], start_timeout_s: float):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = (f"import sys; sys.path[:0] = {[p for p in sys.path if p]!r}; "
                f"from gymfleet.grading.procworkers import _zygote_main; _zygote_main({theirs.fileno()})")
        try:
            self.process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[theirs.fileno()],
                                            stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.socket = ours
        self.timeout_s = start_timeout_s
        self._finalizer = weakref.finalize(self, _stop_zygote, self.process, ours)
        ours.settimeout(start_timeout_s)
        try:
            ours.send(pickle.dumps((list(preload), payload)))
            if ours.recv(16) != b"ready":
                raise EOFError("the fork server exited while starting (its traceback is on stderr)")
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def fork(self) -> Worker:
        """A new worker that has reported ready (blocking: call from a thread, one call at a time)."""
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.socket, [b"w"], [theirs.fileno()])
            reply = self.socket.recv(_PID.size)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if len(reply) != _PID.size:
            ours.close()
            raise EOFError("the fork server is gone")
        worker = Worker(_PID.unpack(reply)[0], Channel(ours.detach()))
        try:
            if not worker.conn.poll(self.timeout_s):
                raise TimeoutError(f"a worker did not report ready within {self.timeout_s:g}s")
            kind, _pid, worker.cpu = worker.conn.recv()
            if kind != "ready":
                raise ValueError(f"unexpected first message {kind!r} from a worker")
        except BaseException:
            worker.close()
            raise
        return worker

    def close(self) -> None:
        self._finalizer()


def _stop_zygote(process: subprocess.Popen, control: socket.socket) -> None:
    control.close()  # the zygote exits on its own; its workers follow through their parent-death signal
    with contextlib.suppress(OSError):
        process.kill()
    process.wait()
