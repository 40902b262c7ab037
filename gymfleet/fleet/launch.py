"""Load a server instance from the global config and serve it (the child-process side of `ng_run`).

`load_server_class(instance)` imports the instance's entrypoint (`<folder>/<impl>/app.py`) and returns the one
`Server` subclass defined there (for a NeMo-Gym folder, which defines a `SimpleResourcesServer` subclass instead,
the gymfleet host that serves it: `gymfleet.serving.nemo_gym_server`); `build_server(instance, config)` validates
the instance's YAML fields against that class's config (unknown keys fail with the YAML path and the closest field)
and builds it.

`python -m gymfleet.fleet.launch --config <resolved.json> --instance <name>` serves one instance; with
`num_workers > 1` it binds the port once and runs that many worker processes on the shared socket.
`serve_supervised` is that command's body, and also what a server forked by the zygote runs
(`gymfleet.fleet.zygote`, `server_start: zygote`): such a server gets its secrets over the zygote's private socket
instead of its environment, and watches the supervisor through a pidfd instead of its parent (the zygote).

Secrets never sit on disk: the supervisor writes the resolved config owner-only (0600) with every secret value
(`gymfleet.masking.SECRET_KEY`) masked as `****` (`split_secrets` in `gymfleet.fleet.secret_handoff`,
`write_resolved`) and hands the real values to each child, with the fleet token, in a memory file it inherits
(`credentials_fd`; `GYMFLEET_CREDENTIALS_FD` names only the descriptor's number), which the child reads and closes at
once (`take_secrets`), merging the secrets back into its config (`merge_secrets`) and holding the token in memory
(`gymfleet.auth.hold`). Neither ever enters a server's environment: `/proc/<pid>/environ` shows a process's initial
environment for its whole life, whatever it removes from `os.environ` later, and every process a server starts would
inherit it. Workers get both through multiprocessing's spawn pipe. A taken port makes the child exit with
`EXIT_PORT_IN_USE` (the supervisor names the port and the override that frees it); a supervised child whose
supervisor died removes the fleet's work folder.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import importlib.util
import inspect
import json
import logging
import multiprocessing
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gymfleet.errors import ConfigError, GymfleetError, did_you_mean
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance, client_limits, repository_root
from gymfleet.fleet.folders import enter_tree
from gymfleet.fleet.folders import module_name as folder_module_name
from gymfleet.fleet.ports import LISTEN_FD_ENV
from gymfleet.fleet.secret_handoff import (  # noqa: F401  (re-exported: callers import them from here)
    CREDENTIALS_FD_ENV,
    Secrets,
    credentials_env,
    credentials_fd,
    merge_secrets,
    own_secrets,
    split_secrets,
    take_secrets,
)
from gymfleet.http_types import SERVER_KEEP_ALIVE_S

if TYPE_CHECKING:  # imported where used: `ng_run` imports this module and should say its first words quickly
    import uvicorn

    from gymfleet.serving.server import Server

log = logging.getLogger(__name__)

EXIT_PORT_IN_USE = 98
"""Exit code of a supervised child whose port is taken (Linux's EADDRINUSE); the supervisor reports it."""
WORKDIR_PREFIX = "gymfleet-"
"""Name prefix of a fleet's private work folder (the only kind of folder `--workdir` lets a child remove)."""

class PortInUseError(ConfigError, RuntimeError):
    """A port the fleet must listen on is taken by another process (a RuntimeError too, as `poll()` failures are)."""

    def __init__(self, port: int, path: str, *, assigned_if_unset: bool = True) -> None:
        unset = " (or leave the port unset to get a free one)" if assigned_if_unset else ""
        super().__init__(
            f"port {port} ({path}) is already in use by another process; free it or set ++{path}=<free port>{unset}",
            path=path,
        )
        self.port = port


def bind_socket(host: str, port: int, path: str, *, assigned_if_unset: bool = True) -> socket.socket:
    """A TCP socket bound to `host:port` (not listening yet), as every fleet server binds its port.

    Raises:
        PortInUseError: another process listens on the port (`path` is its YAML path, named in the message).
        ConfigError: any other bind failure (a host that is not local, a privileged port), naming `path`.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUseError(port, path, assigned_if_unset=assigned_if_unset) from None
        raise ConfigError(
            f"cannot listen on {host}:{port} ({path}): {exc.strerror or exc}; set ++{path}=<another port> or fix "
            "the host", path=path,
        ) from None
    return sock


def load_config(config_path: Path, secrets: Secrets) -> GlobalConfig:
    """The resolved config a child serves from: the (masked) file with the real secrets merged back."""
    data = json.loads(Path(config_path).read_text())
    return GlobalConfig.from_data(merge_secrets(data, secrets))


def _module_name(path: Path) -> str | None:
    """Dotted module name when `path` lies inside the repository's importable folders."""
    try:
        relative = path.resolve().relative_to(repository_root())
    except ValueError:
        return None
    parts = relative.with_suffix("").parts
    if all(part.isidentifier() for part in parts):
        return ".".join(parts)
    return None


def _exec_file(name: str, path: Path) -> Any:
    """Import the file at `path` as module `name` (registered in `sys.modules` first, as an import would)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_server_class(instance: ServerInstance) -> type[Server]:
    """The single `Server` subclass defined in the instance's entrypoint."""
    path = instance.dir / (instance.entrypoint or "app.py")
    where = f"{instance.name}.{instance.server_type}.{instance.impl}.entrypoint"
    if not path.is_file():
        siblings = sorted(p.name for p in instance.dir.glob("*.py")) if instance.dir.is_dir() else []
        raise ConfigError(
            f"{where}: entrypoint file {path} does not exist.{did_you_mean(path.name, siblings)}", path=where
        )
    from gymfleet.serving.server import Server

    if instance.folder is not None:  # a folder of another tree: its imports resolve in that tree
        enter_tree(instance.folder)
        module = _exec_file(folder_module_name(instance.folder, instance.entrypoint or "app.py"), path)
    elif (name := _module_name(path)) is not None:
        module = importlib.import_module(name)
    else:
        module = _exec_file(f"gymfleet_server_{instance.server_type}_{instance.impl}", path)
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Server) and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
    ]
    if not classes:  # a NeMo-Gym folder: its SimpleResourcesServer (or agent) subclass, served by gymfleet's host
        from gymfleet.serving.nemo_gym_agent_server import agent_host_class_for, nemo_gym_agent_classes
        from gymfleet.serving.nemo_gym_server import host_class_for, nemo_gym_server_classes

        classes = [host_class_for(cls) for cls in nemo_gym_server_classes(module)]
        classes += [agent_host_class_for(cls) for cls in nemo_gym_agent_classes(module)]
    if len(classes) != 1:
        found = [cls.__name__ for cls in classes] or "none"
        raise ConfigError(f"{where}: {path} must define exactly one Server subclass; found {found}", path=where)
    return classes[0]


