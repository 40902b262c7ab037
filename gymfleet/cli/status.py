"""`ng_status [+head_server.host=H +head_server.port=P] [+json=true]`: the fleet's instances, live or not.

Prints a table, or with `+json=true` one JSON object: `{"head_server": url, "live": n, "total": n, "instances":
[{process_name, server_type, name, url, pid, status, restarts, live, upstream, ...}, ...]}` (each instance as the
head server's `/server_instances` lists it, plus `live` and, for model servers that report it, `upstream`: their
`GET /upstream_status`). RESTARTS counts how often the fleet restarted a crashed server; STATUS is the supervisor's
view (starting, running, waiting for upstream, restarting, failed). LIVE is `yes` for a server that answers and
whose upstream model endpoints answer too, `waiting for upstream` for a model server that answers but whose upstream
does not yet (each such URL is listed below the table with how long so far and the timeout), `NO` otherwise.
Under Ray placement (`gymfleet.fleet.ray_placement`) each instance's replicas follow it in the table, one row each
(`<instance>#<n>`: its URL on its node, the server's pid, status, restarts and liveness, NODE its Ray node id); in
JSON each instance has `replicas: [{host, port, node, status, restarts, pid, live}, ...]`, and an instance is live
when every replica answers. Exit code 0 when every instance is live, else 1.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from gymfleet import auth
from gymfleet.cli import command, command_config
from gymfleet.errors import ConfigError, TransportError

WAITING = "waiting for upstream"
"""The supervisor's status for a model server whose upstream does not answer yet (`gymfleet.fleet.readiness`)."""


def _get(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def _status(argv: list[str]) -> int:
    config = command_config(argv, "ng_status", ("json",))
    as_json = config.data.get("json", False)
    if not isinstance(as_json, bool):
        raise ConfigError(f"json: expected true or false, got {as_json!r}.", path="json", hint="Use +json=true.")
    host = "127.0.0.1" if config.head_host in ("0.0.0.0", "::") else config.head_host
    head = f"http://{host}:{config.head_port}"
    try:
        token = auth.head_headers(config.head_host, config.head_port)
        instances = _get(head + "/server_instances", headers=token)
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(
            f"no head server at {head} ({exc}); is ng_run running? Pass +head_server.host=... +head_server.port=...",
            url=head,
        ) from None
    for item in instances:
        for replica in item.get("replicas") or []:
            replica["live"] = _is_live(f"http://{replica['host']}:{replica['port']}")
        answers = _is_live(item["url"]) and all(replica["live"] for replica in item.get("replicas") or [])
        item["upstream"] = _upstream_status(item, token) if answers else None
        item["live"] = answers and not _waits_for_upstream(item)
    if as_json:
        report = {"head_server": head, "live": sum(item["live"] for item in instances), "total": len(instances),
                  "instances": instances}
        print(json.dumps(report, indent=2))
    else:
        _print_table(instances, head)
    return 0 if all(item["live"] for item in instances) else 1


def _is_live(url: str) -> bool:
    try:
        return _get(url + "/", 2.0) == {"status": "ok"}
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _upstream_status(item: dict, token: dict[str, str]) -> dict | None:
    """A model server's own report on its upstream (`GET /upstream_status`), if it makes one (vllm_model does)."""
    if item.get("server_type") != "responses_api_models":
        return None
    try:
        report = _get(item["url"] + "/upstream_status", 2.0, token)
    except (urllib.error.URLError, OSError, ValueError):  # a 404 from a model server without the route, too
        return None
    return report if isinstance(report, dict) else None


def _waits_for_upstream(item: dict) -> bool:
    upstream = item.get("upstream") or {}
    return item.get("status") == WAITING or upstream.get("status") in (WAITING, "upstream unreachable")


def _live_text(item: dict) -> str:
    if item["live"]:
        return "yes"
    if item.get("upstream") is not None or item.get("status") == WAITING:
        upstream = item.get("upstream") or {}
        return upstream.get("status") or WAITING  # answers, but its upstream does not
    return "NO"


def _print_table(instances: list[dict], head: str) -> None:
    placed = any(item.get("replicas") for item in instances)
    rows = [("INSTANCE", "TYPE", "IMPL", "URL", "PID", "STATUS", "RESTARTS", "LIVE") + (("NODE",) if placed else ())]
    for item in instances:
        rows.append((item["process_name"], item["server_type"], item["name"], item["url"], str(item["pid"]),
                     str(item.get("status", "-")), str(item.get("restarts", "-")), _live_text(item))
                    + (("",) if placed else ()))
        for index, replica in enumerate(item.get("replicas") or []):
            rows.append((f"  {item['process_name']}#{index}", "", "", f"http://{replica['host']}:{replica['port']}",
                         str(replica.get("pid")), str(replica.get("status", "-")), str(replica.get("restarts", "-")),
                         "yes" if replica["live"] else "NO", str(replica.get("node") or "")[:12]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    print(f"{sum(item['live'] for item in instances)} / {len(instances)} live (head server {head})")
    for item in instances:
        upstream = item.get("upstream") or {}
        for entry in upstream.get("upstreams", []):
            if not entry.get("ready"):
                print(f"{item['process_name']}: {upstream.get('status')} {entry.get('url')}: "
                      f"{entry.get('last_error') or 'no answer yet'} ({upstream.get('waited_s', 0):.0f} s so far, "
                      f"timeout {upstream.get('timeout_s', 0):g} s)")


main = command(_status, __doc__)


if __name__ == "__main__":
    main()
