"""Fault injection during `ng_collect_rollouts` (issue 16 item 5): kill each kind of server mid-collection, stall the
judge and the sandbox, cut connections mid-answer on every hop, fill the disk under the output file.

Each time the collector loses nothing (every rollout ends as exactly one result or one typed failure row, or, when
the collection stopped because the fleet looked down, is reported as not sent), no hop hangs, and a second run with
`resume_from_cache` completes each missing rollout exactly once, superseding the failure rows.

One real fleet (`ng_run`'s supervisor, every server its own process) serves every test but the connection cuts'
in-process agents: the quickstart (scripted LLM, `vllm_model` policy, mcqa), code_gen with the sandbox service, and
equivalence_llm_judge whose judge is a scripted LLM that never answers in time. The collector is `collect()` in this
process (the CLI where its exit code and message matter).

When ng_run itself dies (head server and all: its children stop with it), the collection stops with one message and
a resume on a new fleet finishes it: `tests/test_collect.py::test_a_dead_fleet_stops_the_collection_...`. Here the
head server alone goes away: clients resolved every address at start, so the collection goes on unharmed, and the
supervisor says the head died.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gymfleet import http
from gymfleet.fleet.config_instances import GlobalConfig, repository_root
from gymfleet.fleet.launch import build_server
from gymfleet.fleet.readiness import ServerCrashedError
from gymfleet.http import ServerClient
from gymfleet.rollouts.collect import CollectionSummary, collect
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig
from gymfleet.testing import fleet_headers, running_fleet, serve
from tests.fault_tools import CuttingProxy, Outputs, key, read_jsonl

ROOT = repository_root()
MCQA_ROWS = ROOT / "resources_servers/mcqa/data/example.jsonl"
CODE_ROWS = ROOT / "resources_servers/code_gen/data/example.jsonl"
JUDGE_ROWS = ROOT / "resources_servers/equivalence_llm_judge/data/example.jsonl"
WAIT_S = 120
"""Bound on waits for things that take seconds (catches a hang; times nothing)."""
JUDGE_TIMEOUT_S = 2.0
VERIFY_TIMEOUT_S = 4.0
"""code_gen's deadline for one `/verify`: a stalled sandbox ends as `verify_timeout` rows this soon."""

# The quickstart's answers for mcqa, slowed a little so a collection is still running when its server is killed;
# a program for every code_gen row; a final answer in both formats for the judge rows.
_QUICKSTART = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
POLICY_RULES = [
    *({**rule, "delay_s": 0.05} for rule in _QUICKSTART["scripted_llm"]["responses_api_models"]["scripted_model"]
      ["rules"]),
    {"match": "Solve the programming problem", "delay_s": 0.05,
     "text": "Easy.\n\n```python\nimport sys\nprint(sys.stdin.read()[:1])\n```"},
    {"match": "final answer", "text": "Thus.\n\n<final_answer>six</final_answer>\n\n\\boxed{six}"},
]
FLEET_EXTRA = {
    "scripted_llm": {"responses_api_models": {"scripted_model": {"rules": POLICY_RULES}}},
    "code_gen": {"resources_servers": {"code_gen": {"verify_timeout_s": VERIFY_TIMEOUT_S,
                                                    "unit_test_timeout_secs": 2}}},
    "judge_llm": {"responses_api_models": {"scripted_model": {
        "entrypoint": "app.py", "model": "judge", "rules": [{"match": ".", "delay_s": 3600, "text": "[[A=B]]"}]}}},
    "equivalence_llm_judge": {"resources_servers": {"equivalence_llm_judge": {
        "judge_model_server": "judge_llm", "judge_timeout_s": JUDGE_TIMEOUT_S, "judge_max_attempts": 1}}},
}
CONFIG_PATHS = ["configs/quickstart.yaml", "resources_servers/code_gen/configs/code_gen.yaml",
                "resources_servers/equivalence_llm_judge/configs/equivalence_llm_judge.yaml"]


@pytest.fixture(scope="module")
def fleet():
    with running_fleet([str(ROOT / path) for path in CONFIG_PATHS], FLEET_EXTRA) as running:
        yield running


@pytest.fixture
async def client(fleet):
    yield ServerClient(copy.deepcopy(fleet.config.data))
    await http.close()


def expected_keys(rows_file: Path, repeats: int, limit: int | None = None) -> set[tuple[int, int]]:
    tasks = len(rows_file.read_text().splitlines()[:limit])
    return {(task, rollout) for task in range(tasks) for rollout in range(repeats)}


