"""`ng_status [+head_server.host=H +head_server.port=P] [+json=true]`: the fleet's instances, live or not.

Prints a table, or with `+json=true` one JSON object: `{"head_server": url, "live": n, "total": n, "instances":
[{process_name, server_type, name, url, pid, status, restarts, live, ...}, ...]}` (each instance as the head server's
`/server_instances` lists it, plus `live`). RESTARTS counts how often the fleet restarted a crashed server; STATUS
is the supervisor's view (running, restarting, failed). Exit code 0 when every instance answers, else 1.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from gymfleet.cli import reject_unknown_keys, run_cli, wants_help
from gymfleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.errors import ConfigError, TransportError


def _get(url: str, timeout_s: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _status(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    reject_unknown_keys(config, "ng_status", ("json",))
    as_json = config.data.get("json", False)
    if not isinstance(as_json, bool):
        raise ConfigError(f"json: expected true or false, got {as_json!r}.", path="json", hint="Use +json=true.")
    host = "127.0.0.1" if config.head_host in ("0.0.0.0", "::") else config.head_host
    head = f"http://{host}:{config.head_port}"
    try:
        instances = _get(head + "/server_instances")
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(
            f"no head server at {head} ({exc}); is ng_run running? Pass +head_server.host=... +head_server.port=...",
            url=head,
        ) from None
    live = [_is_live(item["url"]) for item in instances]
    if as_json:
        report = {"head_server": head, "live": sum(live), "total": len(instances),
                  "instances": [{**item, "live": up} for item, up in zip(instances, live, strict=True)]}
        print(json.dumps(report, indent=2))
    else:
        _print_table(instances, live, head)
    return 0 if all(live) else 1


def _is_live(url: str) -> bool:
    try:
        return _get(url + "/", 2.0) == {"status": "ok"}
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _print_table(instances: list[dict], live: list[bool], head: str) -> None:
    rows = [("INSTANCE", "TYPE", "IMPL", "URL", "PID", "STATUS", "RESTARTS", "LIVE")]
    for item, up in zip(instances, live, strict=True):
        rows.append((item["process_name"], item["server_type"], item["name"], item["url"], str(item["pid"]),
                     str(item.get("status", "-")), str(item.get("restarts", "-")), "yes" if up else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"{sum(live)} / {len(instances)} live (head server {head})")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_cli(_status, argv))


if __name__ == "__main__":
    main()
