"""Command-line entry points (`ng_run`, `ng_collect_rollouts`, `ng_prepare_data`, `ng_status`, ...).

Every command takes NeMo-Gym's Hydra-style arguments (`+config_paths=[a.yaml,b.yaml]`, `+key=value`,
`++key=value`) and prints errors as one clear message with exit code 2 instead of a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from gymfleet.errors import GymfleetError

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
