"""`ng_run "+config_paths=[a.yaml,b.yaml]" [+key=value ...]`: start the head server and every server; block.

Ctrl-C or SIGTERM stops everything within seconds. A server that dies is reported with its last output lines and
the whole fleet is shut down (exit code 1), unless `+restart_crashed_servers=N` allows N restarts per server.
"""

from __future__ import annotations

import signal
import sys

from gymfleet.cli import run_cli, wants_help
from gymfleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet import Fleet, ServerCrashedError


def _run(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv))
    fleet = Fleet(config)

    def stop(signum, frame):
        raise KeyboardInterrupt

    # SIGINT explicitly too: a shell without job control starts background commands with SIGINT ignored, and a
    # supervisor's `kill -INT` (NeMo-Gym's own shutdown signal) must still stop the fleet.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        fleet.start()
        fleet.run_forever()
    except KeyboardInterrupt:
        print("Stopping the fleet...", flush=True)
        return 0
    except ServerCrashedError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        fleet.shutdown()
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_cli(_run, argv))


if __name__ == "__main__":
    main()
