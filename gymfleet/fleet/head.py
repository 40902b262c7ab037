"""The head server: how every client finds every server.

`GET /global_config_dict_yaml` answers a JSON string holding the resolved config as YAML (secrets masked), with
`host` and `port` filled in for every instance (NeMo-Gym clients `json.loads` it, then `OmegaConf.create` it).
For each agent it also publishes an `environment_servers` entry pointing at the agent itself, which is how
NeMo-Gym 0.7's rollout client reaches agents (`spec/protocol.md`, addendum). `GET /server_instances` lists the
instances with their process ids, `status` (starting, running, restarting, failed) and `restarts` (how often the
supervisor restarted a crashed one); `GET /metrics` counts those restarts as
`gymfleet_server_restarts_total{instance=...}`, next to the head server's own requests per route and process
metrics (RSS, CPU seconds, open fds) in the Prometheus text (`gymfleet.metrics`). `GET /openapi.json` and
`GET /docs` describe the routes.

Under Ray placement (`gymfleet.fleet.ray_placement`) each instance may run as several replicas whose addresses are
known only once they run (and change when a replica is restarted on another node). The supervisor then passes
`replicas()`: per instance, a list of `{host, port, node, status, restarts, pid}`. The published config gives each
instance `host`/`port` of its first replica (what NeMo-Gym clients read) plus `replicas: [{host, port}, ...]`
(what `gymfleet.http.ServerClient` spreads rollouts over), rebuilt whenever an address changes; each
`/server_instances` row carries its `replicas` list, `host`/`port`/`url` of the first, and the restarts of all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
import yaml
from fastapi import FastAPI
from starlette.responses import Response

from gymfleet import auth
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.masking import mask_secrets
from gymfleet.metrics import MetricsMiddleware, fleet_metrics
from gymfleet.serving.guard import RequestGuardMiddleware

Replicas = dict[str, list[dict[str, Any]]]
"""Instance name -> its replicas, each `{host, port, node, status, restarts, pid}` (Ray placement)."""


def published_config(config: GlobalConfig, replicas: Replicas | None = None) -> dict[str, Any]:
    """The config clients see: the resolved config, secrets masked, plus an `environment_servers` entry per agent.

    Clients only need hosts and ports from it (servers get their config from the supervisor, not from here), so API
    keys never leave the process through the head server, which NeMo-RL binds to `0.0.0.0`. With `replicas`, each
    placed instance gets its first replica's `host`/`port` and the `replicas: [{host, port}, ...]` list.
    """
    data = mask_secrets(config.data)
    for name, placed in (replicas or {}).items():
        instance = config.instances.get(name)
        if instance is None or not placed:
            continue
        fields = data[name][instance.server_type][instance.impl]
        fields["host"], fields["port"] = placed[0]["host"], placed[0]["port"]
        fields["replicas"] = [{"host": replica["host"], "port": replica["port"]} for replica in placed]
    for agent in config.instances_of("responses_api_agents"):
        key = f"{agent.name}_environment_server"
        if key not in data:
            data[key] = {
                "environment_servers": {
                    "legacy_agent": {
                        "entrypoint": "app.py",
                        "agent_server": {"type": "responses_api_agents", "name": agent.name},
                        "host": data[agent.name][agent.server_type][agent.impl]["host"],
                        "port": data[agent.name][agent.server_type][agent.impl]["port"],
                    }
                }
            }
    return data


HEAD_MAX_BODY_BYTES = 1 << 20
"""The head server's routes take no body; anything larger than this is refused unread."""


def create_head_app(
    config: GlobalConfig,
    processes: Callable[[], dict[str, dict[str, Any]]] | None = None,
    replicas: Callable[[], Replicas] | None = None,
    *,
    token: str | None = None,
) -> FastAPI:
    """The head server app. `processes()` returns per-instance `{pid, start_time, status, restarts}` from the
    supervisor; `replicas()` (Ray placement) each instance's replicas (see `Replicas`). With a `token`, every route
    but `GET /` requires it (`gymfleet.serving.guard`)."""
    app = FastAPI(title="gymfleet head server", docs_url="/docs", redoc_url=None)
    published: dict[str, Any] = {"key": None, "body": b""}

    def config_yaml() -> bytes:
        placed = replicas() if replicas else {}
        key = tuple((name, tuple((r["host"], r["port"]) for r in rows)) for name, rows in sorted(placed.items()))
        if published["key"] != key:  # rebuilt only when an address changed
            text = yaml.safe_dump(published_config(config, placed), sort_keys=False)
            published.update(key=key, body=orjson.dumps(text))
        return published["body"]

    metrics = fleet_metrics(processes or dict)
    app.add_middleware(RequestGuardMiddleware, loopback_only=auth.is_loopback(config.head_host),
                       max_body_bytes=HEAD_MAX_BODY_BYTES, token=token or None,
                       head=(config.head_host, config.head_port))
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/")
    async def liveness() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/global_config_dict_yaml", response_model=str)
    async def global_config_dict_yaml() -> Response:
        """The resolved config as a YAML document inside a JSON string (secrets masked)."""
        return Response(config_yaml(), media_type="application/json")

    @app.get("/server_instances")
    async def server_instances() -> list[dict[str, Any]]:
        live = processes() if processes else {}
        placed = replicas() if replicas else {}
        rows = []
        for instance in config.instances.values():
            state = live.get(instance.name, {})
            started = state.get("start_time")
            first = (placed.get(instance.name) or [{}])[0]
            host, port = first.get("host", instance.host), first.get("port", instance.port)
            row = {
                "process_name": instance.name,
                "server_type": instance.server_type,
                "name": instance.impl,
                "dir_path": str(instance.dir),
                "entrypoint": instance.entrypoint,
                "host": host,
                "port": port,
                "url": f"http://{host}:{port}",
                "pid": state.get("pid"),
                "config_path": instance.name,
                "start_time": started,
                "status": state.get("status", "unknown"),
                "uptime_seconds": time.time() - started if started else None,
                "restarts": state.get("restarts", 0),
            }
            if instance.name in placed:
                row["replicas"] = placed[instance.name]
            rows.append(row)
        return rows

    app.add_route("/metrics", metrics.endpoint, include_in_schema=False)

    return app
