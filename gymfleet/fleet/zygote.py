"""Start servers by forking them from one pre-imported parent, the zygote (`ng_run`'s default, `server_start: zygote`).

A fresh interpreter per server (`python -m gymfleet.fleet.launch`, `server_start: spawn`) imports fastapi, pydantic,
uvicorn, aiohttp and its environment's libraries again: for the Nano 3 fleet that is most of its start-up time and
of its memory. The zygote imports all of it once (the shared stack and the `app.py` of every instance in the
config), calls `gc.freeze()` so the garbage collector does not touch (and so copy) the imported objects, and forks
one child per server on request; the children share those pages copy-on-write. Every import comes before the first
fork on purpose: forking each server as soon as its own `app.py` is imported was measured (Nano 3, this 2-core
machine) to be ready about 1.7 s sooner but to take about 95 MB more, as every later import writes to pages the
children already share (reference counts, the allocator's pools) and copy-on-write duplicates them.

Two things shorten the path to the first fork. `ng_run` starts its zygote before it parses the config (`Zygote(None)`,
adopted by the fleet with `adopt()`), so the shared stack imports while the supervisor imports its own stack and
reads the YAML. And on a machine with 2+ CPUs the zygote forks one helper right after the shared stack: the two
claim the config's server classes one at a time from a shared pipe and import them side by side (reasoning_gym and
instruction_following's models, the two slowest, load in parallel). Each server is then forked by whichever of the
two imported its class, so neither imports anything after its first server shares its pages.

Why a fresh interpreter and not a fork of the supervisor: forking a multi-threaded process copies locks other
threads may hold (logging, the import lock, malloc's) into a child with none of those threads. The supervisor has
threads (head server, log pumps, endpoint probes), and its caller may too: NeMo-RL's Ray actor calls
`RunHelper.start` with many threads running. So the supervisor starts `python -m gymfleet.fleet.zygote` with
`subprocess` (safe from any thread), and only the zygote, single-threaded by construction, ever forks. A zygote
whose imports start a Python thread refuses to serve (the fleet falls back to fresh interpreters).

The supervisor and the zygote talk over a private Unix socket pair (`SOCK_SEQPACKET`: one JSON message per
packet; file descriptors travel with `socket.send_fds`, SCM_RIGHTS):

- zygote → supervisor `{"op": "ready"}` once everything is imported; `{"op": "exit", "pid", "code"}` when it
  reaps a child (`code` as `subprocess.Popen.returncode`: negative for a signal);
- supervisor → zygote `{"op": "config", "path"}` first, for a zygote started without `--config`;
  `{"op": "spawn", "id", "instance", "env", "secrets"}` with the write end of the child's output pipe, answered
  `{"op": "spawned", "id", "pid"}`; `{"op": "validate", "secrets", "env"}` with a pipe, on which throwaway children
  (one from the zygote and one from its helper, each for the servers it imported: `parts` in the answer) write one
  JSON line each saying whether their servers build (`gymfleet.fleet.supervisor.Fleet.validate` without importing everything a
  second time).
- zygote ↔ helper: the same messages on a socket pair of their own; the zygote forwards a spawn of a server the
  helper imported, and relays the helper's `spawned` and `exit` messages. A helper that dies takes the zygote with it
  (the supervisor starts another); a zygote that goes closes the helper's socket, and the helper exits.

Each child starts its own session (process group), takes the pipe as stdout and stderr and /dev/null as stdin,
gets the supervisor's environment of the moment plus the fleet token (`env`), its secrets in memory (never on disk,
argv or even its environment), a fresh random seed (`random`, and `numpy.random` if imported), default signal
handlers and fresh logging handlers; no event loop, aiohttp session or thread exists in the zygote to inherit.
It then serves exactly as `python -m gymfleet.fleet.launch` does (`gymfleet.fleet.launch.serve_supervised`), `num_workers`,
`EXIT_PORT_IN_USE` and all, and dies with the supervisor: it watches the supervisor's pidfd, which the zygote
opened, so a child outlives its zygote but never its supervisor. The zygote exits when the supervisor closes the
socket or dies; its children keep serving.

On the supervisor's side a `ForkedProcess` stands in for `subprocess.Popen` (`pid`, `poll()`, `wait()`,
`returncode`, `stdout`, `kill()`); exit codes come from the zygote. A child whose zygote died is watched through
its own pidfd: its exit is seen, but its code is lost (`EXIT_UNKNOWN`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
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
import traceback
from collections.abc import Callable, Iterable, Iterator
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
SHARED_MODULES = (
    "asyncio", "json", "multiprocessing.spawn", "pydantic", "fastapi", "starlette.applications", "aiohttp",
    "uvicorn", "uvicorn.config", "uvicorn.server", "uvicorn.lifespan.on", "uvicorn.loops.auto",
    "uvicorn.loops.uvloop", "uvicorn.protocols.http.auto", "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl", "uvicorn.protocols.websockets.auto", "gymfleet.serving.server", "gymfleet.http",
    "gymfleet.fleet.launch", "gymfleet.serving.resources", "gymfleet.serving.agent", "gymfleet.serving.model", "gymfleet.grading.judge",
    "gymfleet.grading.sandbox_client",
)  # fmt: skip
"""Imported first, whatever the config: what every server imports (uvicorn's `auto` modules load at serve time;
the resources, agent and model bases bring the `openai` types). Imported once, before the helper forks: what the
zygote and its helper both import after that is held twice."""


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
            command = [sys.executable, "-m", "gymfleet.fleet.zygote", "--control-fd", str(theirs.fileno()),
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

    def spawn(self, instance: str, secrets: list, env: dict[str, str]) -> ForkedProcess:
        """Fork the server of `instance`; its output comes out of the returned process's `stdout`.

        Raises:
            ZygoteError: the zygote is gone or did not answer within `REPLY_TIMEOUT_S`.
        """
        read_fd, write_fd = os.pipe()
        try:
            reply = self._request({"op": "spawn", "instance": instance, "secrets": secrets, "env": env}, write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child holds its copy: EOF on our end is the child (and its workers) gone
        stdout = os.fdopen(read_fd, "r", errors="replace")
        return ForkedProcess(reply["pid"], stdout, self)

    def _request(self, message: dict[str, Any], fd: int) -> dict[str, Any]:
        with self._request_lock:
            self.wait_ready()
            self._next_id += 1
            message["id"] = self._next_id
            try:
                _send(self._control, message, [fd])
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


def import_shared() -> None:
    """Import what every server imports, whatever the config (`SHARED_MODULES`)."""
    for name in SHARED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # optional accelerators (uvloop, httptools, websockets) may be missing
            pass


def server_groups(config_path: Path) -> list[list[Any]]:
    """The config's instances grouped by the server file they run (instances of one class share one import)."""
    from gymfleet.fleet.launch import load_config

    groups: dict[Path, list[Any]] = {}
    for instance in load_config(config_path, []).instances.values():
        groups.setdefault(instance.dir / (instance.entrypoint or "app.py"), []).append(instance)
    return list(groups.values())


