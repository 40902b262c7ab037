"""One crash does not stop the fleet (ARCHITECTURE decision 5b): a killed server comes back on its own port, the
others keep serving, calls in flight to it fail typed, and only a server past its restart budget stops the fleet."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from gymfleet.errors import ConfigError
from gymfleet.fleet import supervisor
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.readiness import ServerCrashedError
from gymfleet.fleet.run_helper import RunHelper
from gymfleet.fleet.supervisor import Fleet, PortInUseError
from gymfleet.testing import fleet_headers, free_port, ng_status_all_live, running_fleet
from tests.fault_tools import WAIT_S, wait_for

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = "configs/quickstart.yaml"
ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])
AGENT_REF = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}


def instances(head_port: int) -> dict[str, dict]:
    rows = httpx.get(f"http://127.0.0.1:{head_port}/server_instances", timeout=10,
                     headers=fleet_headers(head_port)).json()
    return {row["process_name"]: row for row in rows}


def back_running(head_port: int, name: str, restarts: int) -> dict | None:
    """The `/server_instances` row of `name` once it runs again after `restarts` restarts, else None."""
    row = instances(head_port)[name]
    return row if (row["status"], row["restarts"]) == ("running", restarts) else None


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=5).json() == {"status": "ok"}
    except httpx.HTTPError:
        return False


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def rollout(agent_url: str) -> httpx.Response:
    return httpx.post(agent_url + "/run", json={**ROW, "agent_ref": AGENT_REF}, timeout=120,
                      headers=fleet_headers())


# ---------------------------------------------------------------------------------------------- in process


def test_a_killed_server_comes_back_on_its_port_while_the_others_keep_serving():
    with running_fleet([QUICKSTART]) as fleet:  # the default policy: restart
        head = fleet.config.head_port
        mcqa = fleet.config.instance("mcqa")
        before = instances(head)["mcqa"]
        assert (before["status"], before["restarts"]) == ("running", 0)
        process = fleet.children["mcqa"].process
        process.kill()
        process.wait(10)
        assert instances(head)["mcqa"]["status"] == "restarting"
        for name in ("scripted_llm", "policy_model", "mcqa_simple_agent"):
            assert answers(fleet.config.instance(name).url), f"{name} keeps serving"
        fleet.poll()  # the crash is not an error

        row = wait_for(lambda: back_running(head, "mcqa", 1), "mcqa running again with restarts=1")
        assert row["pid"] != before["pid"] and psutil.pid_exists(row["pid"])
        assert (row["host"], row["port"], row["url"]) == (before["host"], before["port"], mcqa.url), "same address"
        assert answers(mcqa.url)
        result = rollout(fleet.config.instance("mcqa_simple_agent").url)
        assert result.status_code == 200 and result.json()["reward"] == 1.0, "the agent reaches it at its address"
        metrics = httpx.get(f"http://127.0.0.1:{head}/metrics", timeout=10, headers=fleet_headers(fleet)).text
        assert 'gymfleet_server_restarts_total{instance="mcqa"} 1.0' in metrics
        assert 'gymfleet_server_restarts_total{instance="scripted_llm"} 0.0' in metrics
        fleet.poll()


def test_a_call_in_flight_to_a_killed_server_ends_as_a_typed_failure_and_the_next_one_succeeds():
    """The model call of a /run is held by scripted_llm (`delay_s`) when scripted_llm is killed: the /run answers
    `connection_error` at once (no hang, no retry of a POST that may have run); the restarted server serves again."""
    slow = {"match": "shortest orbital period", "text": "\\boxed{B}", "delay_s": 3600}
    fast = {"match": "binary search", "text": "\\boxed{B}"}
    extra = {"scripted_llm": {"responses_api_models": {"scripted_model": {"rules": [slow, fast]}}}}
    with running_fleet([QUICKSTART], extra) as fleet:
        llm = fleet.config.instance("scripted_llm").url
        agent = fleet.config.instance("mcqa_simple_agent").url
        answer: dict[str, httpx.Response] = {}
        call = threading.Thread(target=lambda: answer.setdefault("run", rollout(agent)))
        call.start()
        wait_for(lambda: _in_flight(llm) >= 2, "the model call held by scripted_llm")  # it, and this /metrics
        kill(fleet.children["scripted_llm"].process.pid)
        call.join(WAIT_S)
        assert not call.is_alive(), "the /run hangs"
        assert answer["run"].status_code == 502
        body = answer["run"].json()
        assert body["error_type"] == "connection_error" and "policy_model" in body["detail"], body

        wait_for(lambda: back_running(fleet.config.head_port, "scripted_llm", 1), "scripted_llm back")
        question = next(line for line in (ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()
                        if "binary search" in line)
        again = httpx.post(agent + "/run", json={**json.loads(question), "agent_ref": AGENT_REF}, timeout=120,
                           headers=fleet_headers(fleet))
        assert again.status_code == 200 and again.json()["reward"] == 1.0
        fleet.poll()


def _in_flight(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10, headers=fleet_headers()).text
    [line] = [line for line in text.splitlines() if line.startswith("gymfleet_requests_in_flight ")]
    return float(line.split()[-1])


WEATHER = "resources_servers/example_weather/configs/example_weather.yaml"
WEATHER_ROW = json.loads((ROOT / "resources_servers/example_weather/data/example.jsonl").read_text().splitlines()[0])


def test_a_tool_call_whose_session_died_with_the_environment_ends_the_episode_as_session_lost():
    """example_weather keeps each rollout's calls in memory. A rollout seeded before the server crashed and came
    back is not played on to a reward of 0 on an empty session: its next tool call is a 410 `session_lost`, which
    the agent answers as a typed 502, not a tool output for the model to read."""
    city = WEATHER_ROW["expected_city"]
    look_up = {"match": city, "match_in": "transcript", "text": "Let me look that up.",
               "tool_calls": [{"name": "get_weather", "arguments": {"city": city}}]}
    extra = {"scripted_llm": {"responses_api_models": {"scripted_model": {"rules": [look_up]}}}}
    with running_fleet([QUICKSTART, WEATHER], extra) as fleet:
        env = fleet.config.instance("example_weather").url
        agent = fleet.config.instance("example_weather_simple_agent").url
        seeded = httpx.post(env + "/seed_session", json=WEATHER_ROW, timeout=30, headers=fleet_headers(fleet))
        assert seeded.status_code == 200
        kill(fleet.children["example_weather"].process.pid)
        wait_for(lambda: back_running(fleet.config.head_port, "example_weather", 1), "example_weather back")

        # The rest of that rollout's episode, through the agent, with the session cookie of the process that died.
        answer = httpx.post(agent + "/v1/responses", json=WEATHER_ROW["responses_create_params"],
                            cookies=dict(seeded.cookies), timeout=120, headers=fleet_headers(fleet))
        assert answer.status_code == 502, answer.text
        body = answer.json()
        assert body["error_type"] == "session_lost" and "earlier process" in body["detail"], body

        again = httpx.post(agent + "/run", json=WEATHER_ROW, timeout=120,
                           headers=fleet_headers(fleet))  # the same row, run again, is served
        assert again.status_code == 200, again.text
        calls = [item for item in again.json()["response"]["output"] if item["type"] == "function_call_output"]
        assert calls and all("session_lost" not in call["output"] for call in calls)
        fleet.poll()


def test_a_port_taken_while_the_server_was_down_stops_the_fleet_with_the_port_named(monkeypatch):
    monkeypatch.setattr(supervisor, "PORT_FREE_TIMEOUT_S", 1.0)  # how long a restart waits for its port (10 s)
    monkeypatch.setattr(supervisor, "RESTART_BACKOFF_S", 0.1)
    with running_fleet([QUICKSTART]) as fleet:
        mcqa = fleet.config.instance("mcqa")
        process = fleet.children["mcqa"].process
        process.kill()
        process.wait(10)
        with socket.socket() as stranger:
            stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not stop it
            stranger.bind((mcqa.host, mcqa.port))
            stranger.listen()
            with pytest.raises(PortInUseError, match=rf"port {mcqa.port} \(mcqa\.resources_servers\.mcqa\.port\)"):
                wait_for(lambda: fleet.poll(), "poll() raising")
        assert instances(fleet.config.head_port)["mcqa"]["status"] == "failed"
        assert answers(fleet.config.instance("scripted_llm").url), "the others still serve"


def test_run_helper_poll_restarts_and_raises_only_past_the_budget():
    """NeMo-RL's path: `poll()` is its health check."""
    initial = {"config_paths": [QUICKSTART], "head_server": {"host": "127.0.0.1", "port": free_port()},
               "restart_crashed_servers": 1}
    rh = RunHelper()
    rh.start(GlobalConfigDictParserConfig(initial_global_config_dict=initial, skip_load_from_cli=True))
    try:
        head = rh.config.head_port
        kill(instances(head)["mcqa"]["pid"])
        rh.poll()
        wait_for(lambda: rh.poll() or back_running(head, "mcqa", 1), "mcqa back, poll() quiet meanwhile")
        kill(instances(head)["mcqa"]["pid"])
        past_budget = r"'mcqa' exited unexpectedly .*restart_crashed_servers=1"
        with pytest.raises(ServerCrashedError, match=past_budget) as caught:
            wait_for(lambda: rh.poll(), "poll() raising")
        assert isinstance(caught.value, RuntimeError), "what NeMo-RL's health check expects"
    finally:
        rh.shutdown()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [("restart_crashed_servers", -1, "expected a whole number >= 0, got -1"),
     ("restart_crashed_servers", "often", "expected a whole number >= 0, got 'often'"),
     ("exit_on_server_failure", "yes", "expected true or false, got 'yes'")],
)
def test_a_bad_restart_setting_is_a_config_error_naming_the_key(key, value, message):
    config = parse_global_config(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [QUICKSTART], key: value}, skip_load_from_cli=True))
    with pytest.raises(ConfigError, match=rf"{key}: {message}") as caught:
        Fleet(config)
    assert caught.value.path == key and f"+{key}=" in str(caught.value)


