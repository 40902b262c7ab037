"""`ng_dump_config "+config_paths=[...]"`: print the resolved config as YAML, secrets hidden."""

from __future__ import annotations

import sys

from gymfleet.cli import reject_unknown_keys, run_cli, wants_help
from gymfleet.config import GlobalConfigDictParserConfig, parse_global_config


def _dump(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    reject_unknown_keys(config, "ng_dump_config", ())
    print(config.to_yaml(hide_secrets=True), end="")
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run_cli(_dump, argv))


if __name__ == "__main__":
    main()
