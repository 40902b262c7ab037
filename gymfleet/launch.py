"""Load a server instance from the global config and serve it (the child-process side of `ng_run`).

`load_server_class(instance)` imports the instance's entrypoint (`<folder>/<impl>/app.py`) and returns the one
`Server` subclass defined there; `build_server(instance, config)` validates the instance's YAML fields against that
class's config (unknown keys fail with the YAML path and the closest field) and builds it.

`python -m gymfleet.launch --config <resolved.json> --instance <name>` serves one instance; with `num_workers > 1`
it binds the port once and runs that many worker processes on the shared socket.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from gymfleet import http
from gymfleet.config import GlobalConfig, ServerInstance, client_limits, repository_root, validate_fields
from gymfleet.errors import ConfigError, GymfleetError, did_you_mean
from gymfleet.server import Server

log = logging.getLogger(__name__)

NOFILE_TARGET = 65_535


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


def load_server_class(instance: ServerInstance) -> type[Server]:
    """The single `Server` subclass defined in the instance's entrypoint."""
    path = instance.dir / (instance.entrypoint or "app.py")
    where = f"{instance.name}.{instance.server_type}.{instance.impl}.entrypoint"
    if not path.is_file():
        siblings = sorted(p.name for p in instance.dir.glob("*.py")) if instance.dir.is_dir() else []
        raise ConfigError(
            f"{where}: entrypoint file {path} does not exist.{did_you_mean(path.name, siblings)}", path=where
        )
    name = _module_name(path)
    if name is not None:
        module = importlib.import_module(name)
    else:
        name = f"gymfleet_server_{instance.server_type}_{instance.impl}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Server) and obj.__module__ == module.__name__ and not inspect.isabstract(obj)
    ]
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
    return cls(validated, data)


def die_with_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Stop this server (its whole process group, workers included) soon after the supervisor dies.

    A watchdog thread notices the supervisor is gone when this process is re-parented. Unlike the kernel's
    parent-death signal, this does not depend on which supervisor *thread* started us (NeMo-RL may start the fleet
    from any thread), and it needs no `preexec_fn` (unsafe in a multi-threaded supervisor).
    """
    if os.getppid() != parent_pid:
        sys.exit(f"supervisor {parent_pid} is gone; not starting")

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval_s)
        log.error("supervisor %s is gone; stopping", parent_pid)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        time.sleep(5)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def raise_nofile_limit() -> None:
    """Lift the open-files soft limit: thousands of rollouts in flight need thousands of sockets."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = NOFILE_TARGET if hard == resource.RLIM_INFINITY else min(NOFILE_TARGET, hard)
        if soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit: %s", exc)


def _uvicorn_config(app: Any, access_log: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_level="info" if access_log else "warning",
        access_log=access_log,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
        backlog=8192,
        lifespan="on",
    )


def _access_log(config: GlobalConfig) -> bool:
    """One log line per request only when asked (`+uvicorn_logging_show_200_ok=true`): at RL scale it is noise."""
    return bool(config.data.get("uvicorn_logging_show_200_ok", False))


def _serve_worker(config_path: str, instance_name: str, sock: socket.socket) -> None:
    _configure_logging(instance_name)
    raise_nofile_limit()
    config = GlobalConfig.from_json_file(Path(config_path))
    instance = config.instance(instance_name)
    http.configure(client_limits(config.data, instance.num_workers))
    server = build_server(instance, config)
    uvicorn.Server(_uvicorn_config(server.create_app(), _access_log(config))).run(sockets=[sock])


def serve_instance(config_path: Path, instance_name: str) -> None:
    """Serve one instance (blocking)."""
    config = GlobalConfig.from_json_file(config_path)
    instance = config.instance(instance_name)
    http.configure(client_limits(config.data, instance.num_workers))
    server = build_server(instance, config)  # validate before binding, so config errors surface first
    sock = socket.socket(socket.AF_INET6 if ":" in instance.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((instance.host, instance.port))
    sock.set_inheritable(True)
    workers = instance.num_workers
    if workers <= 1:
        uvicorn.Server(_uvicorn_config(server.create_app(), _access_log(config))).run(sockets=[sock])
        return
    _run_workers(config_path, instance_name, sock, workers)


def _run_workers(config_path: Path, instance_name: str, sock: socket.socket, workers: int) -> None:
    sock.listen(8192)
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_serve_worker, args=(str(config_path), instance_name, sock), daemon=True)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve one gymfleet server instance.")
    parser.add_argument("--config", required=True, type=Path, help="resolved global config (JSON)")
    parser.add_argument("--instance", required=True, help="instance name")
    parser.add_argument("--parent-pid", type=int, help="die when this process (the supervisor) dies")
    args = parser.parse_args(argv)
    _configure_logging(args.instance)
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    raise_nofile_limit()
    try:
        serve_instance(args.config, args.instance)
    except GymfleetError as exc:
        log.error("%s", exc)
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def write_resolved(config: GlobalConfig, path: Path) -> None:
    """Write the resolved config for child processes (they read it with `GlobalConfig.from_json_file`)."""
    path.write_text(json.dumps(config.data))


if __name__ == "__main__":
    main()
