"""Command-line entry points (`ng_run`, `ng_collect_rollouts`, `ng_prepare_data`, `ng_status`, ...).

Every command takes NeMo-Gym's Hydra-style arguments (`+config_paths=[a.yaml,b.yaml]`, `+key=value`,
`++key=value`) and prints errors as one clear message with exit code 2 instead of a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar

from gymfleet.errors import ConfigError, GymfleetError, did_you_mean

if TYPE_CHECKING:  # not imported at run time: `ng_run` starts its zygote before importing the config stack
    from pydantic import BaseModel

    from gymfleet.fleet.config_instances import GlobalConfig

T = TypeVar("T")
M = TypeVar("M", bound="BaseModel")


def setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("GYMFLEET_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def wants_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help", "+help=true") for arg in argv)


def run_cli(body: Callable[[list[str]], T], argv: list[str] | None = None, *, doc: str | None = None) -> T | int:
    """Run a command body, turning gymfleet errors into a message and exit code 2; with `doc`, `-h`/`--help`/
    `+help=true` prints it and returns 0 instead."""
    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    if doc is not None and wants_help(argv):
        print(doc)
        return 0
    try:
        return body(argv)
    except GymfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def command(body: Callable[[list[str]], int], doc: str | None = None) -> Callable[[list[str] | None], None]:
    """An `ng_*` command's entry point: `main(argv=None)` runs `body` through `run_cli` (`doc`: its help) and exits
    with the code it returns. A command module ends `main = command(_run, __doc__)`."""

    def main(argv: list[str] | None = None) -> None:
        sys.exit(run_cli(body, argv, doc=doc))

    return main


def reject_unknown_keys(config: GlobalConfig, command: str, known: Iterable[str]) -> None:
    """Refuse `+key=value` arguments that nothing reads, with a did-you-mean: a typo must not pass silently.

    Raises:
        ConfigError: e.g. `unknown key 'num_repeat' for ng_collect_rollouts (+num_repeat=...). Did you mean
            'num_repeats'?`, listing the command's keys.
    """
    known = sorted(set(known))
    unknown = config.unknown_cli_keys(known)
    if not unknown:
        return
    candidates = [*known, *config.instances]
    lines = [f"{key!r} (+{key}=...).{did_you_mean(key, candidates)}" for key in unknown]
    raise ConfigError(
        f"unknown key{'s' if len(unknown) > 1 else ''} for {command}: " + " ".join(lines),
        path=unknown[0],
        hint=f"{command} reads: {', '.join(known) or '(no keys of its own)'}; global keys and server instances "
        f"from the config are accepted too. See `{command} --help`.",
    )


def command_config(argv: list[str], command: str, known: Iterable[str]) -> GlobalConfig:
    """`argv` parsed as the fleet's config (ports left unassigned), refusing `+key=value`s not in `known`.

    Raises:
        ConfigError: a config file or argument is wrong, or a key nothing reads (`reject_unknown_keys`).
    """
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config

    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), assign_ports=False)
    reject_unknown_keys(config, command, known)
    return config


def command_fields(argv: list[str], command: str, model: type[M]) -> tuple[GlobalConfig, M]:
    """`command_config` for a command whose keys are `model`'s fields, and those fields validated into `model`."""
    from gymfleet.fleet.config_checks import validate_fields

    config = command_config(argv, command, model.model_fields)
    return config, validate_fields(model, config.data, "")
