"""local_vllm_model with real processes: the stand-in `fake_vllm.py` takes `vllm serve`'s command line and serves the
scripted model, so start-up, the health wait, serving (token capture included), a dying vLLM and the stop are the
real code paths on a machine without a GPU. One test starts it through `ng_run`, as a user would.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gymfleet.errors import ConfigError
from gymfleet.testing import fleet_headers, free_port, serve, wait_until
from responses_api_models.local_vllm_model import app as local_app
from responses_api_models.local_vllm_model.app import STAND_IN, LocalVLLMModel, LocalVLLMModelConfig

ROOT = Path(__file__).resolve().parents[3]
DEADLINE_S = 90  # a guard against hanging on a loaded machine, never a speed assertion
FLEET_DEADLINE_S = 200  # past ng_run's own 180 s start limit: ng_run reports a slow start itself
QUESTION = {"input": [{"role": "user", "content": "What is 2+2?"}]}
RULES = [{"match": r"2\+2", "reasoning": "Add them.", "text": "\\boxed{4}"}]


def config(**fields) -> dict:
    return {"name": "local_policy", "model": "tiny-model", "executable": str(STAND_IN), "stop_grace_s": 0.5,
            "uses_reasoning_parser": True,
            **fields}


def gone(pid: int) -> bool:
    """The process no longer exists (or is a zombie awaiting its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_ready(url: str) -> dict:
    status = wait_for(lambda: (s := httpx.get(url + "/vllm_status").json())["state"] != "starting" and s, "vLLM")
    assert status["state"] == "ready", status
    return status


def wait_for(predicate, what: str, explain=None, deadline_s: float = DEADLINE_S):
    return wait_until(predicate, what, timeout_s=deadline_s, interval_s=0.1, explain=explain)


# ---------------------------------------------------------------------------------------------- config, no process


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, ["serve", "tiny-model", "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "tiny-model",
              "--tensor-parallel-size", "1", "--data-parallel-size", "1"]),
        ({"model_path": "/models/q", "tensor_parallel_size": 2, "data_parallel_size": 4, "extra_args": ["--x", "1"]},
         ["serve", "/models/q", "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "tiny-model",
          "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--x", "1"]),
        ({"vllm_serve_kwargs": {"tensor_parallel_size": 8, "data_parallel_size": 2, "trust_remote_code": True,
                                "enforce_eager": False, "quantization": None, "gpu_memory_utilization": 0.9,
                                "model_loader_extra_config": {"num_threads": 16}}},
         ["serve", "tiny-model", "--host", "127.0.0.1", "--port", "8123", "--served-model-name", "tiny-model",
          "--tensor-parallel-size", "8", "--data-parallel-size", "2", "--trust-remote-code",
          "--gpu-memory-utilization", "0.9", "--model-loader-extra-config", '{"num_threads":16}']),
    ],
    ids=["defaults", "fields", "nemo_gym_kwargs"],
)
def test_command_line(fields, expected):
    assert LocalVLLMModelConfig(**config(vllm_port=8123, **fields)).serve_args() == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"base_url": "http://elsewhere:8000/v1"}, "base_url is derived"),
        ({"model": ""}, "set model"),
        ({"num_workers": 4}, "num_workers must be 1"),
        ({"vllm_serve_kwargs": {"port": 9000}}, "vllm_serve_kwargs.port: set the field `vllm_port`"),
        ({"tensor_parallel_size": 2, "vllm_serve_kwargs": {"tensor_parallel_size": 4}}, "give it once"),
        ({"healt_timeout_s": 5}, "healt_timeout_s"),
    ],
    ids=["base_url", "no_model", "workers", "reserved_kwarg", "conflicting_sizes", "typo"],
)
def test_bad_config_is_refused(fields, message):
    with pytest.raises(ValidationError, match=message):
        LocalVLLMModelConfig(**config(**fields))


def test_missing_executable_names_it_and_how_to_install():
    with pytest.raises(ConfigError) as error:
        LocalVLLMModel(config(executable="vllm-not-installed-here"))
    text = str(error.value)
    assert "'vllm-not-installed-here'" in text and "pip install 'gymfleet[vllm]'" in text
    assert "local_policy.responses_api_models.local_vllm_model.executable" in text
    with pytest.raises(ConfigError, match="missing_fake.py does not exist"):
        LocalVLLMModel(config(executable="/nowhere/missing_fake.py"))


