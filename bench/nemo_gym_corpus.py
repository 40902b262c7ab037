"""NeMo-Gym 0.7.0's environment corpus on gymfleet: for every folder of its wheel, does it start under `ng_run`
(dry run, then a real start), do its own tests pass, do its recorded rollouts replay to the recorded rewards?

    python bench/nemo_gym_corpus.py [--folders mcqa,example_single_tool_call] [--jobs 2]
                                    [--requirements check|install|venv] [--no-tests] [--json results.json]

The wheel comes from the package index once (`gymfleet.testing.nemo_gym_wheel`); each folder is tried by
`gymfleet.testing.nemo_gym_corpus.try_folder` (see there for what each column means). Prints one table (folder, class,
start, tests passed/total, rewards agree n/N, why not) as folders finish, then a summary, and the commonest reasons.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import require_modules  # noqa: E402
from gymfleet.testing.nemo_gym_corpus import FolderResult, try_folder  # noqa: E402
from gymfleet.testing.nemo_gym_wheel import nemo_gym_wheel  # noqa: E402

HEADER = ["folder", "class", "start", "tests", "rewards", "why not"]
WIDTHS = [34, 36, 5, 7, 7, 0]


def _line(cells: list[str]) -> str:
    return "  ".join(cell.ljust(width) if width else cell for cell, width in zip(cells, WIDTHS, strict=True))


def _reason(why: str) -> str:
    """A failure reason with its specifics (paths, numbers, names in quotes) blanked, to count alike ones."""
    why = re.sub(r"(not installed here|cannot install|conflicting with this environment): .*", r"\1: <packages>", why)
    why = re.sub(r"/\S+", "<path>", why)
    why = re.sub(r"'[^']*'|\"[^\"]*\"", "<x>", why)
    return re.sub(r"\d+(\.\d+)?", "<n>", why)[:110]


def summary(results: list[FolderResult], seconds: float) -> str:
    n = len(results)
    started = sum(r.start == "yes" for r in results)
    dry = sum(r.start in ("yes", "dry") for r in results)
    skipped = [r for r in results if r.start == "-"]
    with_tests = [r for r in results if r.tests_total]
    tests_green = sum(r.tests_passed == r.tests_total for r in with_tests)
    passed = sum(r.tests_passed for r in results)
    total = sum(r.tests_total for r in results)
    with_rows = [r for r in results if r.rows]
    rows_agree = sum(r.agree == r.rows for r in with_rows)
    agree = sum(r.agree for r in results)
    rows = sum(r.rows for r in results)
    blocked: collections.Counter = collections.Counter()
    for r in results:
        blocked.update(r.blocked)
    cannot = sum(blocked.values())
    lacking = "; ".join(f"{count} lack {what}" for what, count in blocked.most_common())
    folders_blocked = sum(bool(r.blocked) and r.agree + sum(r.blocked.values()) == r.rows for r in with_rows)
    lines = [
        f"{n} folders in {seconds / 60:.1f} min: {sum(r.ok for r in results)} start, pass all their tests and agree "
        "on every recorded reward",
        f"  start: {started} served, {dry} passed the dry run, {len(skipped)} not tried (need what is not here), "
        f"{n - dry - len(skipped)} failed",
        f"  tests: {tests_green}/{len(with_tests)} folders all green; {passed}/{total} tests passed",
        f"  rewards: {rows_agree}/{len(with_rows)} folders agree on every row; {agree}/{rows} rows agree",
        f"    {cannot} rows cannot be replayed here ({lacking or 'none'}): {agree}/{rows - cannot} replayable rows "
        f"agree; {rows_agree + folders_blocked}/{len(with_rows)} folders agree on every replayable row",
        "  commonest reasons (folders):",
    ]
    counts = collections.Counter(_reason(why) for r in results for why in r.why)
    lines += [f"    {count:4d}  {why}" for why, count in counts.most_common(15)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folders", help="comma-separated folder names (default: every folder of the wheel)")
    parser.add_argument("--jobs", type=int, default=2, help="folders tried at once")
    parser.add_argument("--requirements", default="check", choices=("check", "install", "venv"),
                        help="ng_run's folder_requirements: what to do with requirements this environment lacks")
    parser.add_argument("--no-tests", action="store_true", help="skip each folder's own tests")
    parser.add_argument("--json", type=Path, help="write every folder's result here")
    args = parser.parse_args(argv)
    require_modules("bench/nemo_gym_corpus.py", *([] if args.no_tests else ["pytest"]),
                    *([] if args.requirements == "check" else ["uv"]),
                    install="pip install -e '.[test]' (or without what needs them: --no-tests, --requirements check)")
    tree = nemo_gym_wheel() / "resources_servers"
    names = args.folders.split(",") if args.folders else sorted(  # library folders (gymnasium) have no app.py
        p.name for p in tree.iterdir() if (p / "app.py").is_file())
    missing = [name for name in names if not (tree / name / "app.py").is_file()]
    if missing:
        parser.error(f"no such folder in NeMo-Gym's wheel: {', '.join(missing)}")
    started = time.monotonic()
    print(_line(HEADER), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="gymfleet-corpus-") as scratch, ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(try_folder, tree / name, Path(scratch) / name, requirements=args.requirements,
                               tests=not args.no_tests): name for name in names}
        for future in as_completed(futures):
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - one folder's bench bug is that folder's row, not the run's end
                result = FolderResult(futures[future], why=[f"bench: {type(exc).__name__}: {exc}"])
            results.append(result)
            print(_line(result.row()), flush=True)
            if args.json:  # after every folder: a run cut short keeps what it measured
                _write_json(args.json, results)
    results.sort(key=lambda r: r.folder)
    print()
    print(summary(results, time.monotonic() - started), flush=True)
    if args.json:
        _write_json(args.json, results)
    return 0


def _write_json(path: Path, results: list[FolderResult]) -> None:
    """Every folder's result so far, sorted by folder, replacing `path` whole (never a half-written file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps([asdict(r) for r in sorted(results, key=lambda r: r.folder)], indent=1))
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
