"""A command's `main` in a fresh process forked from one that has imported it already (`CommandForks`), for tests
that start the same command many times: `tests/test_shipped_configs.py` starts `ng_run` once per shipped config.

A fresh `python -m gymfleet.cli.run` spends about 1.3 CPU s importing the config stack, the fleet and the head
server's FastAPI before it reads its first argument; 41 starts, a minute of CPU. Here one process imports the
command's module and what it imports lazily (`preload`) once, and forks one child per start. The child is then what
`python -m <module> <argv>` would be from the command's `main` on: its own session (as `start_new_session=True`),
the given folder, environment, argv and output file (stdout and stderr, stdin from /dev/null), default signal
handlers, and an exit code as the interpreter would give it (`SystemExit`'s code; an escaping exception prints its
traceback and exits 1; `atexit` handlers run). Its own children (`ng_run`'s zygote, the servers) start as usual.

Tests that are about the command line as a user types it (the console script, interpreter start-up included) keep
a real subprocess: this is for tests that start a command many times to check what it does with its input.

The fork server forks only while it is single-threaded (it refuses to start otherwise), and talks to the test over
a socket pair (one JSON message per packet): `{"op": "ready"}` once imported; `{"op": "start", "id", "module",
"argv", "cwd", "env", "output"}` answered `{"op": "started", "id", "pid"}`; `{"op": "exit", "pid", "code"}` when it
reaps a child (`code` as `subprocess.Popen.returncode`). It exits when the test's side of the socket closes, after
killing what it started that still runs.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

READY_TIMEOUT_S = 120.0
MAX_MESSAGE_BYTES = 1 << 20


class ForkedCommand:
    """One forked command, with the parts of `subprocess.Popen` tests use: `pid`, `poll()`, `wait()`,
    `send_signal()`, `returncode`. Its process group is its pid, as with `start_new_session=True`."""

    def __init__(self, pid: int, forks: CommandForks):
        self.pid = pid
        self.returncode: int | None = None
        self._forks = forks

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._forks.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"<forked {self.pid}>", timeout)
            self._forks.wait_for_exit(0.1)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class CommandForks:
    """The test's handle on one fork server that has imported `preload` (module names).

    Raises:
        RuntimeError: the fork server died or did not get ready (its output is in the message).
    """

    def __init__(self, preload: list[str]):
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno()), *preload], pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True)
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        self._next_id = 0
        ready, _, _ = select.select([self._control], [], [], READY_TIMEOUT_S)
        message = json.loads(self._control.recv(MAX_MESSAGE_BYTES) or b"null") if ready else None
        if not message or message.get("op") != "ready":
            self.process.kill()
            raise RuntimeError(f"the fork server did not get ready:\n{self.process.communicate()[0]}")

    def start(self, module: str, argv: list[str], *, cwd: str | os.PathLike[str], output: str | os.PathLike[str],
              env: dict[str, str] | None = None) -> ForkedCommand:
        """`python -m <module> <argv>` in `cwd` with `env` (default: this process's), output to the file `output`,
        forked; `module`'s `main(argv)` runs."""
        self._next_id += 1
        request = {"op": "start", "id": self._next_id, "module": module, "argv": argv, "cwd": str(cwd),
                   "env": dict(os.environ if env is None else env), "output": str(output)}
        with self._changed:  # one reader of the socket at a time: the answer may come after exits
            self._control.send(json.dumps(request).encode())
            while True:
                message = self._receive(timeout=READY_TIMEOUT_S)
                if message.get("op") == "started" and message["id"] == self._next_id:
                    return ForkedCommand(message["pid"], self)

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            while select.select([self._control], [], [], 0)[0]:
                self._receive(timeout=0)
            return self._exits.get(pid)

    def wait_for_exit(self, timeout: float) -> None:
        with self._changed:
            if select.select([self._control], [], [], timeout)[0]:
                self._receive(timeout=0)

    def _receive(self, timeout: float) -> dict[str, Any]:
        if not select.select([self._control], [], [], timeout)[0]:
            raise RuntimeError("the fork server did not answer")
        data = self._control.recv(MAX_MESSAGE_BYTES)
        if not data:
            raise RuntimeError(f"the fork server exited {self.process.wait()}:\n{self.process.stdout.read()}")
        message = json.loads(data)
        if message.get("op") == "exit":
            self._exits[message["pid"]] = message["code"]
        return message

    def close(self) -> None:
        self._control.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


# ------------------------------------------------------------------------------------------ the fork server


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _child(control: socket.socket, request: dict[str, Any]) -> None:
    """The forked command's whole life: never returns."""
    from gymfleet.fleet.zygote_child import exit_as_the_interpreter  # the checkout is on sys.path by now

    code: Any = 1
    try:
        control.close()
        os.setsid()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        output = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.close(stdin)
        sys.argv = [request["module"], *request["argv"]]
        importlib.import_module(request["module"]).main(request["argv"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - the child must exit here, never return into the server's loop
        traceback.print_exc()
        code = 1
    finally:
        exit_as_the_interpreter(code)


def _serve(control: socket.socket, preload: list[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise SystemExit(f"importing {preload} started a thread: a fork server must stay single-threaded")
    gc.freeze()  # the children share the imported objects' pages instead of copying them as the collector runs
    control.send(json.dumps({"op": "ready"}).encode())
    children: set[int] = set()
    try:
        while True:
            if select.select([control], [], [], 0.05)[0]:
                data = control.recv(MAX_MESSAGE_BYTES)
                if not data:
                    return
                request = json.loads(data)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(control, request)
                children.add(pid)
                control.send(json.dumps({"op": "started", "id": request["id"], "pid": pid}).encode())
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.discard(pid)
                    control.send(json.dumps({"op": "exit", "pid": pid, "code": _returncode(status)}).encode())
    finally:
        for pid in children:  # the test is gone: so is what it started
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout, not tests/
    _serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2:])