def test_unset_executable_is_vllm_unless_the_environment_names_another(monkeypatch):
    monkeypatch.setenv("GYMFLEET_VLLM_EXECUTABLE", str(STAND_IN))
    assert LocalVLLMModel(config(executable=None)).command[:2] == [sys.executable, str(STAND_IN)]
    monkeypatch.delenv("GYMFLEET_VLLM_EXECUTABLE")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="'vllm' is not found"):
        LocalVLLMModel(config(executable=None))


# ---------------------------------------------------------------------------------------------- real processes


def test_serves_through_its_own_vllm_and_stops_its_whole_group(tmp_path, caplog, monkeypatch):
    """Start (waiting for /health, saying so), serve /v1/responses with token capture, stop: nothing left."""
    monkeypatch.setattr(local_app, "HEALTH_LOG_EVERY_S", 0.2)
    caplog.set_level(logging.INFO, logger=local_app.__name__)
    env = {"FAKE_VLLM_RULES": json.dumps(RULES), "FAKE_VLLM_ARGV_FILE": str(tmp_path / "argv.json"),
           "FAKE_VLLM_WORKER_PID_FILE": str(tmp_path / "worker.pid"), "FAKE_VLLM_START_DELAY_S": "1"}
    server = LocalVLLMModel(config(return_token_id_information=True, vllm_serve_env_vars=env,
                                   extra_args=["--max-model-len", "4096"]))
    with serve(server.create_app()) as url:
        # The fake sleeps 1 s before it even imports: vLLM is still starting when `serve` returns.
        live = httpx.get(url + "/")
        assert live.status_code == 503 and live.json()["status"] == "vLLM starting"
        early = httpx.post(url + "/v1/responses", json=QUESTION, timeout=30)
        assert early.status_code == 502 and "vLLM is starting" in early.json()["detail"]
        status = wait_ready(url)
        assert status["restarts"] == 0 and httpx.get(url + "/").status_code == 200
        assert json.loads((tmp_path / "argv.json").read_text()) == server.command[2:]
        assert server.command[-2:] == ["--max-model-len", "4096"]
        answer = httpx.post(url + "/v1/responses", json=QUESTION, timeout=30)
        assert answer.status_code == 200, answer.text
        items = answer.json()["output"]
        assert items[-1]["content"][0]["text"] == "\\boxed{4}" and answer.json()["model"] == "tiny-model"
        assert len(items[-1]["generation_token_ids"]) == len(items[-1]["generation_log_probs"]) > 0
        assert items[-1]["prompt_token_ids"]
        vllm_pid, worker_pid = status["pid"], int((tmp_path / "worker.pid").read_text())
        assert not gone(vllm_pid) and not gone(worker_pid)
    # The worker ignores SIGTERM: only the SIGKILL to the whole group after stop_grace_s ends it (the kernel may
    # take a moment to finish it on a loaded machine).
    wait_for(lambda: gone(vllm_pid) and gone(worker_pid), "the vLLM group to die after SIGKILL")
    assert server.status()["state"] == "stopped"
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith(f"started vLLM, pid {vllm_pid}: ") and "/health to answer 200" in m for m in messages)
    assert any(m.startswith(f"still waiting for vLLM (pid {vllm_pid})") for m in messages)
    assert any("still alive 0.5 s after SIGTERM: SIGKILL" in m for m in messages)


def test_a_dead_vllm_is_restarted_then_reported_failed(caplog):
    """vLLM killed: restarted on the same port (bounded); past max_restarts, requests fail typed at once."""
    caplog.set_level(logging.INFO, logger=local_app.__name__)
    server = LocalVLLMModel(config(max_restarts=1, vllm_serve_env_vars={"FAKE_VLLM_RULES": json.dumps(RULES)}))
    with serve(server.create_app()) as url:
        first = wait_ready(url)["pid"]
        os.kill(first, signal.SIGKILL)
        status = wait_for(lambda: (s := httpx.get(url + "/vllm_status").json())["restarts"] == 1
                          and s["state"] == "ready" and s, "the restart")
        assert status["pid"] != first and status["last_exit"] == "signal SIGKILL"
        assert status["url"] == server.root_url  # same port: base_url stays valid
        assert httpx.post(url + "/v1/responses", json=QUESTION, timeout=30).status_code == 200

        os.kill(status["pid"], signal.SIGKILL)
        status = wait_for(lambda: (s := httpx.get(url + "/vllm_status").json())["state"] == "failed" and s,
                          "the failed state")
        assert "max_restarts=1" in status["failure"]
        answer = httpx.post(url + "/v1/responses", json=QUESTION, timeout=30)
        assert answer.status_code == 502 and answer.json()["error_type"] == "connection_error"
        assert "vLLM is failed" in answer.json()["detail"]
    messages = [record.getMessage() for record in caplog.records]
    assert any(f"vLLM (pid {first}) exited unexpectedly with signal SIGKILL" in m for m in messages)
    assert any("restarting vLLM on port" in m and "(restart 1/1)" in m for m in messages)