def build_server(instance: ServerInstance, config: GlobalConfig | dict[str, Any]) -> Server:
    """Validate the instance's fields and construct its server."""
    data = config.data if isinstance(config, GlobalConfig) else config
    cls = load_server_class(instance)
    path = f"{instance.name}.{instance.server_type}.{instance.impl}"
    fields = {**instance.fields, "name": instance.name}
    validated = validate_fields(cls.config_class, fields, path)
    why = cls.single_process_reason() if instance.num_workers > 1 else None
    if why:
        raise ConfigError(f"{path}.num_workers: {instance.num_workers}: {why}", path=f"{path}.num_workers",
                          hint="Leave num_workers out (one process), or place it as num_replicas under Ray placement: "
                               "each rollout keeps to one replica.")
    return cls(validated, data)


def instance_python(instance: ServerInstance, config: GlobalConfig, say=print) -> str:
    """The interpreter that serves `instance`: this one, or for a folder of another tree whose requirements conflict
    with this environment, the folder's own (`gymfleet.fleet.folder_env`, made once and cached)."""
    if instance.folder is None:
        return sys.executable
    from gymfleet.fleet.folder_env import folder_python

    return folder_python(instance.folder, str(config.data.get("folder_requirements") or "check"), say)


def validate_instance(instance: ServerInstance, config: GlobalConfig, say=print) -> None:
    """Build `instance`'s server to validate it: here, or for a folder of another tree in a fresh interpreter of its
    environment (its tree's imports must not enter this process)."""
    if instance.folder is None:
        build_server(instance, config)
    else:
        check_in_fresh_interpreter(instance.name, config.data, instance_python(instance, config, say))


