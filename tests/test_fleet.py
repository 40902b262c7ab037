"""The fleet as `ng_run` runs it: real subprocesses, the head server, crash reports, clean shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.readiness import ServerCrashedError
from gymfleet.fleet.supervisor import Fleet
from gymfleet.testing import fleet_headers, free_port, ng_status_all_live, processes_gone, running_fleet, wait_until

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = "configs/quickstart.yaml"
ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])


@pytest.fixture(scope="module")
def fleet():
    with running_fleet([QUICKSTART]) as running:
        yield running


def _head(fleet) -> str:
    return f"http://127.0.0.1:{fleet.config.head_port}"


def test_head_server_publishes_resolved_config_with_real_ports(fleet):
    text = httpx.get(_head(fleet) + "/global_config_dict_yaml", headers=fleet_headers(fleet)).json()
    published = yaml.safe_load(text)
    agent = published["mcqa_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert isinstance(agent["port"], int) and agent["port"] > 0
    assert httpx.get(f"http://127.0.0.1:{agent['port']}/", headers=fleet_headers(fleet)).json() == {"status": "ok"}
    model = published["policy_model"]["responses_api_models"]["vllm_model"]
    scripted = published["scripted_llm"]["responses_api_models"]["scripted_model"]
    assert model["base_url"] == f"http://127.0.0.1:{scripted['port']}/v1", "interpolation resolved after ports"


def test_head_server_never_publishes_secrets(fleet):
    published = yaml.safe_load(httpx.get(_head(fleet) + "/global_config_dict_yaml",
                                         headers=fleet_headers(fleet)).json())
    assert published["policy_api_key"] == "****"
    assert published["policy_model"]["responses_api_models"]["vllm_model"]["api_key"] == "****"


def test_head_server_publishes_environment_servers_for_nemo_gym_07_clients(fleet):
    published = yaml.safe_load(httpx.get(_head(fleet) + "/global_config_dict_yaml",
                                         headers=fleet_headers(fleet)).json())
    entry = published["mcqa_simple_agent_environment_server"]["environment_servers"]["legacy_agent"]
    agent = published["mcqa_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert entry["agent_server"] == {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
    assert (entry["host"], entry["port"]) == (agent["host"], agent["port"])


def test_server_instances_lists_live_processes(fleet):
    rows = httpx.get(_head(fleet) + "/server_instances", headers=fleet_headers(fleet)).json()
    assert {row["process_name"] for row in rows} == {"policy_model", "mcqa", "mcqa_simple_agent", "scripted_llm"}
    for row in rows:
        assert row["status"] == "running" and psutil.pid_exists(row["pid"])
        assert row["restarts"] == 0


def test_a_nemo_gym_client_runs_a_rollout_through_the_head_server(fleet):
    """What a 0.5-era NeMo-Gym client does: head config → agent named by agent_ref → POST /run."""
    published = yaml.safe_load(httpx.get(_head(fleet) + "/global_config_dict_yaml",
                                         headers=fleet_headers(fleet)).json())
    agent = published["mcqa_simple_agent"]["responses_api_agents"]["simple_agent"]
    row = {**ROW, "agent_ref": {"type": "responses_api_agents", "name": "mcqa_simple_agent"}}
    result = httpx.post(f"http://{agent['host']}:{agent['port']}/run", json=row, timeout=60,
                        headers=fleet_headers(fleet)).json()
    assert result["reward"] == 1.0 and result["extracted_answer"] == "B"
    assert result["agent_ref"] == row["agent_ref"]


def test_metrics_count_requests(fleet):
    port = fleet.config.instance("mcqa").port
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=fleet_headers(fleet)).text
    assert "gymfleet_requests_in_flight" in text and "gymfleet_request_seconds" in text


def test_with_exit_on_server_failure_a_crash_is_reported_with_its_last_output_and_shutdown_leaves_no_orphans():
    with running_fleet([QUICKSTART], {"exit_on_server_failure": True}) as fleet:
        victim = fleet.children["mcqa"].process
        servers = [psutil.Process(child.process.pid) for child in fleet.children.values()]  # not pids: reused
        victim.kill()
        victim.wait(5)
        with pytest.raises(ServerCrashedError, match="'mcqa' exited unexpectedly.*exit_on_server_failure=true"):
            fleet.poll()
    wait_until(lambda: processes_gone(servers), "the fleet's servers exited after its shutdown")


def test_configured_restart_brings_a_server_back():
    with running_fleet([QUICKSTART], {"restart_crashed_servers": 1}) as fleet:
        old = fleet.children["mcqa"].process
        old.kill()
        old.wait(5)
        fleet.poll()
        fleet._wait_ready(60)  # waits through the restart's backoff
        assert fleet.children["mcqa"].process.pid != old.pid and fleet.children["mcqa"].restarts == 1
        assert httpx.get(fleet.config.instance("mcqa").url + "/", headers=fleet_headers(fleet)).status_code == 200


def test_config_error_in_a_server_stops_startup_with_the_yaml_path():
    initial = {"config_paths": [QUICKSTART], "head_server": {"port": free_port()},
               "mcqa": {"resources_servers": {"mcqa": {"grading_mod": "lenient_boxed"}}}}
    config = parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                              skip_load_from_cli=True))
    with pytest.raises(ConfigError, match=r"mcqa\.resources_servers\.mcqa\.grading_mod.*grading_mode"):
        Fleet(config).start()


def test_num_workers_serves_one_port_from_several_processes():
    with running_fleet([QUICKSTART], {"mcqa": {"resources_servers": {"mcqa": {"num_workers": 2}}}}) as fleet:
        master = psutil.Process(fleet.children["mcqa"].process.pid)
        wait_until(lambda: len([p for p in master.children() if "spawn_main" in " ".join(p.cmdline())]) == 2,
                   "mcqa's two worker processes started", ignore=(psutil.NoSuchProcess,))
        url = fleet.config.instance("mcqa").url
        for _ in range(10):
            assert httpx.post(url + "/verify", json={**ROW, "response": {"output": []}},
                              headers=fleet_headers(fleet)).status_code == 200


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint-while-ignored"])
def test_ng_run_cli_starts_and_stops_on_a_signal(tmp_path, stop_signal):
    port = free_port()
    # Started with SIGINT ignored (`trap '' INT` survives exec), as a shell without job control starts `ng_run &`.
    command = (f"trap '' INT; exec {sys.executable} -m gymfleet.cli.run '+config_paths=[{QUICKSTART}]' "
               f"+head_server.port={port}")
    process = subprocess.Popen(["bash", "-c", command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "servers ready" in line:
            break
    assert "All 4 / 4 servers ready" in "".join(lines), "".join(lines)
    assert list(tmp_path.glob("gymfleet-*")), "the fleet's work folder is under TMPDIR"
    children = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(stop_signal)
    try:
        process.communicate(timeout=15)
    finally:
        process.kill()
    assert process.returncode == 0
    wait_until(lambda: processes_gone(children), "the stopped fleet's servers exited")
    assert not list(tmp_path.glob("gymfleet-*")), "a stopped fleet removes its work folder"


def test_ng_dump_config_hides_secrets(tmp_path):
    env = {**os.environ, "SECRET_KEY_FOR_TEST": "sk-very-secret"}
    out = subprocess.run(
        [sys.executable, "-m", "gymfleet.cli.dump_config", f"+config_paths=[{QUICKSTART}]",
         "++policy_api_key=${oc.env:SECRET_KEY_FOR_TEST}"],
        cwd=ROOT, capture_output=True, text=True, env=env, check=True,
    ).stdout
    assert "sk-very-secret" not in out and "api_key: '****'" in out


def test_cli_reports_config_errors_without_a_traceback():
    out = subprocess.run([sys.executable, "-m", "gymfleet.cli.run", "+config_paths=[configs/nope.yaml]"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "configs/nope.yaml" in out.stderr and "Traceback" not in out.stderr


def test_ng_status_lists_every_instance_as_live(fleet):
    out = ng_status_all_live(fleet.config.head_port)
    assert "4 / 4 live" in out.stdout
    assert out.stdout.splitlines()[0].split()[-3:] == ["STATUS", "RESTARTS", "LIVE"]
    for name in ("policy_model", "mcqa", "mcqa_simple_agent", "scripted_llm"):
        assert name in out.stdout


def test_ng_status_without_a_fleet_says_how_to_fix():
    out = subprocess.run([sys.executable, "-m", "gymfleet.cli.status", f"+head_server.port={free_port()}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is ng_run running?" in out.stderr


def test_access_log_only_when_asked():
    with running_fleet([QUICKSTART], {"uvicorn_logging_show_200_ok": True}) as fleet:
        url = fleet.config.instance("mcqa").url
        httpx.post(url + "/verify", json={**ROW, "response": {"output": []}}, headers=fleet_headers(fleet))
        wait_until(lambda: any('"POST /verify HTTP/1.1" 200' in line for line in fleet.children["mcqa"].tail),
                   "mcqa's access log line for the /verify reached the supervisor")  # read from its output by a thread


def test_servers_die_with_a_killed_supervisor(tmp_path):
    """SIGKILL to ng_run gives it no chance to clean up: its children's watchdog must (processes, work folder)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{QUICKSTART}]",
         f"+head_server.port={free_port()}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    for line in process.stdout:
        if "servers ready" in line:
            break
    children = psutil.Process(process.pid).children(recursive=True)
    assert len(children) >= 4
    process.kill()
    process.wait(5)
    process.stdout.close()
    gone, alive = psutil.wait_procs(children, timeout=60)  # a bound: the watchdog polls, then SIGTERMs, then SIGKILLs
    assert not alive, f"orphans: {alive}"
    assert not list(tmp_path.glob("gymfleet-*")), "the work folder of a killed supervisor is removed"
