"""Start servers by forking them from one pre-imported parent, the zygote (`ng_run`'s default, `server_start: zygote`):
the supervisor's side of it.

A fresh interpreter per server (`python -m gymfleet.fleet.launch`, `server_start: spawn`) imports fastapi, pydantic,
uvicorn, aiohttp and its environment's libraries again: for the Nano 3 fleet that is most of its start-up time and
of its memory. The zygote imports all of it once (the shared stack and the `app.py` of every instance in the
config), calls `gc.freeze()` so the garbage collector does not touch (and so copy) the imported objects, and forks
one child per server on request; the children share those pages copy-on-write. Every import comes before the first
fork on purpose: forking each server as soon as its own `app.py` is imported was measured (Nano 3, this 2-core
machine) to be ready about 1.7 s sooner but to take about 95 MB more, as every later import writes to pages the
children already share (reference counts, the allocator's pools) and copy-on-write duplicates them.

This module is the supervisor's side: `Zygote` (its handle on the zygote process), `ForkedProcess` and the messages
both sides exchange. The zygote process itself (its loop, its helper, the imports) is `gymfleet.fleet.zygote_main`;
what a forked child does before it serves is `gymfleet.fleet.zygote_child`.

Why a fresh interpreter and not a fork of the supervisor: forking a multi-threaded process copies locks other
threads may hold (logging, the import lock, malloc's) into a child with none of those threads. The supervisor has
threads (head server, log pumps, endpoint probes), and its caller may too: NeMo-RL's Ray actor calls
`RunHelper.start` with many threads running. So the supervisor starts `python -m gymfleet.fleet.zygote_main` with
`subprocess` (safe from any thread), and only the zygote, single-threaded by construction, ever forks. A zygote
whose imports start a Python thread refuses to serve (the fleet falls back to fresh interpreters).

The supervisor and the zygote talk over a private Unix socket pair (`SOCK_SEQPACKET`: one JSON message per
packet; file descriptors travel with `socket.send_fds`, SCM_RIGHTS):

- zygote → supervisor `{"op": "ready"}` once everything is imported; `{"op": "exit", "pid", "code"}` when it
  reaps a child (`code` as `subprocess.Popen.returncode`: negative for a signal);
- supervisor → zygote `{"op": "config", "path"}` first, for a zygote started without `--config`;
  `{"op": "spawn", "id", "instance", "env", "secrets"}` with the write end of the child's output pipe and the
  server's bound socket (`gymfleet.fleet.ports`), answered
  `{"op": "spawned", "id", "pid"}`; `{"op": "validate", "secrets", "env"}` with a pipe, on which throwaway children
  (one from the zygote and one from its helper, each for the servers it imported: `parts` in the answer) write one
  JSON line each saying whether their servers build (`gymfleet.fleet.supervisor.Fleet.validate` without importing
  everything a second time).
- zygote ↔ helper: the same messages on a socket pair of their own; the zygote forwards a spawn of a server the
  helper imported, and relays the helper's `spawned` and `exit` messages. A helper that dies takes the zygote with it
  (the supervisor starts another); a zygote that goes closes the helper's socket, and the helper exits.

On the supervisor's side a `ForkedProcess` stands in for `subprocess.Popen` (`pid`, `poll()`, `wait()`,
`returncode`, `stdout`, `kill()`); exit codes come from the zygote. A child whose zygote died is watched through
its own pidfd: its exit is seen, but its code is lost (`EXIT_UNKNOWN`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gymfleet.errors import GymfleetError

__all__ = ["EXIT_UNKNOWN", "ForkedProcess", "Zygote", "ZygoteError"]

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 180.0
"""A zygote that has not imported everything within this long counts as failed."""
REPLY_TIMEOUT_S = 30.0
"""How long the supervisor waits for the zygote to answer a spawn (a fork takes milliseconds)."""
VALIDATE_TIMEOUT_S = 120.0
MAX_MESSAGE_BYTES = 1 << 20
CMDLINE_ROOM = "." * 160
"""Room in the zygote's command line (it blanks it at once): each forked server writes its own there, as `ps` shows
it (`set_cmdline`), and a long instance name must fit even when the zygote had no `--config` path to make room."""
EXIT_UNKNOWN = -1000
"""`returncode` of a forked server that exited after its zygote died: nobody could collect its exit code."""


class ZygoteError(GymfleetError, RuntimeError):
    """The zygote died, did not get ready, or did not answer; the supervisor falls back to fresh interpreters."""


# ------------------------------------------------------------------------------------------ messages


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """The next message and the descriptors that came with it; `(None, [])` once the other side is gone."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE_BYTES, 4)
    return (json.loads(data) if data else None), fds


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (readable once it exits), or None on a kernel or Python without pidfd_open."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pidfd: int | None, pid: int) -> bool:
    if pidfd is not None:
        return bool(select.select([pidfd], [], [], 0)[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


# ------------------------------------------------------------------------------------------ supervisor side


class ForkedProcess:
    """A server the zygote forked, with the parts of `subprocess.Popen` the supervisor uses."""

    def __init__(self, pid: int, stdout: IO[str], zygote: Zygote):
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self.args = f"<{pid} forked by zygote {zygote.pid}>"
        self._zygote = zygote
        self._pidfd = _open_pidfd(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            zygote_dead = not self._zygote.alive  # read first: every exit it reported is recorded by then
            code = self._zygote.exit_code(self.pid)
            if code is None and zygote_dead and _exited(self._pidfd, self.pid):
                code = EXIT_UNKNOWN
            if code is not None:
                self.returncode = code
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The supervisor's handle on one zygote process: starts it, asks it for children, hears of their exits.

    Args:
        config_path: the fleet's resolved (secret-free) config; every instance's entrypoint is imported from it.
            None starts the zygote before the config exists (`ng_run` does, so the shared stack imports while it
            parses its config): it imports the shared stack and waits for `adopt()`.
        output: called with each line the zygote prints (its own log lines, not its children's).
        on_death: called once, from the reader thread, if the zygote exits before `close()`.
    """

    def __init__(self, config_path: Path | None, *, output: Callable[[str], None] | None = None,
                 on_death: Callable[[Zygote], None] | None = None):
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.started_at = time.monotonic()
        with theirs:
            command = [sys.executable, "-m", "gymfleet.fleet.zygote_main", "--control-fd", str(theirs.fileno()),
                       "--parent-pid", str(os.getpid()), *(["--config", str(config_path)] if config_path else []),
                       "--room", CMDLINE_ROOM]
            self.process = subprocess.Popen(
                command, pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1, errors="replace",
            )
        self.pid = self.process.pid
        self.tail: list[str] = []
        self._output = output
        self._on_death = on_death
        self.was_ready = False
        """Whether it ever got ready (imported everything); `ready` is whether it is ready and alive now."""
        self._ready = threading.Event()
        self._dead = threading.Event()
        self._closing = False
        self._replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._next_id = 0
        threading.Thread(target=self._read, name=f"zygote-{self.pid}", daemon=True).start()
        threading.Thread(target=self._pump, name=f"log-zygote-{self.pid}", daemon=True).start()

    def adopt(self, config_path: Path, *, output: Callable[[str], None],
              on_death: Callable[[Zygote], None]) -> bool:
        """Give a zygote started without a config (`Zygote(None)`) the fleet's config and callbacks; whether it
        took them (False if it died meanwhile: start another)."""
        earlier = list(self.tail)
        self._output = output
        for line in earlier:  # what it said before anyone listened
            output(line)
        if not self.alive:
            return False
        self._on_death = on_death
        try:
            _send(self._control, {"op": "config", "path": str(config_path)})
        except OSError:
            return False
        return True

    @property
    def alive(self) -> bool:
        return not self._dead.is_set()

    @property
    def ready(self) -> bool:
        return self.was_ready and self.alive

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exits.get(pid)

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Return once the zygote has imported everything.

        Raises:
            ZygoteError: it exited first (with its last lines), or took longer than `timeout_s`.
        """
        remaining = timeout_s - (time.monotonic() - self.started_at)
        if not self._ready.wait(max(0.0, remaining)):
            raise ZygoteError(f"the zygote (pid {self.pid}) was not ready within {timeout_s:g}s")
        if not self.alive:
            raise ZygoteError(f"the zygote (pid {self.pid}) {self.death_text()}")

    def death_text(self) -> str:
        """`exited with code 1; its last lines: ...` (once it is dead)."""
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        lines = "".join(f"\n    {line}" for line in self.tail[-10:])
        return f"exited with code {code}" + (f"; its last lines:{lines}" if lines else "")

    def validate(self, secrets: list, env: dict[str, str]) -> str | None:
        """Build every server once, in a throwaway child: None when all build, else the first error's text.

        Raises:
            ZygoteError: the zygote is gone, or the child died without an answer.
        """
        read_fd, write_fd = os.pipe()
        with os.fdopen(read_fd, "rb") as answer:
            try:
                reply = self._request({"op": "validate", "secrets": secrets, "env": env}, write_fd)
            finally:
                os.close(write_fd)
            deadline = time.monotonic() + VALIDATE_TIMEOUT_S
            data = b""
            while chunk := self._read_before(answer, deadline):  # until every validating child closed the pipe
                data += chunk
        lines = data.splitlines()
        if len(lines) < reply.get("parts", 1):  # the zygote and its helper each validate their half
            raise ZygoteError("the zygote's validation child died without an answer")
        errors = [result["error"] for result in map(json.loads, lines) if not result["ok"]]
        return errors[0] if errors else None

    @staticmethod
    def _read_before(answer: IO[bytes], deadline: float) -> bytes:
        if not select.select([answer], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise ZygoteError(f"the zygote's validation gave no answer within {VALIDATE_TIMEOUT_S:g}s")
        return os.read(answer.fileno(), 65536)

    def spawn(self, instance: str, secrets: list, env: dict[str, str], listen_fd: int) -> ForkedProcess:
        """Fork the server of `instance`, listening on the bound socket `listen_fd` (the caller keeps its own copy);
        its output comes out of the returned process's `stdout`.

        Raises:
            ZygoteError: the zygote is gone or did not answer within `REPLY_TIMEOUT_S`.
        """
        read_fd, write_fd = os.pipe()
        try:
            reply = self._request({"op": "spawn", "instance": instance, "secrets": secrets, "env": env}, write_fd,
                                  listen_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child holds its copy: EOF on our end is the child (and its workers) gone
        stdout = os.fdopen(read_fd, "r", errors="replace")
        return ForkedProcess(reply["pid"], stdout, self)

    def _request(self, message: dict[str, Any], fd: int, *more_fds: int) -> dict[str, Any]:
        with self._request_lock:
            self.wait_ready()
            self._next_id += 1
            message["id"] = self._next_id
            try:
                _send(self._control, message, [fd, *more_fds])
            except OSError as exc:
                raise ZygoteError(f"the zygote (pid {self.pid}) cannot be reached: {exc}") from None
            while True:
                try:
                    reply = self._replies.get(timeout=REPLY_TIMEOUT_S)
                except queue.Empty:
                    raise ZygoteError(f"the zygote (pid {self.pid}) did not answer within {REPLY_TIMEOUT_S:g}s") \
                        from None
                if reply is None:
                    raise ZygoteError(f"the zygote (pid {self.pid}) {self.death_text()}")
                if reply.get("id") == message["id"]:
                    return reply

    def _read(self) -> None:
        try:
            while True:
                message, _ = _receive(self._control)
                if message is None:
                    break
                if message["op"] == "exit":
                    with self._lock:
                        self._exits[message["pid"]] = message["code"]
                elif message["op"] == "ready":
                    self.was_ready = True
                    self._ready.set()
                else:
                    self._replies.put(message)
        except (OSError, ValueError) as exc:  # a closed socket (close()) or a garbled message
            if not self._closing:
                log.error("zygote %s: reading its messages failed: %s", self.pid, exc)
        self._dead.set()
        self._ready.set()
        self._replies.put(None)
        if not self._closing and self._on_death is not None:
            self._on_death(self)

    def _pump(self) -> None:
        with contextlib.closing(self.process.stdout):
            for line in self.process.stdout:
                line = line.rstrip("\n")
                self.tail = [*self.tail[-39:], line]
                if not self._closing and self._output is not None:
                    self._output(line)

    def close(self, grace_s: float = 2.0) -> None:
        """Stop the zygote (its children keep running: the supervisor stops them itself)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._control.shutdown(socket.SHUT_RDWR)
        if not self.was_ready:  # still importing: nothing to finish, and its config file may be gone already
            with contextlib.suppress(OSError):  # its own process group: it and its helper (servers have their own)
                os.killpg(self.pid, signal.SIGKILL)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._control.close()


# ------------------------------------------------------------------------------------------ zygote side