def die_with_parent(parent_pid: int, interval_s: float = 0.5, workdir: Path | None = None,
                    supervisor_pidfd: int | None = None) -> None:
    """Stop this server (its whole process group, workers included) soon after the supervisor dies.

    A watchdog thread notices the supervisor is gone when this process is re-parented. Unlike the kernel's
    parent-death signal, this does not depend on which supervisor *thread* started us (NeMo-RL may start the fleet
    from any thread), and it needs no `preexec_fn` (unsafe in a multi-threaded supervisor). A server forked by the
    zygote (`gymfleet.fleet.zygote`) is the zygote's child, not the supervisor's: it watches `supervisor_pidfd` instead
    (readable once the supervisor exits), so it outlives a dead zygote but not its supervisor. A supervisor killed
    outright cannot remove its work folder, so the first child to notice removes `workdir` (a `gymfleet-*` folder).
    """
    if supervisor_pidfd is not None:
        def gone(timeout_s: float | None) -> bool:
            return bool(select.select([supervisor_pidfd], [], [], timeout_s)[0])
    else:
        def gone(timeout_s: float | None) -> bool:
            if os.getppid() != parent_pid:
                return True
            time.sleep(interval_s if timeout_s is None else timeout_s)
            return os.getppid() != parent_pid

    if gone(0):
        _remove_workdir(workdir)
        sys.exit(f"supervisor {parent_pid} is gone; not starting")

    def watch() -> None:
        while not gone(None):
            pass
        log.error("supervisor %s is gone; stopping", parent_pid)
        _remove_workdir(workdir)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _remove_workdir(workdir: Path | None) -> None:
    """Remove a fleet's work folder (only a `gymfleet-*` one: `--workdir` must never delete anything else)."""
    if workdir is not None and workdir.name.startswith(WORKDIR_PREFIX):
        shutil.rmtree(workdir, ignore_errors=True)


def raise_nofile_limit() -> None:
    """Lift the open-files soft limit as far as the hard one allows: thousands of rollouts in flight need thousands
    of sockets (`gymfleet.connections.raise_open_files_limit`)."""
    from gymfleet.connections import raise_open_files_limit

    raise_open_files_limit()


def _uvicorn_config(app: Any, access_log: bool) -> uvicorn.Config:
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="info" if access_log else "warning",
        access_log=access_log,
        timeout_keep_alive=SERVER_KEEP_ALIVE_S,  # clients close idle connections first
        timeout_graceful_shutdown=2,
        backlog=8192,
        lifespan="on",
        proxy_headers=False,  # no proxy stands in front: X-Forwarded-For is a client's claim, never its address
    )


def serve_app(app: Any, sock: socket.socket, intake: Any = None, access_log: bool = False) -> None:
    """Serve the ASGI `app` on the bound socket `sock` (blocking) as every fleet server is served: uvicorn with the
    fleet's settings, through `gymfleet.serving.accept_gate.GatedServer` (its accept gate, batched writes and, with
    `intake`, a server's `IntakePacer`)."""
    from gymfleet.serving.accept_gate import GatedServer

    GatedServer(_uvicorn_config(app, access_log), intake).run(sockets=[sock])


def _access_log(config: GlobalConfig) -> bool:
    """One log line per request only when asked (`+uvicorn_logging_show_200_ok=true`): at RL scale it is noise."""
    return bool(config.data.get("uvicorn_logging_show_200_ok", False))


def _serve_worker(config_path: str, instance_name: str, sock: socket.socket, secrets: Secrets,
                  credential: tuple[str, bool] | None = None) -> None:
    from gymfleet import auth, http

    if credential is not None:
        auth.hold(*credential)

    _configure_logging(instance_name)
    raise_nofile_limit()
    config = load_config(Path(config_path), secrets)
    instance = config.instance(instance_name)
    http.configure(client_limits(config.data, instance.num_workers))
    server = build_server(instance, config)
    serve_app(server.create_app(), sock, server.intake, _access_log(config))


def serve_instance(config_path: Path, instance_name: str, secrets: Secrets | None = None,
                   listen_fd: int | None = None) -> None:
    """Serve one instance (blocking) from the resolved config at `config_path` plus its `secrets`, on the bound
    socket `listen_fd` the supervisor handed over (`gymfleet.fleet.ports`), else on a socket bound here.

    Raises:
        PortInUseError: the instance's port is taken.
        ConfigError: a bad field (named by its YAML path) or a port that cannot be bound for another reason.
    """
    from gymfleet import http

    secrets = secrets or []
    config = load_config(config_path, secrets)
    instance = config.instance(instance_name)
    http.configure(client_limits(config.data, instance.num_workers))
    server = build_server(instance, config)  # validate before binding, so config errors surface first
    if listen_fd is not None:
        sock = socket.socket(fileno=listen_fd)
    else:
        sock = bind_socket(instance.host, instance.port, f"{instance.path}.port")
    sock.set_inheritable(True)
    workers = instance.num_workers
    if workers <= 1:
        serve_app(server.create_app(), sock, server.intake, _access_log(config))
        return
    _run_workers(config_path, instance_name, sock, workers, secrets)


