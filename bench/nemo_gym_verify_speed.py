"""`/verify` requests/s of NeMo-Gym folders served by gymfleet beside the same folders served by NeMo-Gym itself.

    python bench/nemo_gym_verify_speed.py --nemo-gym-python <python of an env with nemo-gym==0.7.0 installed>
                                          [--folders string_match,equivalence_rule,bunsenbench_chemistry_mcq]
                                          [--concurrency 16] [--seconds 10]

NeMo-Gym 0.7.0 needs Python >= 3.13.14; an environment for it: `uv venv -p 3.13 ng && uv pip install --python
ng/bin/python nemo-gym==0.7.0` (with `--python-version 3.13.14` where only an older 3.13 is at hand). Each folder
is served by NeMo-Gym as `ng_run` would (`python app.py` in the folder, its config in `NEMO_GYM_CONFIG_DICT`) and by
gymfleet (`ng_run` with `+server_folders`, see `gymfleet.testing.nemo_gym_corpus`), one at a time, and loaded by
this process with gymfleet's aiohttp client at the given concurrency with the folder's first recorded rollout. Prints
one table: folder, requests/s and p50/p99 for each server, their ratio, errors and the reward each answered (they
must agree).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench._common import closed_loop  # noqa: E402
from gymfleet import auth, http  # noqa: E402
from gymfleet.testing import free_port  # noqa: E402
from gymfleet.testing.nemo_gym_corpus import _ng_run, folder_config  # noqa: E402
from gymfleet.testing.nemo_gym_recordings import (  # noqa: E402
    materialized_inputs,
    recorded_rows,
    replay_request,
    task_for,
    task_rows,
)
from gymfleet.testing.nemo_gym_wheel import nemo_gym_wheel  # noqa: E402

START_TIMEOUT_S = 600


def _wait_port(port: int, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited: {log.read_text(errors='replace')[-800:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"not listening after {START_TIMEOUT_S}s")


def nemo_gym_server(folder: Path, python: str, scratch: Path) -> tuple[subprocess.Popen, str, Path]:
    """NeMo-Gym's own server for `folder`: `python app.py` in it, as NeMo-Gym's ng_run starts it."""
    data, servers = folder_config(folder)
    port = free_port()
    data = {"head_server": {"host": "127.0.0.1", "port": free_port()}, "dry_run": False, **data}
    data[servers[0]]["resources_servers"][folder.name].update(host="127.0.0.1", port=port)
    env = {**os.environ, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(data), "NEMO_GYM_CONFIG_PATH": servers[0]}
    env.pop("PYTHONPATH", None)
    log = scratch / "nemo_gym.log"
    process = subprocess.Popen([python, "app.py"], cwd=folder, env=env, stdout=open(log, "w"),  # noqa: SIM115
                               stderr=subprocess.STDOUT, start_new_session=True)
    _wait_port(port, process, log)
    return process, f"http://127.0.0.1:{port}", log


def gymfleet_server(folder: Path, scratch: Path) -> tuple[subprocess.Popen, str, Path]:
    """gymfleet serving `folder` from where it lies (`ng_run` with `+server_folders`)."""
    data, servers = folder_config(folder)
    config = scratch / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    port = free_port()
    data[servers[0]]["resources_servers"][folder.name]["port"] = port
    config.write_text(yaml.safe_dump(data))
    log = scratch / "gymfleet.log"
    head_port = free_port()
    extra = ["+folder_requirements=venv", f"+head_server.port={head_port}"]
    process = subprocess.Popen(_ng_run(config, folder, servers, extra), stdout=open(log, "w"),  # noqa: SIM115
                               stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    _wait_port(port, process, log)
    url = f"http://127.0.0.1:{port}"
    auth.grant(url, auth.token_for("127.0.0.1", head_port))  # the fleet's token, which ng_run wrote for its head
    return process, url, log


def body_for(folder: Path) -> dict:
    """The `/verify` body NeMo-Gym's agent sent for the folder's first recorded rollout."""
    row = recorded_rows(folder)[0]
    return replay_request(row, task_for(row, task_rows(folder), materialized_inputs(folder)))


async def _probe(url: str, body: dict) -> float:
    """One request, which must be answered 200 (a server that refuses every request would measure as fast); its
    reward."""
    try:
        response = await http.request("POST", url, json=body, timeout_s=120, retry=http.NO_RETRY)
        if response.status != 200:
            raise RuntimeError(f"POST {url} answered {response.status}: {str(response.text)[:500]}")
        return response.json()["reward"]
    finally:
        await http.close()


def measure(start, body: dict, concurrency: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        process, url, _ = start(Path(scratch))
        try:
            reward = asyncio.run(_probe(url + "/verify", body))
            asyncio.run(closed_loop(url + "/verify", body, 4, 1.0, timeout_s=120))  # warm-up
            return {**asyncio.run(closed_loop(url + "/verify", body, concurrency, seconds, timeout_s=120)),
                    "reward": reward}
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nemo-gym-python", required=True)
    parser.add_argument("--folders", default="string_match,equivalence_rule,bunsenbench_chemistry_mcq")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tree = nemo_gym_wheel() / "resources_servers"
    print(f"{os.cpu_count()} cores; concurrency {args.concurrency}; {args.seconds:g}s per server")
    print(f"{'folder':<30} | {'NeMo-Gym req/s':>14} {'p50 ms':>7} {'p99 ms':>7} | "
          f"{'gymfleet req/s':>14} {'p50 ms':>7} {'p99 ms':>7} | {'ratio':>5} errors rewards")
    for name in args.folders.split(","):
        folder = tree / name
        body = body_for(folder)
        theirs = measure(lambda s, f=folder: nemo_gym_server(f, args.nemo_gym_python, s), body, args.concurrency,
                         args.seconds)
        ours = measure(lambda s, f=folder: gymfleet_server(f, s), body, args.concurrency, args.seconds)
        print(f"{name:<30} | {theirs['rps']:>14.0f} {theirs['p50_ms']:>7.1f} {theirs['p99_ms']:>7.1f} | "
              f"{ours['rps']:>14.0f} {ours['p50_ms']:>7.1f} {ours['p99_ms']:>7.1f} | "
              f"{ours['rps'] / theirs['rps']:>5.2f} {theirs['errors']}/{ours['errors']} "
              f"{theirs['reward']:g}/{ours['reward']:g}", flush=True)


if __name__ == "__main__":
    main()
