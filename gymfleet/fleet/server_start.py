"""How a fleet starts its server processes (the `Fleet` of `gymfleet.fleet.supervisor` is made of this and
`gymfleet.fleet.readiness`), and where their output goes.

How the fleet starts each server process is `server_start`: `zygote` (the default) forks it from one pre-imported
parent, `python -m gymfleet.fleet.zygote_main`, started as a fresh interpreter once per fleet (safe whichever thread
calls `start()`), which imports the shared stack and every instance's `app.py` once: the fleet is ready
in seconds and its servers share those pages copy-on-write (see `gymfleet.fleet.zygote`). `spawn` starts each server as
a fresh interpreter, `python -m gymfleet.fleet.launch`, importing everything again. Any other value is a `ConfigError`
naming the key and the choices. A zygote that dies is said so once; the servers it forked keep serving; a new one
is started (at most `ZYGOTE_RESTARTS` times, and only for one that had got ready), else servers are started as
fresh interpreters from then on.

Each server's output is copied line by line to the fleet's output, prefixed `(<instance>) `, or to its log file under
`nemo_gym_log_dir`, and its last lines are kept for crash reports.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from gymfleet.errors import ConfigError
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.fleet.credential import owner_only, private_folder
from gymfleet.fleet.launch import credentials_env, credentials_fd, instance_python, own_secrets
from gymfleet.fleet.ports import LISTEN_FD_ENV
from gymfleet.fleet.readiness import _Child
from gymfleet.fleet.zygote import READY_TIMEOUT_S as ZYGOTE_READY_TIMEOUT_S
from gymfleet.fleet.zygote import ForkedProcess, Zygote, ZygoteError

__all__ = ["SERVER_START_CHOICES", "ServerStart"]

SERVER_START_CHOICES = ("zygote", "spawn")
"""`server_start`: fork each server from the pre-imported zygote (default), or start a fresh interpreter each."""
ZYGOTE_RESTARTS = 3
"""Zygotes started again after one dies, per fleet; past that, servers start as fresh interpreters."""


class ServerStart:
    """The start strategy of `Fleet`: the zygote it forks servers from (replaced when it dies), fresh interpreters
    otherwise, and the copying of each server's output."""

    def _start_zygote(self) -> None:
        """Start a zygote (`gymfleet.fleet.zygote`): a fresh interpreter that imports every server once, then forks
        them."""
        self._zygote_starts += 1
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None:
            self._zygote = prestarted
            if prestarted.adopt(self._config_path, output=self._zygote_output, on_death=self._zygote_died):
                return
            prestarted.close()
        self._zygote = Zygote(self._config_path, output=self._zygote_output, on_death=self._zygote_died)

    def _zygote_output(self, line: str) -> None:
        if self.log_dir:
            private_folder(self.log_dir)
            with open(self.log_dir / "zygote.log", "a", opener=owner_only) as sink:
                sink.write(line + "\n")
        else:
            self._say(f"(zygote) {line}")

    def _validate_in_zygote(self) -> None:
        """Validate every server in a child of the zygote (no second import of everything here); on any doubt,
        `validate()` here, which raises the real error. A zygote that cannot serve leaves fresh interpreters."""
        zygote = self._zygote
        if zygote is None:  # it died while importing (its reader thread said so already)
            self.validate()
            return
        try:
            error = zygote.validate(json.loads(self._secrets_env), dict(os.environ))
        except ZygoteError as exc:
            self._zygote_lost(zygote, str(exc))
            self.validate()
            return
        if error is not None:
            self.validate()  # raises the error, typed and with its YAML path
            self._zygote_lost(zygote, f"failed to build a server where this process did not: {error}", restart=False)

    def _zygote_died(self, zygote: Zygote) -> None:
        """The zygote exited on its own (its reader thread calls this)."""
        self._zygote_lost(zygote, f"(pid {zygote.pid}) {zygote.death_text()}")

    def _zygote_lost(self, zygote: Zygote, why: str, restart: bool = True) -> None:
        """Replace a zygote that died or failed: start another (at most `ZYGOTE_RESTARTS` times, and only if it
        had served), else start servers as fresh interpreters from now on. Says so once, either way."""
        with self._zygote_lock:
            if self._zygote is not zygote or self._stopping:
                return
            zygote.close()
            # One that died while importing would die again: no restart for it.
            if restart and zygote.was_ready and self._zygote_starts <= ZYGOTE_RESTARTS:
                self._start_zygote()
                then = (f"starting a new one ({self._zygote_starts - 1}/{ZYGOTE_RESTARTS}); running servers keep "
                        "serving")
            else:
                self._zygote = None
                then = "servers start as fresh interpreters from now on (as with server_start=spawn)"
                if self.children:
                    then += "; running servers keep serving"
            self._say(f"the zygote {why}; {then}")

    def _zygote_starting(self) -> bool:
        """Whether a (re)started zygote is still importing: a restart waits for it rather than paying twice."""
        zygote = self._zygote
        if zygote is None or zygote.ready or not zygote.alive:
            return False
        if time.monotonic() - zygote.started_at > ZYGOTE_READY_TIMEOUT_S:
            self._zygote_lost(zygote, f"(pid {zygote.pid}) was not ready within {ZYGOTE_READY_TIMEOUT_S:g}s")
            return False
        return True

    def log_target(self, name: str) -> str:
        """Where the output of server `name` goes: its log file under `nemo_gym_log_dir`, or this output."""
        if self.log_dir:
            return str(self.log_dir / f"{name}.log")
        return f"this output, lines prefixed ({name})"

    def _popen(self, instance: ServerInstance, sock: socket.socket) -> subprocess.Popen | ForkedProcess:
        """The server process of `instance`, in its own process group, output piped to the supervisor, listening on
        `sock` (bound to its port; the process gets its own copy): forked by the zygote (a NeMo-Gym folder of another
        tree too, when it runs in this environment: it enters its tree after the fork), or a fresh interpreter
        (`server_start: spawn`, no zygote left, or a folder with an environment of its own)."""
        zygote = self._zygote
        python = instance_python(instance, self.config, self._say)
        if zygote is not None and python == sys.executable:  # not a folder with an environment of its own
            env = {**os.environ, **self.credential.child_env()}
            try:
                return zygote.spawn(instance.name, own_secrets(json.loads(self._secrets_env), instance.name), env,
                                    sock.fileno())
            except ZygoteError as exc:
                self._zygote_lost(zygote, str(exc))
        return self._spawn_popen(instance, sock, python)

    def how_started(self, process: subprocess.Popen | ForkedProcess) -> str:
        """How `process` started, for the start-up line of a folder of another tree: forked from the zygote, or a
        fresh interpreter and why (the folder's own environment, `server_start: spawn`, or no zygote left)."""
        if isinstance(process, ForkedProcess):
            return "forked from the zygote"
        if process.args[0] != sys.executable:
            return "in a fresh interpreter of its own environment: its requirements conflict with the fleet's"
        if self.server_start == "spawn":
            return "in a fresh interpreter: server_start=spawn"
        return "in a fresh interpreter: the zygote is gone"

    def _spawn_popen(self, instance: ServerInstance, sock: socket.socket, python: str | None = None,
                     ) -> subprocess.Popen:
        """`instance` as a fresh interpreter: `python -m gymfleet.fleet.launch` (`python`: the instance's)."""
        command = [
            python or instance_python(instance, self.config, self._say),
            "-m",
            "gymfleet.fleet.launch",
            "--config",
            str(self._config_path),
            "--instance",
            instance.name,
            "--parent-pid",
            str(os.getpid()),
            "--workdir",
            str(self.workdir),
        ]
        # Secrets and the fleet token go in an inherited memory file: not on disk, not in `ps`, not in the child's
        # environment (which /proc/<pid>/environ shows for its whole life).
        secrets = own_secrets(json.loads(self._secrets_env), instance.name)
        fd = credentials_fd(secrets, self.credential.token, not self.credential.enforced)
        try:
            return subprocess.Popen(
                command,
                env={**os.environ, **credentials_env(fd), LISTEN_FD_ENV: str(sock.fileno())},
                pass_fds=(fd, sock.fileno()),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
                bufsize=1,
                errors="replace",
            )
        finally:
            os.close(fd)

    def _start_pump(self, child: _Child) -> None:
        """Copy the output of `child`'s current process to the fleet's output (or its log file) and its tail."""
        name = f"log-{child.instance.name}"
        threading.Thread(target=self._pump, args=(child, child.process), name=name, daemon=True).start()

    def _pump(self, child: _Child, process: subprocess.Popen) -> None:
        sink = None
        if self.log_dir:
            private_folder(self.log_dir)
            sink = open(self.log_dir / f"{child.instance.name}.log", "a", opener=owner_only)  # noqa: SIM115
        try:
            for line in process.stdout:
                child.tail.append(line.rstrip("\n"))
                if sink:
                    sink.write(line)
                    sink.flush()
                else:
                    self._say(f"({child.instance.name}) {line.rstrip()}")
        finally:
            process.stdout.close()
            if sink:
                sink.close()


def _server_start(config: GlobalConfig) -> str:
    """`server_start`: `zygote` (default) or `spawn`.

    Raises:
        ConfigError: any other value, naming the key and the choices.
    """
    value = config.data.get("server_start", SERVER_START_CHOICES[0])
    if value not in SERVER_START_CHOICES:
        raise ConfigError(
            f"server_start: expected one of {', '.join(SERVER_START_CHOICES)}, got {value!r}",
            path="server_start",
            hint="Use +server_start=zygote (default: every server forked from one pre-imported parent, fast and "
            "light) or +server_start=spawn (a fresh Python interpreter per server).",
        )
    return value