def _run_workers(config_path: Path, instance_name: str, sock: socket.socket, workers: int, secrets: Secrets) -> None:
    sock.listen(8192)
    from gymfleet import auth

    context = multiprocessing.get_context("spawn")
    processes = [  # secrets and the fleet token travel in the spawn pipe, not the environment
        context.Process(target=_serve_worker, args=(str(config_path), instance_name, sock, secrets, auth.held()),
                        daemon=True)
        for _ in range(workers)
    ]
    for process in processes:
        process.start()

    def stop(signum, frame):
        for process in processes:
            if process.is_alive():
                process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    from multiprocessing.connection import wait

    wait([process.sentinel for process in processes])
    stop(None, None)
    for process in processes:
        process.join(5)
    failed = [p.exitcode for p in processes if p.exitcode not in (0, -signal.SIGTERM)]
    if failed:
        log.error("%s: a worker exited with code %s; stopping", instance_name, failed[0])
        sys.exit(1)


def _configure_logging(instance_name: str) -> None:
    logging.basicConfig(
        level=os.environ.get("GYMFLEET_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def serve_supervised(config_path: Path, instance_name: str, secrets: Secrets, *, parent_pid: int | None = None,
                     workdir: Path | None = None, supervisor_pidfd: int | None = None,
                     listen_fd: int | None = None) -> None:
    """Serve one instance as the supervisor's child (blocking) on `listen_fd` (its bound socket, from the
    supervisor) or on its port; exits with `EXIT_PORT_IN_USE` or 2 on failure.

    What `python -m gymfleet.fleet.launch` runs, and what a server forked by the zygote runs (`gymfleet.fleet.zygote`).
    """
    _configure_logging(instance_name)
    if parent_pid:
        die_with_parent(parent_pid, workdir=workdir, supervisor_pidfd=supervisor_pidfd)
    raise_nofile_limit()
    try:
        serve_instance(config_path, instance_name, secrets, listen_fd)
    except PortInUseError as exc:
        if not parent_pid:  # a supervisor reports the port itself, in one line on the user's terminal
            print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_PORT_IN_USE)
    except GymfleetError as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve one gymfleet server instance.")
    parser.add_argument("--config", required=True, type=Path, help="resolved global config (JSON)")
    parser.add_argument("--instance", required=True, help="instance name")
    parser.add_argument("--parent-pid", type=int, help="die when this process (the supervisor) dies")
    parser.add_argument("--workdir", type=Path, help="the fleet's work folder, removed if the supervisor dies")
    parser.add_argument("--check", action="store_true", help="build the server (validating it) and exit")
    args = parser.parse_args(argv)
    secrets = take_secrets()
    if args.check:
        _configure_logging(args.instance)
        try:
            config = load_config(args.config, secrets)
            build_server(config.instance(args.instance), config)
        except GymfleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        return
    listen_fd = os.environ.pop(LISTEN_FD_ENV, None)  # the bound socket the supervisor handed over
    serve_supervised(args.config, args.instance, secrets, parent_pid=args.parent_pid, workdir=args.workdir,
                     listen_fd=None if listen_fd is None else int(listen_fd))


CHECK_TIMEOUT_S = 600
"""How long validating one folder of another tree in a fresh interpreter may take."""


def check_in_fresh_interpreter(name: str, data: dict[str, Any], python: str | None = None) -> None:
    """Validate instance `name` of the resolved config `data` as its server would start: in a fresh interpreter
    (`python -m gymfleet.fleet.launch --check`, `python` being the folder's environment's), so nothing of a folder
    of another tree (`gymfleet.fleet.folders`) is imported into this process.

    Raises:
        ConfigError: the folder does not import or its fields do not validate; the child's error, in one line.
    """
    import subprocess
    import tempfile

    masked, secrets = split_secrets(data)
    with tempfile.TemporaryDirectory(prefix="gymfleet-check-") as scratch:
        config_path = Path(scratch) / "resolved_config.json"
        write_resolved(masked, config_path)
        command = [python or sys.executable, "-m", "gymfleet.fleet.launch", "--config", str(config_path),
                   "--instance", name, "--check"]
        fd = credentials_fd(secrets)
        try:
            done = subprocess.run(command, env={**os.environ, **credentials_env(fd)}, pass_fds=(fd,),
                                  capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL,
                                  errors="replace")
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{name}: its server did not build within {CHECK_TIMEOUT_S}s", path=name) from None
        finally:
            os.close(fd)
    if done.returncode != 0:
        text = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
        why = text[text.rfind("error: "):].removeprefix("error: ") if "error: " in text else text.splitlines()[-1]
        raise ConfigError(why if why.startswith(name) else f"{name}: {why}", path=name)


def write_resolved(data: dict[str, Any], path: Path) -> None:
    """Write a config for child processes, readable by its owner only (created 0600, never over an existing file).

    The caller masks secrets first (`split_secrets`): the file is for ports and fields, not for API keys.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(json.dumps(data))


if __name__ == "__main__":
    main()
