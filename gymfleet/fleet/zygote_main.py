"""The zygote process, `python -m gymfleet.fleet.zygote_main` (started by `gymfleet.fleet.zygote.Zygote`): it imports
the shared stack and every instance's server class once, then forks one server per request from its single-threaded
loop, reaps them and reports their exits (the messages and the reasons are in `gymfleet.fleet.zygote`; what each
forked child does before it serves is `gymfleet.fleet.zygote_child`).

Two things shorten the path to the first fork. `ng_run` starts its zygote before it parses the config (`Zygote(None)`,
adopted by the fleet with `adopt()`), so the shared stack imports while the supervisor imports its own stack and
reads the YAML. And on a machine with 2+ CPUs the zygote forks one helper right after the shared stack: the two
claim the config's server classes one at a time from a shared pipe and import them side by side (reasoning_gym and
instruction_following's models, the two slowest, load in parallel). Each server is then forked by whichever of the
two imported its class, so neither imports anything after its first server shares its pages. The classes are claimed
slowest first, as the last start measured them (`IMPORT_TIMES`, in gymfleet's cache folder; config order the first
time): two slow imports started last would each leave the other process idle at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gymfleet.fleet.cache import cache_dir
from gymfleet.fleet.lean_imports import gc_paused, import_fastapi
from gymfleet.fleet.zygote import READY_TIMEOUT_S, ZygoteError, _open_pidfd, _receive, _send
from gymfleet.fleet.zygote_child import run_child, set_cmdline

__all__ = ["FOLDER_MODULES", "SHARED_MODULES", "gc_paused", "main", "preload"]

log = logging.getLogger(__name__)


SHARED_MODULES = (
    "asyncio", "json", "multiprocessing.spawn", "pydantic", "fastapi", "starlette.applications", "aiohttp",
    "uvicorn", "uvicorn.config", "uvicorn.server", "uvicorn.lifespan.on", "uvicorn.loops.auto",
    "uvicorn.loops.uvloop", "uvicorn.protocols.http.auto", "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.http.h11_impl", "uvicorn.protocols.websockets.auto", "gymfleet.serving.server", "gymfleet.http",
    "gymfleet.fleet.launch", "gymfleet.serving.accept_gate", "gymfleet.serving.resources", "gymfleet.serving.agent",
    "gymfleet.serving.model", "gymfleet.grading.judge", "gymfleet.grading.sandbox_client",
)  # fmt: skip
"""Imported first, whatever the config: what every server imports (uvicorn's `auto` modules load at serve time;
the resources, agent and model bases bring the `openai` types). Imported once, before the helper forks: what the
zygote and its helper both import after that is held twice."""


def import_shared(names: tuple[str, ...] = SHARED_MODULES) -> None:
    """Import what every server imports, whatever the config (`SHARED_MODULES`), or the modules `names` (FastAPI's
    own models built on first use: `gymfleet.fleet.lean_imports.import_fastapi`)."""
    if "fastapi" in names:
        import_fastapi()
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:  # optional accelerators (uvloop, httptools, websockets) may be missing
            pass


FOLDER_MODULES = (
    "nemo_gym.base_resources_server", "nemo_gym.server_utils", "nemo_gym.openai_utils", "nemo_gym.config_types",
    "nemo_gym.reward_profile", "gymfleet.serving.nemo_gym_server", "httpx", "pydantic.v1",
)  # fmt: skip
"""Imported when the config serves NeMo-Gym folders of another tree (`gymfleet.fleet.folders`): the `nemo_gym`
surface such folders import (about 2 s of imports each, measured on this machine), shared by their servers, with
what each such server imports once built (`httpx`, whose hook sends the fleet token from a folder's own clients,
and with it `rich` and `pygments`; `pydantic.v1`, which FastAPI imports when it builds the folder's routes): 116
modules and about 20 MiB of private memory per server when left to the fork. The folders themselves are never
imported here (one process holds one tree's `resources_servers`): each forked server enters its folder's tree and
imports its `app.py` after the fork."""


def server_groups(config_path: Path) -> tuple[list[list[Any]], bool]:
    """The config's instances grouped by the server file they run (instances of one class share one import), not
    those served from a folder of another tree (each imports its folder after its fork); and whether there are
    such folders."""
    from gymfleet.fleet.launch import load_config

    groups: dict[Path, list[Any]] = {}
    folders = False
    for instance in load_config(config_path, []).instances.values():
        if instance.folder is not None:
            folders = True
            continue
        groups.setdefault(instance.dir / (instance.entrypoint or "app.py"), []).append(instance)
    return list(groups.values()), folders


def preload(groups: list[list[Any]], claims: int | None = None,
            seconds: dict[str, float] | None = None) -> list[str]:
    """Import each group's server class and run its `Server.preload()` (data its servers share, loaded once);
    returns the instances imported here, and records in `seconds` how long each group's import took (by
    `group_key`).

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
            if seconds is not None:
                seconds[group_key(group)] = time.monotonic() - started
            log.debug("zygote (pid %s): imported %s in %.2fs", os.getpid(), ", ".join(names),
                      time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - reported by the instance's own child, with its YAML path
            log.warning("zygote: could not import %s's server (%s); its server will import it itself",
                        ", ".join(names), exc)
    return loaded


IMPORT_TIMES = "zygote-import-seconds.json"
"""File in gymfleet's cache folder (`gymfleet.fleet.cache.cache_dir`): each server file's import time, as the last
zygote to import it measured it (`{path: seconds}`)."""


def group_key(group: list[Any]) -> str:
    """The server file a group of instances runs (what `IMPORT_TIMES` is keyed by)."""
    return str(group[0].dir / (group[0].entrypoint or "app.py"))


def slowest_first(groups: list[list[Any]], seconds: dict[str, float]) -> list[list[Any]]:
    """`groups` by their last import time, longest first; groups never timed keep their order, after the timed ones
    (`sorted` is stable)."""
    return sorted(groups, key=lambda group: -seconds.get(group_key(group), 0.0))


def read_import_times() -> dict[str, float]:
    """The import times the last zygote recorded (none when the file is missing or unreadable: config order)."""
    try:
        data = json.loads((cache_dir() / IMPORT_TIMES).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(key): float(value) for key, value in data.items() if isinstance(value, int | float)}


def write_import_times(seconds: dict[str, float]) -> None:
    """Merge `seconds` into `IMPORT_TIMES` (best effort: a read-only cache only costs the ordering)."""
    if not seconds:
        return
    path = cache_dir() / IMPORT_TIMES
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps({**read_import_times(), **seconds}, indent=1, sort_keys=True))
        os.replace(temporary, path)
    except OSError as exc:
        log.debug("zygote: could not record import times in %s: %s", path, exc)


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
    set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote_main", "--control-fd", str(args.control_fd),
                 "--parent-pid", str(args.parent_pid), *(["--config", str(args.config)] if args.config else [])])
    logging.basicConfig(level=os.environ.get("GYMFLEET_LOG_LEVEL", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    control = socket.socket(fileno=args.control_fd)
    supervisor = _open_pidfd(args.parent_pid)
    if os.getppid() != args.parent_pid:  # checked after opening the pidfd: it is the supervisor's, not a reuse
        sys.exit(f"zygote: supervisor {args.parent_pid} is gone; not starting")
    started = time.monotonic()
    with gc_paused():
        import_shared()
    shared_s = time.monotonic() - started
    if args.config is None:  # started before the supervisor had its config (`Zygote(None)`, then `adopt()`)
        message, _ = _receive(control)
        if message is None:
            return  # the supervisor did not need us after all (a dry run, Ray placement, `server_start: spawn`)
        args.config = Path(message["path"])
    groups, folders = server_groups(args.config)
    groups = slowest_first(groups, read_import_times())  # the file goes when the fleet stops
    helper = _Helper.start(groups, supervisor, args) if len(groups) > 1 and _cpus() > 1 else None
    seconds: dict[str, float] = {}
    with gc_paused():
        if folders:  # the zygote forks the folders' servers: the surface they share, while the helper imports
            import_shared(FOLDER_MODULES)
        preload(groups, helper.claims if helper else None, seconds)  # what the helper leaves; the zygote forks it
    threads = _python_threads()
    if helper:
        os.close(helper.claims)
        threads += helper.wait_loaded()
        seconds.update(helper.seconds)
    write_import_times(seconds)
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
        self.seconds: dict[str, float] = {}
        """How long each of its imports took (`preload`'s `seconds`)."""

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
        set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote_main", "--helper-of", str(zygote)])
        os.close(args.control_fd)  # the supervisor's socket is the zygote's alone
        seconds: dict[str, float] = {}
        with gc_paused():
            loaded = preload(groups, claims, seconds)
        os.close(claims)
        threads = _python_threads()
        try:
            _send(sock, {"op": "loaded", "instances": loaded, "threads": threads, "seconds": seconds})
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
        self.seconds = dict(message.get("seconds") or {})
        return [f"{name} (helper)" for name in message["threads"]]

    def forward(self, message: dict[str, Any], fd: int, *more_fds: int) -> None:
        """Have the helper fork for `message`; its answer comes on its socket, which the zygote's loop relays.

        Raises:
            ZygoteError: the helper is gone.
        """
        try:
            _send(self.sock, message, [fd, *more_fds])
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
        fd, *listen = fds  # a spawn comes with the server's bound socket
        helper = self.helper
        if helper and message["op"] == "spawn" and message["instance"] in helper.owns:
            try:
                helper.forward(message, fd, *listen)  # the helper answers `spawned` itself, relayed by the loop
            finally:
                for each in (fd, *listen):
                    os.close(each)
            return
        if helper and message["op"] == "validate":  # each validates the servers it imported, on one pipe
            theirs = os.dup(fd)
            try:
                helper.forward({**message, "id": -message["id"], "only": sorted(helper.owns)}, theirs)
            finally:
                os.close(theirs)
            message = {**message, "skip": sorted(helper.owns)}
        try:
            pid = self._fork(message, fd, listen[0] if listen else None)
        finally:
            for each in listen:
                os.close(each)
        self._tell({"op": "spawned", "id": message["id"], "pid": pid, "parts": 2 if helper else 1})

    def _fork(self, message: dict[str, Any], fd: int, listen_fd: int | None = None) -> int:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the zygote's buffered lines again
        pid = os.fork()
        if pid == 0:
            inherited = [self.control, *([self.helper.sock] if self.helper else [])]
            run_child(message, fd, self.args, self.supervisor, inherited, self.wake, listen_fd)  # never returns
        os.close(fd)
        return pid


if __name__ == "__main__":
    main()