def collection(rows_file: Path, agent: str, output: Path, repeats: int, **more: Any) -> RolloutCollectionConfig:
    return RolloutCollectionConfig(input_jsonl_fpath=str(rows_file), output_jsonl_fpath=str(output),
                                   agent_name=agent, num_repeats=repeats, **more)


async def wait_for_lines(path: Path, count: int, task: asyncio.Task) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists() or len(path.read_text().splitlines()) < count:
        assert not task.done(), f"the collection ended before {count} results: {task.result()}"
        assert time.monotonic() < deadline, f"fewer than {count} results in {path}"
        await asyncio.sleep(0.02)


def server_row(fleet, name: str) -> dict[str, Any]:
    rows = httpx.get(f"http://127.0.0.1:{fleet.config.head_port}/server_instances", timeout=10,
                     headers=fleet_headers(fleet)).json()
    return next(row for row in rows if row["process_name"] == name)


async def wait_back(fleet, name: str, restarts: int) -> None:
    """Until the supervisor has restarted `name` (`restarts` in all) and it serves again."""
    deadline = time.monotonic() + WAIT_S
    while (row := server_row(fleet, name))["status"] != "running" or row["restarts"] < restarts:
        assert row["status"] != "failed", f"{name} could not be brought back: {row}"
        assert time.monotonic() < deadline, f"{name} never came back: {row}"
        await asyncio.sleep(0.1)
    assert row["restarts"] == restarts, row


async def resume(client: ServerClient, config: RolloutCollectionConfig, expected: set) -> CollectionSummary:
    """Resume the collection; it must finish every rollout exactly once and supersede every failure row."""
    summary = await asyncio.wait_for(
        collect(config.model_copy(update={"resume_from_cache": True}), client, progress=False), WAIT_S)
    assert summary.exit_code == 0 and summary.stopped is None, summary
    outputs = Outputs.of(Path(config.output_jsonl_fpath))
    outputs.check_complete(expected)
    redone = {key(row) for row in outputs.results if "_ng_attempt_index" in row}
    assert redone == {key(row) for row in outputs.failures}, "exactly the failed rollouts were run again"
    return summary


# ---------------------------------------------------------------------------------------------- kill -9


KILLS = {  # victim -> (agent whose rollouts it serves, rows, repeats)
    "mcqa_simple_agent": ("mcqa_simple_agent", MCQA_ROWS, 16),
    "policy_model": ("mcqa_simple_agent", MCQA_ROWS, 16),
    "scripted_llm": ("mcqa_simple_agent", MCQA_ROWS, 16),
    "mcqa": ("mcqa_simple_agent", MCQA_ROWS, 16),
    "sandbox": ("code_gen_simple_agent", CODE_ROWS, 12),
}


@pytest.mark.parametrize("victim", list(KILLS))
async def test_a_server_killed_mid_collection_loses_nothing_and_resume_completes_it(fleet, client, tmp_path, victim):
    agent, rows, repeats = KILLS[victim]
    expected = expected_keys(rows, repeats)
    parallel = 4
    config = collection(rows, agent, tmp_path / "out.jsonl", repeats, num_samples_in_parallel=parallel)
    before = server_row(fleet, victim)
    task = asyncio.ensure_future(collect(config, client, progress=False))
    await wait_for_lines(tmp_path / "out.jsonl", 6, task)
    os.kill(before["pid"], signal.SIGKILL)
    summary = await asyncio.wait_for(task, WAIT_S)  # no hang

    outputs = Outputs.of(tmp_path / "out.jsonl")
    outputs.check_nothing_lost(expected, not_sent=summary.not_finished)
    # A restart costs only what was in flight: calls that cannot connect ride over it (`connect_retry_s`); at most
    # the rollouts in flight at the kill fail, plus one per keep-alive connection held to the dead process (a
    # request sent on one is reset and may have reached it, so it is not resent).
    assert len(outputs.failures) <= 2 * parallel, f"{len(outputs.failures)} rollouts failed for one restart"
    assert not summary.not_finished, "the collection went on through the restart"
    assert summary.ok == len(outputs.results) and sum(summary.failure_classes.values()) == len(outputs.failures)
    await wait_back(fleet, victim, before["restarts"] + 1)  # the supervisor brings it back by itself
    await resume(client, config, expected)
    fleet.poll()  # nothing past its restart budget


