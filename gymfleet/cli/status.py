"""`ng_status [+head_server.host=H +head_server.port=P]`: table of the fleet's instances, live or not."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from gymfleet.cli import run_cli, wants_help
from gymfleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.errors import TransportError


def _get(url: str, timeout_s: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _status(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    host = "127.0.0.1" if config.head_host in ("0.0.0.0", "::") else config.head_host
    head = f"http://{host}:{config.head_port}"
    try:
        instances = _get(head + "/server_instances")
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(
            f"no head server at {head} ({exc}); is ng_run running? Pass +head_server.host=... +head_server.port=...",
            url=head,
        ) from None
    rows = [("INSTANCE", "TYPE", "IMPL", "URL", "PID", "LIVE")]
    live_count = 0
    for item in instances:
        try:
            live = _get(item["url"] + "/", 2.0) == {"status": "ok"}
        except (urllib.error.URLError, OSError, ValueError):
            live = False
        live_count += live
        rows.append(
            (
                item["process_name"],
                item["server_type"],
                item["name"],
                item["url"],
                str(item["pid"]),
                "yes" if live else "NO",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    print(f"{live_count} / {len(instances)} live (head server {head})")
    return 0 if live_count == len(instances) else 1


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_cli(_status, argv))


if __name__ == "__main__":
    main()
