"""One swebench grading in the bubblewrap sandbox vs in a container (`backend: docker`), same task, side by side.

Each grading is what `/verify` runs after the diff is collected: the grading script, the runner and the files of
`grading.py`, with the task's gold patch and test patch, through `SandboxClient.run` (a real sandbox service in
this process) or `ContainerRunner.run` (a fresh container of the task image on the engine: DOCKER_HOST, Docker's
socket or Podman's). The task image is built before timing (its build is shown on its own line).

    python bench/swebench_backends.py [--repeats 5] [--base-image localhost/gymfleet-base:bookworm]

Prints, per task and backend: reward of every run, p50 and max of the grading's wall time in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gymfleet.errors import ConfigError  # noqa: E402
from gymfleet.grading.sandbox_client import SandboxClient  # noqa: E402
from gymfleet.testing import serve  # noqa: E402
from resources_servers.swebench import grading, repos  # noqa: E402
from resources_servers.swebench.containers import ContainerRunner  # noqa: E402
from sandbox.app import SandboxServer  # noqa: E402

ROWS = [json.loads(line) for line in (ROOT / "resources_servers/swebench/data/example.jsonl").read_text().splitlines()]


async def grade(runner, row: dict) -> tuple[float, float]:
    ids = [*json.loads(row["FAIL_TO_PASS"]), *json.loads(row["PASS_TO_PASS"])]
    snapshot = await repos.SNAPSHOTS.get(row["repo_source"], row["base_commit"])
    nonce = grading.new_nonce()
    started = time.perf_counter()
    files = grading.grading_files(row["patch"], row["test_patch"], ids)
    result = await runner.run(grading.grade_script(row.get("setup_commands") or []), "bash", stdin=nonce + "\n",
                              archive=snapshot.archive, files=files, timeout_s=120, memory_mb=1024)
    elapsed = time.perf_counter() - started
    report = grading.read_report(result.stdout, nonce) or {}
    reward = grading.score(report, json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])).reward
    return reward, elapsed


async def main(repeats: int, base_image: str, url: str) -> None:
    containers = ContainerRunner(base_image)
    containers.start()
    sandbox = SandboxClient("sandbox", url=url)
    print(f"{'task':<22} {'backend':<8} {'rewards':<14} {'p50 s':>7} {'max s':>7}")
    try:
        for row in ROWS:
            snapshot = await repos.SNAPSHOTS.get(row["repo_source"], row["base_commit"])
            started = time.perf_counter()
            await containers.task_image(snapshot.archive)
            print(f"{row['instance_id']:<22} {'image':<8} {'':<14} {time.perf_counter() - started:>7.2f}")
            for name, runner in (("bwrap", sandbox), ("docker", containers)):
                runs = [await grade(runner, row) for _ in range(repeats)]
                times = [t for _, t in runs]
                rewards = "".join("1" if r == 1.0 else "0" for r, _ in runs)
                print(f"{row['instance_id']:<22} {name:<8} {rewards:<14} {statistics.median(times):>7.2f} "
                      f"{max(times):>7.2f}")
    finally:
        containers.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--base-image", default="localhost/gymfleet-base:bookworm")
    args = parser.parse_args()
    server = SandboxServer({"name": "sandbox"})
    try:
        with serve(server.create_app()) as sandbox_url:
            asyncio.run(main(args.repeats, args.base_image, sandbox_url))
    except ConfigError as exc:  # no Docker SDK, no engine, no base image: one line, with the fix
        raise SystemExit(f"bench/swebench_backends.py: {exc.message}" + (f": {exc.hint}" if exc.hint else "")
                         ) from None
