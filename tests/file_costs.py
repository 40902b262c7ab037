"""The root conftest's FILE_COST_S from a pytest `--durations=0` report: each test file's seconds (its tests' setup,
call and teardown summed), the costliest first, for the order `--dist loadfile` hands files out in.

    python tests/file_costs.py ci.log            # files of 8 s or more, as a Python dict to paste into conftest.py
    python tests/file_costs.py ci.log --min-s 5

Run CI's command with `--durations=0` to get the report (a `--durations=40` one lists only the slowest tests, so its
files' sums are lower bounds).
"""

from __future__ import annotations

import argparse
import math
import re
from collections import defaultdict
from pathlib import Path

DURATION = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?:setup|call|teardown) +(?P<test>\S+)\s*$", re.M)


def file_costs(report: str, min_s: float = 8.0) -> dict[str, int]:
    """Seconds per test file (rounded up) of the files at or above `min_s`, the costliest first (ties by path)."""
    totals: dict[str, float] = defaultdict(float)
    for match in DURATION.finditer(report):
        totals[match["test"].partition("::")[0]] += float(match["seconds"])
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))
    return {path: math.ceil(seconds) for path, seconds in ranked if seconds >= min_s}


def as_python(costs: dict[str, int]) -> str:
    return "FILE_COST_S = {\n" + "".join(f'    "{path}": {seconds},\n' for path, seconds in costs.items()) + "}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="pytest output holding a --durations=0 report")
    parser.add_argument("--min-s", type=float, default=8.0, help="leave out files under this many seconds")
    args = parser.parse_args(argv)
    costs = file_costs(args.report.read_text(errors="replace"), args.min_s)
    if not costs:
        parser.error(f"{args.report}: no durations at or above {args.min_s:g} s (was it run with --durations=0?)")
    print(as_python(costs))


if __name__ == "__main__":
    main()