# ---------------------------------------------------------------------------------------------- stalls


async def test_a_judge_that_never_answers_gives_judge_failed_rows_within_the_deadline(client, tmp_path):
    config = collection(JUDGE_ROWS, "equivalence_llm_judge_simple_agent", tmp_path / "out.jsonl", 2)
    started = time.monotonic()
    summary = await asyncio.wait_for(collect(config, client, progress=False), WAIT_S)
    elapsed = time.monotonic() - started

    outputs = Outputs.of(tmp_path / "out.jsonl")
    outputs.check_nothing_lost(expected_keys(JUDGE_ROWS, 2))
    assert not outputs.results and summary.exit_code == 1
    assert {row["_ng_failure_class"] for row in outputs.failures} == {"judge_failed"}, "never a reward of 0"
    assert all("judge_llm" in row["failure"] and "reward" in row for row in outputs.failures)
    assert elapsed < WAIT_S  # each judge call gave up after JUDGE_TIMEOUT_S; the collection did not hang


async def test_a_sandbox_that_never_answers_gives_timeout_rows_within_the_deadline(fleet, client, tmp_path):
    sandbox = server_row(fleet, "sandbox")
    config = collection(CODE_ROWS, "code_gen_simple_agent", tmp_path / "out.jsonl", 1)
    os.kill(sandbox["pid"], signal.SIGSTOP)  # its socket still accepts (the kernel's backlog); nothing answers
    try:
        summary = await asyncio.wait_for(collect(config, client, progress=False), WAIT_S)
    finally:
        os.kill(sandbox["pid"], signal.SIGCONT)
    outputs = Outputs.of(tmp_path / "out.jsonl")
    outputs.check_nothing_lost(expected_keys(CODE_ROWS, 1))
    assert not outputs.results and summary.exit_code == 1
    assert {row["_ng_failure_class"] for row in outputs.failures} == {"verify_timeout"}
    assert all(f"longer than {VERIFY_TIMEOUT_S:g}s" in row["failure"] for row in outputs.failures)
    await resume(client, config, expected_keys(CODE_ROWS, 1))  # the sandbox answers again


# ---------------------------------------------------------------------------------------------- cut connections


def _with_port(data: dict[str, Any], instance: str, port: int) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for type_block in data[instance].values():
        for impl_block in type_block.values():
            impl_block.update(host="127.0.0.1", port=port)
    return data


@contextlib.contextmanager
def agent_in_process(data: dict[str, Any], name: str) -> Iterator[str]:
    """Instance `name` built from `data` and served in this process; yields its URL."""
    server = build_server(GlobalConfig.from_data(data).instance(name), data)
    with serve(server.create_app()) as url:
        yield url


CUTS = {  # hop -> (the instance behind the proxy, the path whose answers are cut)
    "collector->agent": ("mcqa_simple_agent", b"/run"),
    "agent->model": ("policy_model", b"/v1/responses"),
    "agent->resources": ("mcqa", b"/verify"),
}


@pytest.mark.parametrize("where", ["status_line", "body"])
@pytest.mark.parametrize("hop", list(CUTS))
async def test_a_connection_cut_mid_answer_is_a_typed_failure_never_a_blind_retry(fleet, client, tmp_path, hop, where):
    behind, path = CUTS[hop]
    target = fleet.config.instance(behind)
    cut = {"head_bytes": 10} if where == "status_line" else {"body_bytes": 5}
    config = collection(MCQA_ROWS, "mcqa_simple_agent", tmp_path / "out.jsonl", 2, num_samples_in_parallel=4)
    expected = expected_keys(MCQA_ROWS, 2)
    with CuttingProxy(("127.0.0.1", target.port), path, **cut) as proxy:
        data = _with_port(fleet.config.data, behind, proxy.port)
        if hop == "collector->agent":
            summary = await asyncio.wait_for(collect(config, ServerClient(data), progress=False), WAIT_S)
        else:
            with agent_in_process(data, "mcqa_simple_agent") as agent_url:
                to_agent = _with_port(fleet.config.data, "mcqa_simple_agent", int(agent_url.rsplit(":", 1)[1]))
                summary = await asyncio.wait_for(collect(config, ServerClient(to_agent), progress=False), WAIT_S)
    outputs = Outputs.of(tmp_path / "out.jsonl")
    outputs.check_nothing_lost(expected)
    assert not outputs.results and summary.exit_code == 1
    assert {row["_ng_failure_class"] for row in outputs.failures} == {"connection_error"}, outputs.failures[0]
    assert proxy.cuts == len(expected)
    assert proxy.requests[path.decode()] == len(expected), "a POST that may have run is not sent again"
    if hop != "collector->agent":
        assert all(row["_ng_failure_status"] == 502 and f"{proxy.url}{path.decode()}" in row["_ng_failure_detail"]
                   for row in outputs.failures), "the agent names the hop that failed"
    await resume(client, config, expected)


