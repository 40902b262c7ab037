"""The Ray actor of Ray placement (`gymfleet.fleet.ray_placement`): one replica of an instance, served from a child
process on the actor's node.

`ReplicaProcess` is a plain class that `RayFleet` turns into an actor (`ray.remote`, lazily: importing this module
needs no Ray). It binds a free port on its node's IP, then serves the instance there as `python -m
gymfleet.fleet.launch` from a private copy of the fleet's config (secrets masked on disk, handed to the child in its
environment), forwards the server's output (Ray forwards an actor's output to the driver) and restarts or stops it when
told.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from gymfleet.errors import ConfigError
from gymfleet.fleet.launch import WORKDIR_PREFIX, bind_socket, credentials_env, credentials_fd, write_resolved

__all__ = ["ReplicaProcess", "set_address"]

PORT_FREE_TIMEOUT_S = 10.0
"""How long a restarted server waits for its old port before it takes another one."""
TAIL_LINES = 40



class ReplicaProcess:
    """A Ray actor that serves one replica of an instance from a child process on its node (`ray.remote`'d lazily,
    so importing this module needs no Ray).

    `bind()` reserves a free port on the node's IP and reports it; `serve()` writes the config on the node (secrets
    masked) and starts `python -m gymfleet.fleet.launch` on that port; `poll()`, `respawn()` and `stop()` watch,
    restart and end the server process.
    """

    def __init__(self, instance_name: str, index: int) -> None:
        self.instance_name, self.index = instance_name, index
        self.label = f"{instance_name}#{index}"
        self.host, self.port = "", 0
        self._sock: socket.socket | None = None
        self._process: subprocess.Popen | None = None
        self._data: dict[str, Any] = {}
        self._secrets: list = []
        self._token = ""
        self._path = ""
        self._workdir: str | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._lock = threading.Lock()

    def bind(self, port: int = 0, wait_s: float = 0.0) -> dict[str, Any]:
        """Reserve a port on this node's IP (held until `serve`): `port` if it is free within `wait_s`, else any
        free one; returns `{host, port, node, actor_pid}`. The node's IP is the address its raylet was started on:
        its interface address on a real cluster, `127.0.0.1` on a loopback one (never `0.0.0.0`)."""
        import ray

        self.host = ray.util.get_node_ip_address()
        deadline = time.monotonic() + wait_s
        while port:
            try:
                self._sock = bind_socket(self.host, port, f"{self.instance_name}.port")
                break
            except ConfigError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        if self._sock is None:
            self._sock = bind_socket(self.host, 0, f"{self.instance_name}.port")
        self.port = self._sock.getsockname()[1]
        return {"host": self.host, "port": self.port, "node": ray.get_runtime_context().get_node_id(),
                "actor_pid": os.getpid()}

    def serve(self, data: dict[str, Any], secrets: list, token: str) -> int:
        """Serve the instance from `data` (the fleet's config, secrets masked, this replica's address in its
        instance) plus `secrets`; returns the server's pid."""
        with self._lock:
            self._data, self._secrets, self._token = data, secrets, token
            self._workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")  # 0700
            self._write_config()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            return self._spawn()

    def _write_config(self) -> None:
        self._path = os.path.join(self._workdir, f"resolved_config_{self.port}.json")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)
        write_resolved(self._data, self._path)

    def _spawn(self) -> int:
        command = [sys.executable, "-m", "gymfleet.fleet.launch", "--config", self._path,
                   "--instance", self.instance_name, "--parent-pid", str(os.getpid()), "--workdir", self._workdir]
        fd = credentials_fd(self._secrets, self._token)  # never the replica's environment: /proc shows it for good
        try:
            self._process = subprocess.Popen(command, env={**os.environ, **credentials_env(fd)}, pass_fds=(fd,),
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1,
                                             errors="replace")
        finally:
            os.close(fd)
        threading.Thread(target=self._pump, args=(self._process,), daemon=True).start()
        return self._process.pid

    def _pump(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            self._tail.append(line.rstrip("\n"))
            print(f"({self.label}) {line.rstrip()}", flush=True)  # Ray forwards an actor's output to the driver
        process.stdout.close()

    def poll(self) -> dict[str, Any]:
        """`{pid, returncode}` of the server process (returncode None while it runs)."""
        process = self._process
        return {"pid": process.pid if process else None, "returncode": process.poll() if process else None}

    def tail(self) -> list[str]:
        """The server's last output lines."""
        return list(self._tail)

    def respawn(self) -> dict[str, Any]:
        """Start the server again: on its port once free, else on a new one; returns `{host, port, pid}`."""
        with self._lock:
            self._kill()
            deadline = time.monotonic() + PORT_FREE_TIMEOUT_S
            while True:
                try:
                    bind_socket(self.host, self.port, f"{self.instance_name}.port").close()
                    break
                except ConfigError:
                    if time.monotonic() > deadline:
                        sock = bind_socket(self.host, 0, f"{self.instance_name}.port")
                        self.port = sock.getsockname()[1]
                        sock.close()
                        set_address(self._data, self.instance_name, self.host, self.port)
                        self._write_config()
                        break
                    time.sleep(0.2)
            self._tail.clear()
            return {"host": self.host, "port": self.port, "pid": self._spawn()}

    def _kill(self, grace_s: float = 0.0) -> None:
        process = self._process
        if process is None:
            return
        if grace_s and process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(grace_s)
        _signal_group(process.pid, signal.SIGKILL)  # workers of num_workers > 1 too
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)

    def stop(self) -> None:
        """Stop the server process (SIGTERM, then SIGKILL to its group) and remove the config folder."""
        with self._lock:
            self._kill(grace_s=5.0)
            if self._sock is not None:
                self._sock.close()
            if self._workdir:
                shutil.rmtree(self._workdir, ignore_errors=True)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def set_address(data: dict[str, Any], name: str, host: str, port: int) -> None:
    block = data[name]
    fields = next(iter(next(iter(block.values())).values()))
    fields["host"], fields["port"] = host, port