# ---------------------------------------------------------------------------------------------- ng_run


@contextlib.contextmanager
def ng_run(*args: str) -> Iterator[tuple[subprocess.Popen, int, list[str]]]:
    """`ng_run` on the quickstart config as a user starts it; yields it, its head port and its stdout lines so far."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{QUICKSTART}]", f"+head_server.port={port}",
         *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "servers ready" in line:
                break
        assert "All 4 / 4 servers ready" in "".join(lines), "".join(lines) + process.stderr.read()
        yield process, port, lines
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()
        process.stderr.close()


def ng_status(port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gymfleet.cli.status", f"+head_server.port={port}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_ng_run_restarts_a_killed_server_shows_it_in_ng_status_and_stops_past_the_budget():
    with ng_run("+restart_crashed_servers=1") as (process, port, lines):
        servers = [row["pid"] for row in instances(port).values()]
        mcqa_port = instances(port)["mcqa"]["port"]
        kill(instances(port)["mcqa"]["pid"])
        wait_for(lambda: back_running(port, "mcqa", 1), "mcqa back")

        table = ng_status_all_live(port)  # the head says running a moment before a probe of it may say live
        header, *rows = table.stdout.splitlines()
        assert header.split()[5:8] == ["STATUS", "RESTARTS", "LIVE"]
        cells = {row.split()[0]: row.split() for row in rows[:-1]}
        assert cells["mcqa"][5:8] == ["running", "1", "yes"] and cells["scripted_llm"][5:8] == ["running", "0", "yes"]
        report = json.loads(ng_status(port, "+json=true").stdout)
        restarts = {item["process_name"]: (item["restarts"], item["status"]) for item in report["instances"]}
        assert restarts["mcqa"] == (1, "running") and restarts["policy_model"] == (0, "running")

        kill(instances(port)["mcqa"]["pid"])
        out, err = process.communicate(timeout=WAIT_S)
        out = "".join(lines) + out
        assert process.returncode == 1, out + err
        [message] = [line for line in err.splitlines() if line.startswith("error:")]
        assert "server 'mcqa' exited unexpectedly with code -9 (SIGKILL)" in message
        assert "restart_crashed_servers=1" in message and "cannot be brought back" in message
        assert out.count("server 'mcqa' exited unexpectedly") == 1, "each restart is logged once"
        assert out.count("restarting it in 1s (attempt 1/1 within 600s)") == 1
        assert out.count(f"server 'mcqa' is back on port {mcqa_port} (restart 1/1)") == 1
    _assert_gone(servers)


def test_ng_run_with_exit_on_server_failure_stops_at_the_first_crash():
    with ng_run("+exit_on_server_failure=true") as (process, port, lines):
        servers = [row["pid"] for row in instances(port).values()]
        kill(instances(port)["mcqa"]["pid"])
        out, err = process.communicate(timeout=WAIT_S)
        assert process.returncode == 1, out + err
        [message] = [line for line in err.splitlines() if line.startswith("error:")]
        assert "'mcqa' exited unexpectedly" in message and "not restarted (exit_on_server_failure=true)" in message
        assert "restarting it" not in out
    _assert_gone(servers)


def _assert_gone(pids: list[int]) -> None:
    def gone() -> bool:
        return not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    wait_for(gone, f"every server process of the stopped fleet gone: {pids}")