# ---------------------------------------------------------------------------------------------- disk full


@contextlib.contextmanager
def tiny_disk(folder: Path) -> Iterator[tuple[Any, str]]:
    """A folder that fills up: a 64 KiB tmpfs where mounting is allowed (root), else a 64 KiB `RLIMIT_FSIZE` on the
    collector process. Yields the child's `preexec_fn` and what freeing space takes (`remount` or `rlimit`)."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
                             capture_output=True).returncode == 0
    if mounted:
        try:
            yield None, "remount"
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=False)
        return

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    yield limit_file_size, "rlimit"


def test_a_full_disk_stops_the_collector_with_a_clear_error_and_resume_finishes_exactly_the_rest(fleet, tmp_path):
    folder = tmp_path / "out"
    repeats = 12
    expected = expected_keys(MCQA_ROWS, repeats)
    command = [sys.executable, "-m", "gymfleet.cli.collect", "+agent_name=mcqa_simple_agent",
               f"+input_jsonl_fpath={MCQA_ROWS}", f"+output_jsonl_fpath={folder}/out.jsonl",
               f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}", f"+num_repeats={repeats}",
               "+num_samples_in_parallel=4"]
    with tiny_disk(folder) as (preexec_fn, how):
        full = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, preexec_fn=preexec_fn)
        assert full.returncode not in (0, 1, 3), full.stdout + full.stderr
        [message] = [line for line in full.stderr.splitlines() if line.startswith("error:")]
        reason = "no space left on device" if how == "remount" else "file too large"
        assert f"{folder}/out.jsonl" in message and reason in message.lower(), full.stderr
        assert "+resume_from_cache=true" in message
        assert "Traceback" not in full.stderr
        outputs = Outputs.of(folder / "out.jsonl")  # every line parses
        outputs.check_nothing_lost(expected, not_sent=len(expected) - len(outputs.results) - len(outputs.failures))
        written = {key(row) for row in outputs.results}
        assert 0 < len(written) < len(expected)

        if how == "remount":
            subprocess.run(["mount", "-o", "remount,size=4m", str(folder)], check=True)
        resumed = subprocess.run([*command, "+resume_from_cache=true"], capture_output=True, text=True,
                                 timeout=WAIT_S)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        after = Outputs.of(folder / "out.jsonl")
        after.check_complete(expected)
        assert [key(row) for row in after.results[:len(written)]] == [key(row) for row in outputs.results]
        assert f"{len(written)} already done" in resumed.stdout


# ---------------------------------------------------------------------------------------------- the head server


async def test_the_head_server_going_away_mid_collection_does_not_stop_it(fleet, client, tmp_path):
    """Runs last: the module's fleet has no head server afterwards. Every client resolved its addresses at start
    (the collector from the head's config, each server from the config it was started with), so rollouts go on;
    the supervisor's `poll()` says the head died (ng_run stops the fleet: no `ng_status`, no new collection)."""
    repeats = 16
    config = collection(MCQA_ROWS, "mcqa_simple_agent", tmp_path / "out.jsonl", repeats, num_samples_in_parallel=4)
    task = asyncio.ensure_future(collect(config, client, progress=False))
    await wait_for_lines(tmp_path / "out.jsonl", 6, task)
    fleet._head.should_exit = True  # the head server is a thread of the supervisor: stop it alone
    fleet._head_thread.join(WAIT_S)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{fleet.config.head_port}/server_instances", timeout=5,
                  headers=fleet_headers(fleet))
    summary = await asyncio.wait_for(task, WAIT_S)
    assert summary.exit_code == 0, summary
    Outputs.of(tmp_path / "out.jsonl").check_complete(expected_keys(MCQA_ROWS, repeats))
    assert read_jsonl(tmp_path / "out_failures.jsonl") == []
    with pytest.raises(ServerCrashedError, match="head server"):  # and the supervisor says so (ng_run stops)
        fleet.poll()
