"""Run the quick benchmarks and write their tables and plots into `docs/benchmarks.md`.

Each bench of `QUICK` runs as its own process with small sizes (each table says what it ran), its printed table is
kept verbatim and its numbers (`--json`) become one PNG per measure in `docs/benchmarks/`. The page's "Latest report"
section (between its `report:start` / `report:end` markers) is replaced; the rest of the page is left as written. A
bench that fails is reported as failed, with the end of its output, and the others still run.

    python bench/report.py [--only verify_throughput,metrics_cost] [--out docs/benchmarks.md]

Needs nothing beyond `pip install -e .` (matplotlib is a dependency); a bench that needs a program pip does not
install (the server-bound `verify_throughput --wrk` needs `wrk`) is run where that program is on PATH, and listed
as skipped, with how to install it, where it is not. Run it on an otherwise idle machine: the page
records the machine (CPU, cores, memory, load average before and after) beside the numbers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- report:start -->", "<!-- report:end -->"


@dataclass(frozen=True)
class Bench:
    name: str
    args: tuple[str, ...]
    what: str
    timeout_s: float = 900
    needs: str | None = None
    """A program the bench needs on PATH beyond `pip install -e .`; without it the report says it was skipped."""
    label: str = ""
    """What its plots are named after (default: `name`), for a bench that runs twice with other options."""

    @property
    def key(self) -> str:
        return self.label or self.name


QUICK = (
    Bench("verify_throughput", ("--concurrency", "1", "16", "256", "4096", "--seconds", "2", "--rounds", "3"),
          "mcqa `/verify` beside a bare FastAPI endpoint parsing the same body"),
    Bench("verify_throughput", ("--wrk", "--concurrency", "1", "16", "256", "4096", "--seconds", "2", "--rounds", "3",
                                "--asgi-requests", "0"),
          "the same, server-bound: `wrk` on one core, each server pinned to the other", needs="wrk",
          label="verify_throughput_wrk"),
    Bench("metrics_cost", ("--concurrency", "1", "64", "--seconds", "2", "--rounds", "3"),
          "what `/metrics` recording costs per request"),
    Bench("sandbox_throughput", ("--seconds", "4", "--slices", "4"),
          "a trivial program through the sandbox beside a bare `python -c`"),
    Bench("fleet_startup", ("--repeats", "1"), "the Nano 3 fleet's time to ready and memory, spawn vs zygote"),
)


def machine() -> str:
    """One line describing the machine: CPU model, cores, memory, OS, Python, load average."""
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        memory = "RAM unknown"
    return (f"{cpu}, {os.cpu_count()} cores, {memory}; {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown commit"


def run(bench: Bench, scratch: Path) -> tuple[str, list[dict], float, str | None]:
    """Run one bench: (its printed output, its plots, seconds taken, why it failed or None)."""
    numbers = scratch / f"{bench.key}.json"
    command = [sys.executable, str(ROOT / "bench" / f"{bench.name}.py"), *bench.args, "--json", str(numbers)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=bench.timeout_s)
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return output, [], time.monotonic() - started, f"did not finish within {bench.timeout_s:g}s"
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        return tail, [], took, f"exited with status {done.returncode}"
    plots = json.loads(numbers.read_text())["plots"] if numbers.exists() else []
    return done.stdout.strip(), plots, took, None


def plot(figure: dict, path: Path) -> None:
    """One PNG: a line per series over numeric x values (log scale when `log_x`), else grouped bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    series = figure["series"]
    xs = [x for points in series.values() for x, _ in points]
    if all(isinstance(x, int | float) for x in xs):
        for name, points in series.items():
            ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=name)
        if figure.get("log_x"):
            ax.set_xscale("log", base=2)
    else:
        labels = list(dict.fromkeys(xs))
        width = 0.8 / max(1, len(series))
        for index, (name, points) in enumerate(series.items()):
            values = dict((x, y) for x, y in points)
            ax.bar([i + index * width for i in range(len(labels))], [values.get(x, 0) for x in labels], width,
                   label=name)
        ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_title(figure["title"], fontsize=10)
    ax.set_xlabel(figure["x_label"])
    ax.set_ylabel(figure["y_label"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def section(results: list[tuple[Bench, str, list[dict], float, str | None]], images: Path, page: Path,
            load_before: float, load_after: float) -> str:
    today = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        START,
        "## Latest report",
        "",
        f"Written by `python bench/report.py` on {today} at commit {commit()}.",
        f"Machine: {machine()}; load average {load_before:.1f} before, {load_after:.1f} after (other work on the "
        "machine shows as noise: compare the columns of one table, which ran side by side, not tables of two runs).",
        "",
    ]
    for bench, output, plots, took, failure in results:
        lines += [f"### `bench/{bench.name}.py`: {bench.what}", "",
                  f"`python bench/{bench.name}.py {' '.join(bench.args)}` ({took:.0f} s)", ""]
        if failure:
            lines += [f"**Failed** ({failure}); the end of its output:", ""]
        lines += ["```text", output or "(no output)", "```", ""]
        for index, figure in enumerate(plots):
            image = images / f"{bench.key}_{index}.png"
            plot(figure, image)
            lines += [f"![{figure['title']}]({os.path.relpath(image, page.parent)})", ""]
    lines.append(END)
    return "\n".join(lines)


def write(page: Path, text: str) -> None:
    """Replace the report section of `page` (or append one)."""
    current = page.read_text() if page.exists() else "# Benchmarks\n"
    if START in current and END in current:
        before, rest = current.split(START, 1)
        after = rest.split(END, 1)[1]
        page.write_text(before + text + after)
    else:
        page.write_text(current.rstrip("\n") + "\n\n" + text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated bench names (default: all of " +
                        ", ".join(bench.name for bench in QUICK) + ")")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/benchmarks.md")
    args = parser.parse_args()
    chosen = [bench for bench in QUICK if not args.only or bench.name in args.only.split(",")]
    unknown = set(args.only.split(",")) - {bench.name for bench in QUICK} if args.only else set()
    if unknown:
        parser.error(f"--only: no quick bench named {', '.join(sorted(unknown))}")
    images = args.out.parent / "benchmarks"
    images.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for bench in chosen:
            if bench.needs and shutil.which(bench.needs) is None:
                skipped = (f"skipped: it needs `{bench.needs}` on PATH, which `pip install -e .` does not install "
                           f"(Debian/Ubuntu: `apt-get install {bench.needs}`)")
                print(f"bench/{bench.name}.py {' '.join(bench.args)}: {skipped}", flush=True)
                results.append((bench, skipped, [], 0.0, None))
                continue
            print(f"running bench/{bench.name}.py {' '.join(bench.args)}", flush=True)
            output, plots, took, failure = run(bench, Path(scratch))
            print(f"  {'FAILED: ' + failure if failure else 'done'} in {took:.0f} s", flush=True)
            results.append((bench, output, plots, took, failure))
    write(args.out, section(results, images, args.out, load_before, os.getloadavg()[0]))
    print(f"wrote {args.out} and {len(list(images.glob('*.png')))} plots in {images}")
    if any(failure for *_, failure in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