def preload(groups: list[list[Any]], claims: int | None = None) -> list[str]:
    """Import each group's server class and run its `Server.preload()` (data its servers share, loaded once);
    returns the instances imported here.

    With `claims` (the read end of a pipe holding each group's index as 4 bytes), only the groups this process
    claims by reading their index: the zygote and its helper share the imports that way, each taking the next
    group as soon as it is free. A failed import is logged, not raised: that instance's child imports it again and
    fails with its own error.
    """
    from gymfleet.fleet.launch import load_server_class

    loaded: list[str] = []
    for group in _claimed(groups, claims):
        names = [instance.name for instance in group]
        started = time.monotonic()
        try:
            load_server_class(group[0]).preload()  # shared read-only data, loaded once before the forks
            loaded += names
            log.debug("zygote (pid %s): imported %s in %.2fs", os.getpid(), ", ".join(names),
                      time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - reported by the instance's own child, with its YAML path
            log.warning("zygote: could not import %s's server (%s); its server will import it itself",
                        ", ".join(names), exc)
    return loaded


def _claimed(groups: list[list[Any]], claims: int | None) -> Iterator[list[Any]]:
    if claims is None:
        yield from groups
        return
    while len(data := os.read(claims, 4)) == 4:  # one pipe read of 4 bytes is atomic: a group goes to one reader
        yield groups[int.from_bytes(data, "little")]


def _claims_pipe(count: int) -> int:
    """A pipe holding 0 .. count-1 as 4 bytes each, its write end closed (EOF once all are claimed)."""
    read_fd, write_fd = os.pipe()
    with os.fdopen(write_fd, "wb") as writer:  # count is a few dozen at most: well within the pipe's buffer
        writer.write(b"".join(index.to_bytes(4, "little") for index in range(count)))
    return read_fd


def _python_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Pre-import a fleet's servers and fork them on request.")
    parser.add_argument("--config", type=Path,
                        help="the fleet's resolved config (JSON); without it, the path comes as the first message")
    parser.add_argument("--control-fd", required=True, type=int, help="this end of the supervisor's socket pair")
    parser.add_argument("--parent-pid", required=True, type=int, help="the supervisor: exit when it does")
    parser.add_argument("--room", help=argparse.SUPPRESS)  # CMDLINE_ROOM
    args = parser.parse_args(argv)
    set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote", "--control-fd", str(args.control_fd), "--parent-pid",
                 str(args.parent_pid), *(["--config", str(args.config)] if args.config else [])])
    logging.basicConfig(level=os.environ.get("GYMFLEET_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    control = socket.socket(fileno=args.control_fd)
    supervisor = _open_pidfd(args.parent_pid)
    if os.getppid() != args.parent_pid:  # checked after opening the pidfd: it is the supervisor's, not a reuse
        sys.exit(f"zygote: supervisor {args.parent_pid} is gone; not starting")
    started = time.monotonic()
    import_shared()
    shared_s = time.monotonic() - started
    if args.config is None:  # started before the supervisor had its config (`Zygote(None)`, then `adopt()`)
        message, _ = _receive(control)
        if message is None:
            return  # the supervisor did not need us after all (a dry run, Ray placement, `server_start: spawn`)
        args.config = Path(message["path"])
    groups = server_groups(args.config)  # read first: the file goes when the fleet stops
    helper = _Helper.start(groups, supervisor, args) if len(groups) > 1 and _cpus() > 1 else None
    preload(groups, helper.claims if helper else None)  # what the helper does not import; the zygote forks it
    threads = _python_threads()
    if helper:
        os.close(helper.claims)
        threads += helper.wait_loaded()
    log.debug("zygote: shared stack imported in %.2fs, %d servers' in %.2fs (%s)", shared_s, len(groups),
              time.monotonic() - started - shared_s, f"helper {helper.pid}: {sorted(helper.owns)}" if helper else
              "no helper")
    if threads:
        sys.exit(f"zygote: imports started threads {threads}; forking now is unsafe, so not serving")
    wake = _wakeup_pipe()
    _send(control, {"op": "ready", "pid": os.getpid()})
    gc.collect()
    gc.freeze()  # the imported objects move out of the collector's reach: children never copy their pages for it
    _Loop(control, supervisor, args, wake, helper=helper).run()


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _wakeup_pipe() -> tuple[int, int]:
    """Route SIGCHLD to a pipe the loop selects on."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so SIGCHLD writes to the wakeup fd
    return wake_r, wake_w


class _Helper:
    """The zygote's one helper: a fork of it taken right after the shared stack, which imports half the servers
    (whichever groups it claims first) while the zygote imports the rest, then forks the servers it imported.

    On this 2-core machine two importers halve the longest part of start-up (reasoning_gym and the instruction
    checker's models load side by side). Each server is forked by whichever of the two imported its class, so
    neither imports after a server shares its pages (see the module docstring). The zygote relays: the supervisor
    only ever talks to the zygote, which forwards `spawn` (and its half of `validate`) to the helper and passes the
    helper's `spawned` and `exit` messages on. The helper exits with the zygote; the zygote exits (and so is
    replaced) if the helper dies.
    """

    def __init__(self, pid: int, sock: socket.socket, claims: int):
        self.pid, self.sock, self.claims = pid, sock, claims
        self.owns: set[str] = set()
        """The instances whose class the helper imported: it forks their servers."""

    @classmethod
    def start(cls, groups: list[list[Any]], supervisor: int | None, args: argparse.Namespace) -> _Helper | None:
        if _python_threads():
            return None  # forking now is unsafe; main() refuses to serve anyway
        claims = _claims_pipe(len(groups))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        gc.collect()
        gc.freeze()  # the shared stack: the helper's collector leaves its pages shared
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            ours.close()
            code = 1
            try:
                code = cls._serve(groups, claims, theirs, supervisor, args)
            except BaseException:  # noqa: BLE001 - a forked helper must never return into the zygote's code
                traceback.print_exc()
            finally:
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os._exit(code)
        theirs.close()
        return cls(pid, ours, claims)

    @staticmethod
    def _serve(groups: list[list[Any]], claims: int, sock: socket.socket, supervisor: int | None,
               args: argparse.Namespace) -> int:
        """The helper's whole life: import what it claims, say so, then fork servers until the zygote goes."""
        zygote = os.getppid()
        set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote", "--helper-of", str(zygote)])
        os.close(args.control_fd)  # the supervisor's socket is the zygote's alone
        loaded = preload(groups, claims)
        os.close(claims)
        threads = _python_threads()
        try:
            _send(sock, {"op": "loaded", "instances": loaded, "threads": threads})
        except OSError:
            return 1  # the zygote is gone (closed before it was ready)
        if threads:
            return 1
        wake = _wakeup_pipe()
        gc.collect()
        gc.freeze()
        _Loop(sock, supervisor, args, wake, parent_pid=zygote).run()
        return 0

    def wait_loaded(self) -> list[str]:
        """Wait for the helper's imports; the threads they started (forking is unsafe if any)."""
        if not select.select([self.sock], [], [], READY_TIMEOUT_S)[0]:
            sys.exit(f"zygote: its helper (pid {self.pid}) did not import its servers within {READY_TIMEOUT_S:g}s")
        message, _ = _receive(self.sock)
        if message is None:
            sys.exit(f"zygote: its helper (pid {self.pid}) died importing its servers")
        self.owns = set(message["instances"])
        return [f"{name} (helper)" for name in message["threads"]]

    def forward(self, message: dict[str, Any], fd: int) -> None:
        """Have the helper fork for `message`; its answer comes on its socket, which the zygote's loop relays.

        Raises:
            ZygoteError: the helper is gone.
        """
        try:
            _send(self.sock, message, [fd])
        except OSError as exc:
            raise ZygoteError(f"the zygote's helper (pid {self.pid}) cannot be reached: {exc}") from None


class _Loop:
    """The zygote's (or its helper's) single thread: fork on request, reap children and report their exits.

    `control` is the socket requests come on and answers go to: the supervisor's for the zygote, the zygote's for
    its helper. `parent_pid` is the process whose exit ends the loop when no pidfd watches the supervisor.
    """

    def __init__(self, control: socket.socket, supervisor: int | None, args: argparse.Namespace,
                 wake: tuple[int, int], *, helper: _Helper | None = None, parent_pid: int | None = None):
        self.control, self.supervisor, self.args, self.wake = control, supervisor, args, wake
        self.helper = helper
        self.parent_pid = args.parent_pid if parent_pid is None else parent_pid

    def run(self) -> None:
        watched = [self.control, self.wake[0], *([self.supervisor] if self.supervisor is not None else []),
                   *([self.helper.sock] if self.helper else [])]
        while True:
            readable = select.select(watched, [], [], None if self.supervisor is not None else 0.5)[0]
            if self.wake[0] in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake[0], 4096)
            if not self._reap():
                return
            if self.supervisor in readable or (self.supervisor is None and os.getppid() != self.parent_pid):
                log.info("zygote: supervisor %s is gone; exiting (its servers stop themselves)", self.args.parent_pid)
                return
            if self.helper and self.helper.sock in readable:
                message, _ = _receive(self.helper.sock)
                if message is None:
                    log.error("zygote: its helper (pid %s) is gone; exiting", self.helper.pid)
                    return
                if message.get("id", 0) >= 0:  # negative: its half of a validation, answered on the pipe
                    self._tell(message)  # a server it forked (`spawned`) or one that exited (`exit`)
            if self.control in readable:
                message, fds = _receive(self.control)
                if message is None:
                    return  # the supervisor (or, for a helper, the zygote) closed the socket: the fleet stops
                try:
                    self._handle(message, fds)
                except ZygoteError as exc:
                    log.error("zygote: %s; exiting", exc)
                    return

    def _tell(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the supervisor may be gone already
            _send(self.control, message)

    def _reap(self) -> bool:
        """Report every child that exited; False when the helper did (this zygote then exits, to be replaced)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            if self.helper and pid == self.helper.pid:
                log.error("zygote: its helper (pid %s) exited with code %s; exiting", pid,
                          os.waitstatus_to_exitcode(status))
                return False
            self._tell({"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        [fd] = fds
        helper = self.helper
        if helper and message["op"] == "spawn" and message["instance"] in helper.owns:
            try:
                helper.forward(message, fd)  # the helper answers `spawned` itself, relayed by the loop
            finally:
                os.close(fd)
            return
        if helper and message["op"] == "validate":  # each validates the servers it imported, on one pipe
            theirs = os.dup(fd)
            try:
                helper.forward({**message, "id": -message["id"], "only": sorted(helper.owns)}, theirs)
            finally:
                os.close(theirs)
            message = {**message, "skip": sorted(helper.owns)}
        pid = self._fork(message, fd)
        self._tell({"op": "spawned", "id": message["id"], "pid": pid, "parts": 2 if helper else 1})

    def _fork(self, message: dict[str, Any], fd: int) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the zygote's buffered lines again
        pid = os.fork()
        if pid == 0:
            self._child(message, fd)  # never returns
        os.close(fd)
        return pid

    def _child(self, message: dict[str, Any], fd: int) -> None:
        code: Any = 1
        try:
            self._become_child(message, fd)
            if message["op"] == "validate":
                code = _validate_child(self.args.config, message["secrets"], fd, message.get("only"),
                                       message.get("skip", ()))
            else:
                from gymfleet.fleet.launch import serve_supervised

                secrets = [(list(path), value) for path, value in message["secrets"]]
                serve_supervised(self.args.config, message["instance"], secrets, parent_pid=self.args.parent_pid,
                                 workdir=self.args.config.parent, supervisor_pidfd=self.supervisor)
                code = 0
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001 - a forked child must never return into the zygote's loop
            traceback.print_exc()
            code = 1
        finally:
            if isinstance(code, str):  # sys.exit("message"), as the interpreter reports it
                print(code, file=sys.stderr)
                code = 1
            code = 0 if code is None else code
            with contextlib.suppress(Exception):
                import atexit

                atexit._run_exitfuncs()  # as the interpreter would at exit (logging's flush among them)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code if isinstance(code, int) else 1)

    def _become_child(self, message: dict[str, Any], fd: int) -> None:
        """Undo what the child must not inherit from the zygote (see the module docstring)."""
        os.setsid()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL if signum != signal.SIGPIPE else signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.control.close()
        if self.helper:
            self.helper.sock.close()
        for end in self.wake:
            os.close(end)
        if message["op"] == "spawn":
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            sys.stdout.reconfigure(line_buffering=True)
        name = message.get("instance", "validate")
        set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote", "--instance", name, "--forked-by", str(os.getppid())])
        os.environ.clear()
        os.environ.update(message["env"])
        import random

        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        root = logging.getLogger()
        for handler in root.handlers[:]:
            root.removeHandler(handler)


def set_cmdline(words: list[str]) -> bool:
    """Rewrite this process's command line as `ps` and `/proc/<pid>/cmdline` show it; whether it could.

    A forked server would otherwise show the zygote's command line, all alike; this names its instance. The new
    line is written over the old one in place (the kernel's `arg_start`..`arg_end`), cut to fit, blank-padded.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        arg_start, arg_end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5); fields[0] is the 3rd
        current = Path("/proc/self/cmdline").read_bytes()
    except (OSError, IndexError, ValueError):
        return False
    room = arg_end - arg_start
    if room <= 0 or len(current) != room:  # not the layout this expects: leave it alone
        return False
    import ctypes

    if ctypes.string_at(arg_start, room) != current:
        return False
    data = b"\0".join(word.encode() for word in words)[: room - 2] + b"\0"
    data = data.ljust(room - 1, b" ") + b"\0"  # the rest: one blank word (NULs would read as many empty ones)
    ctypes.memmove(arg_start, data, room)
    return True


def _validate_child(config_path: Path, secrets: list, fd: int, only: list[str] | None = None,
                    skip: Iterable[str] = ()) -> int:
    """Build the config's servers (what `Fleet.validate` does: all, or those in `only`, less those in `skip`) and
    write the verdict to `fd` as one JSON line (the zygote and its helper may share the pipe)."""
    from gymfleet.fleet.launch import build_server, load_config

    try:
        config = load_config(config_path, [(list(path), value) for path, value in secrets])
        for instance in config.instances.values():
            if (only is None or instance.name in only) and instance.name not in skip:
                build_server(instance, config)
        result: dict[str, Any] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - the supervisor validates again itself, raising the real error
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}  # one atomic pipe write
    line = (json.dumps(result) + "\n").encode()
    os.write(fd, line)
    os.close(fd)
    return 0


if __name__ == "__main__":
    main()