def failed_start(server: LocalVLLMModel) -> dict:
    with serve(server.create_app()) as url:
        status = wait_for(lambda: (s := httpx.get(url + "/vllm_status").json())["state"] == "failed" and s,
                          "the failed start")
        live = httpx.get(url + "/")
        assert live.status_code == 503 and live.json() == {"status": "vLLM failed", "failure": status["failure"]}
    return status


def test_vllm_exiting_at_start_fails_the_start_with_its_output():
    status = failed_start(LocalVLLMModel(config(extra_args=["--tensor-parallel-size", "two"])))
    assert "vLLM exited with code 2 before answering" in status["failure"]
    assert "invalid int value: 'two'" in status["failure"]  # its last output lines
    assert status["restarts"] == 0


def test_vllm_not_healthy_in_time_fails_the_start_and_is_stopped():
    status = failed_start(LocalVLLMModel(config(health_timeout_s=0.5,
                                                vllm_serve_env_vars={"FAKE_VLLM_START_DELAY_S": "60"})))
    assert re.search(r"did not answer http://127\.0\.0\.1:\d+/health with 200 within 0\.5 s \(health_timeout_s",
                     status["failure"]), status["failure"]
    assert gone(status["pid"])


def test_ng_run_starts_and_stops_it(tmp_path):
    """The fleet way: ng_run starts it, a rollout call goes through, Ctrl-C leaves no vLLM process behind."""
    port, head_port = free_port(), free_port()
    recipe = tmp_path / "local.yaml"
    recipe.write_text(json.dumps({"policy_model": {"responses_api_models": {"local_vllm_model": {
        "entrypoint": "app.py", "model": "${policy_model_name}", "port": port, "stop_grace_s": 1,
        "uses_reasoning_parser": True, "executable": str(STAND_IN),
        "vllm_serve_env_vars": {"FAKE_VLLM_RULES": json.dumps(RULES),
                                "FAKE_VLLM_WORKER_PID_FILE": str(tmp_path / "worker.pid")}}}}}))
    log = tmp_path / "ng_run.log"
    with log.open("w") as out:
        fleet = subprocess.Popen([sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{recipe}]",
                                  "+policy_model_name=tiny-model", f"+head_server.port={head_port}"],
                                 cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "servers ready!" in log.read_text() or fleet.poll() is not None, "ng_run",
                 lambda: log.read_text()[-3000:], deadline_s=FLEET_DEADLINE_S)
        assert fleet.poll() is None, log.read_text()[-3000:]
        url = f"http://127.0.0.1:{port}"
        token = fleet_headers(head_port)  # the token file ng_run wrote for its head address
        answer = httpx.post(url + "/v1/responses", json=QUESTION, timeout=30, headers=token)
        assert answer.status_code == 200 and answer.json()["output"][-1]["content"][0]["text"] == "\\boxed{4}"
        vllm_pid = httpx.get(url + "/vllm_status", headers=token).json()["pid"]
        worker_pid = int((tmp_path / "worker.pid").read_text())
        fleet.send_signal(signal.SIGINT)
        assert fleet.wait(timeout=60) == 0, log.read_text()[-3000:]
        wait_for(lambda: gone(vllm_pid) and gone(worker_pid), "the vLLM group to die", lambda: log.read_text()[-3000:])
        assert "waiting up to 1800 s (health_timeout_s)" in log.read_text()
    finally:
        if fleet.poll() is None:
            os.killpg(fleet.pid, signal.SIGKILL)
            fleet.wait()
