"""`python -m sandbox`: serve the sandbox on its own (outside a fleet), or `--check` that isolation works here.

    python -m sandbox --port 8080 [--config fields.yaml] [--isolation none] [--max-concurrent-runs 8]
    python -m sandbox --check
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import uvicorn
import yaml

from gymfleet.errors import GymfleetError
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.launch import raise_nofile_limit
from gymfleet.http_types import SERVER_KEEP_ALIVE_S
from sandbox.app import SandboxConfig, SandboxServer


def _config(args: argparse.Namespace) -> SandboxConfig:
    fields = (yaml.safe_load(args.config.read_text()) if args.config else None) or {}
    overrides = {"host": args.host, "port": args.port, "isolation": args.isolation,
                 "max_concurrent_runs": args.max_concurrent_runs, "queue_length": args.queue_length}
    fields.update({key: value for key, value in overrides.items() if value is not None})
    return validate_fields(SandboxConfig, {"name": "sandbox", **fields}, str(args.config or "sandbox"))


async def _check(server: SandboxServer) -> None:
    """What a served sandbox prepares in its warm-up, self-test included; raises its error."""
    await server.startup()
    try:
        await server.warm_up()
    finally:
        await server.shutdown()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--config", type=Path, help="YAML file of SandboxConfig fields")
    parser.add_argument("--isolation", choices=("bwrap", "none"))
    parser.add_argument("--max-concurrent-runs", type=int)
    parser.add_argument("--queue-length", type=int)
    parser.add_argument("--check", action="store_true", help="check that isolation works, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = SandboxServer(_config(args))
        if args.check:
            asyncio.run(_check(server))
            print("sandbox isolation works")
            return
    except GymfleetError as exc:
        sys.exit(f"error: {exc}")
    raise_nofile_limit()
    uvicorn.run(server.create_app(), host=args.host, port=args.port, log_level="warning", backlog=8192,
                timeout_keep_alive=SERVER_KEEP_ALIVE_S, timeout_graceful_shutdown=2,
                proxy_headers=False)  # no proxy in front: X-Forwarded-For is a claim


if __name__ == "__main__":
    main()
