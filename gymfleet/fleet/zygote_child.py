"""A server forked by the zygote (`gymfleet.fleet.zygote_main`): what it sheds from the zygote before it serves,
and the throwaway children that validate the config's servers for the supervisor.

Each child starts its own session (process group), takes the pipe as stdout and stderr and /dev/null as stdin, gets
the supervisor's environment of the moment (`env`), its secrets and fleet token in memory (never on disk, argv or even
its environment: the token comes in `env` over the private socket and moves to `gymfleet.auth.hold`), a fresh random
seed (`random`, and `numpy.random` if imported), default signal handlers and fresh logging handlers; no event loop,
aiohttp session or thread exists in the zygote to inherit. It then serves exactly as `python -m gymfleet.fleet.launch`
does (`gymfleet.fleet.launch.serve_supervised`), `num_workers`, `EXIT_PORT_IN_USE` and all, and dies with the
supervisor: it watches the supervisor's pidfd, which the zygote opened, so a child outlives its zygote but never its
supervisor. The zygote exits when the supervisor closes the socket or dies; its children keep serving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["become_child", "exit_as_the_interpreter", "run_child", "set_cmdline"]


def run_child(message: dict[str, Any], fd: int, args: argparse.Namespace, supervisor: int | None,
              inherited: list[socket.socket], wake: tuple[int, int], listen_fd: int | None = None) -> None:
    """The forked child's whole life (never returns): become a server (or a validation) of its own, serve (on the
    bound socket `listen_fd`, the supervisor's for it), exit.

    `inherited` are the zygote's sockets (its control socket, its helper's) and `wake` its SIGCHLD pipe: closed here.
    """
    code: Any = 1
    try:
        become_child(message, fd, inherited, wake)
        if message["op"] == "validate":
            code = _validate_child(args.config, message["secrets"], fd, message.get("only"),
                                   message.get("skip", ()))
        else:
            from gymfleet.fleet.launch import serve_supervised

            secrets = [(list(path), value) for path, value in message["secrets"]]
            serve_supervised(args.config, message["instance"], secrets, parent_pid=args.parent_pid,
                             workdir=args.config.parent, supervisor_pidfd=supervisor, listen_fd=listen_fd)
            code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - a forked child must never return into the zygote's loop
        traceback.print_exc()
        code = 1
    finally:
        exit_as_the_interpreter(code)


def exit_as_the_interpreter(code: Any) -> NoReturn:
    """End a forked child with `code` (a `SystemExit` code) as the interpreter would end: a string is printed and
    exits 1, None exits 0, `atexit` handlers run (logging's flush among them), output is flushed; then `os._exit`,
    never back into the parent's code."""
    if isinstance(code, str):  # sys.exit("message"), as the interpreter reports it
        print(code, file=sys.stderr)
        code = 1
    code = 0 if code is None else code
    with contextlib.suppress(Exception):
        import atexit

        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else 1)


def become_child(message: dict[str, Any], fd: int, inherited: list[socket.socket], wake: tuple[int, int]) -> None:
    """Undo what the child must not inherit from the zygote (see the module docstring)."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL if signum != signal.SIGPIPE else signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sock in inherited:
        sock.close()
    for end in wake:
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
    set_cmdline([sys.executable, "-m", "gymfleet.fleet.zygote_main", "--instance", name, "--forked-by",
                 str(os.getppid())])
    os.environ.clear()
    os.environ.update(message["env"])
    from gymfleet import auth

    auth.hold_from_environ()  # the fleet token, in memory only: nothing this server starts inherits it
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
            if (only is None or instance.name in only) and instance.name not in skip and instance.folder is None:
                build_server(instance, config)  # a folder of another tree validates in its own interpreter
        result: dict[str, Any] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - the supervisor validates again itself, raising the real error
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}  # one atomic pipe write
    line = (json.dumps(result) + "\n").encode()
    os.write(fd, line)
    os.close(fd)
    return 0
