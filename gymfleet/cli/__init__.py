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
    from gymfleet.fleet.config_instances import GlobalConfig

T = TypeVar("T")


def setup_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("GYMFLEET_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def wants_help(argv: list[str]) -> bool:
    return any(arg in ("-h", "--help", "+help=true") for arg in argv)


def run_cli(body: Callable[[list[str]], T], argv: list[str] | None = None) -> T:
    """Run a command body, turning gymfleet errors into a message and exit code 2."""
    setup_logging()
    try:
        return body(sys.argv[1:] if argv is None else argv)
    except GymfleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


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
