"""compose.yaml brought up for real on a container engine (Podman's Docker API from
scripts/install_container_engine.sh, or the engine DOCKER_HOST names), with Debian's docker-compose.

The image builds from docker/Dockerfile on the local base image (`GYMFLEET_BASE_IMAGE`: Debian's python3 without
pip packages, so the build installs gymfleet's dependencies from PyPI; this host's extra CA certificates go in as
`GYMFLEET_EXTRA_CA_CERTS` for a TLS-inspecting proxy), `docker-compose up -d` starts `sandbox` and `fleet`, both
health checks turn healthy, a code_gen rollout through the compose fleet's head server scores 1.0 with its tests run
by the sandbox service, and `docker-compose down` leaves no container or network of the project.

Podman runs health checks from systemd timers; where there is no systemd (this CI machine) the test runs each
container's health check itself every few seconds through Podman's API (`podman healthcheck run`), as the timer
would. Docker runs its own. The first build on a host takes minutes (PyPI); later ones reuse the cached layers.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet import auth
from gymfleet.testing import free_port, serve
from resources_servers.swebench.containers import connect, docker_host
from responses_api_models.scripted_model.app import ScriptedModel
from tests.test_compose import CODE_GEN_ROW, COMPOSE, COMPOSE_VARS, PROGRAM, ROOT

BASE_IMAGE = os.environ.get("GYMFLEET_TEST_BASE_IMAGE", "localhost/gymfleet-base:bookworm")
IMAGE = "localhost/gymfleet:compose-test"
HEALTHY_TIMEOUT_S = 600  # a slow shared machine: the fleet imports every server before it answers


@pytest.fixture(scope="module")
def engine():
    try:
        client = connect()
    except Exception as exc:  # noqa: BLE001 - ConfigError or the SDK's: either way the test cannot run
        pytest.fail(f"{exc} Run scripts/install_container_engine.sh (the README's test command does).")
    yield client
    client.close()


def compose(project: str, env: dict[str, str], *args: str, timeout_s: float = 1800) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: run scripts/install_test_tools.sh"
    return subprocess.run([exe, "-f", str(COMPOSE), "-p", project, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def is_podman(engine) -> bool:
    return any("podman" in str(part.get("Name", "")).lower() for part in engine.version().get("Components", []))


def health(engine, container) -> str:
    container.reload()
    return (container.attrs.get("State", {}).get("Health") or {}).get("Status", "none")


class HealthTimer(threading.Thread):
    """Podman's health-check timer, where no systemd runs one: every `interval_s`, each project container's check
    through Podman's API (`podman healthcheck run`). Within the check's start period a failure must not count (as
    Docker and Podman's timer have it), so there the check's command is tried with `exec` first and the counted
    check runs only once it passes."""

    def __init__(self, engine, project: str, interval_s: float = 3.0):
        super().__init__(daemon=True)
        self.engine, self.project, self.interval_s = engine, project, interval_s
        self.first_seen: dict[str, float] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        api = self.engine.api
        while not self.stopped.wait(self.interval_s):
            try:
                for container in self.engine.containers.list(
                        filters={"label": f"com.docker.compose.project={self.project}"}):
                    container.reload()  # the list's summary lacks the health-check settings
                    check = container.attrs.get("Config", {}).get("Healthcheck") or {}
                    if not check.get("Test"):
                        continue
                    seen = self.first_seen.setdefault(container.id, time.monotonic())
                    starting = time.monotonic() - seen < (check.get("StartPeriod") or 0) / 1e9
                    if starting and container.exec_run(check["Test"][1:]).exit_code != 0:
                        continue
                    api.get(f"{api.base_url}/v4.0.0/libpod/containers/{container.id}/healthcheck", timeout=60)
            except Exception:  # noqa: BLE001 - a container coming or going; the next round retries
                continue


def test_compose_up_serves_a_code_gen_rollout_with_the_sandbox_service(engine, tmp_path):
    project = f"gymfleet-test-{os.getpid()}"
    sandbox_port, head_port = free_port(), free_port()
    script = ScriptedModel({"rules": [{"match": "largest value of a_j - a_i", "text": PROGRAM}],
                            "default": {"text": "I am not sure."}})
    environ = {key: value for key, value in os.environ.items()
               if key not in COMPOSE_VARS and not key.startswith("COMPOSE_")}
    timer = HealthTimer(engine, project) if is_podman(engine) else None
    with serve(script.create_app()) as llm:
        env = {**environ, "DOCKER_HOST": docker_host(), "GYMFLEET_IMAGE": IMAGE, "GYMFLEET_BASE_IMAGE": BASE_IMAGE,
               "GYMFLEET_EXTRA_CA_CERTS": "".join(Path(p).read_text() for p in
                                                  sorted(glob.glob("/usr/local/share/ca-certificates/*.crt"))),
               "SANDBOX_PORT": str(sandbox_port), "SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
               "HEAD_SERVER_PORT": str(head_port), "POLICY_BASE_URL": f"{llm}/v1", "POLICY_MODEL_NAME": "scripted",
               "GYMFLEET_CONFIG_PATHS": "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml,"
                                        "resources_servers/code_gen/configs/code_gen.yaml,docker/external_sandbox.yaml"}
        try:
            started = time.perf_counter()
            built = compose(project, env, "build")
            assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
            print(f"\nbuild: {time.perf_counter() - started:.1f}s", flush=True)
            started = time.perf_counter()
            if timer is not None:
                timer.start()
            up = compose(project, env, "up", "-d")
            assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
            containers = {c.labels["com.docker.compose.service"]: c for c in engine.containers.list(
                all=True, filters={"label": f"com.docker.compose.project={project}"})}
            assert set(containers) == {"sandbox", "fleet"}
            deadline = time.monotonic() + HEALTHY_TIMEOUT_S
            while {name: health(engine, c) for name, c in containers.items()} != {"sandbox": "healthy",
                                                                                     "fleet": "healthy"}:
                states = {name: (c.status, health(engine, c)) for name, c in containers.items()}
                logs = {name: c.logs(tail=30).decode(errors="replace") for name, c in containers.items()}
                assert time.monotonic() < deadline, f"not healthy: {states}\n{logs}"
                assert all(c.status == "running" for c in containers.values()), f"{states}\n{logs}"
                time.sleep(2)
            print(f"up and healthy: {time.perf_counter() - started:.1f}s")

            head = f"http://127.0.0.1:{head_port}"
            assert httpx.get(head + "/global_config_dict_yaml", timeout=30).status_code == 401  # the fleet's token
            # A user on the host reads the token ng_run wrote in the fleet's container, as docs/security.md says.
            read = containers["fleet"].exec_run(["sh", "-c", "cat ~/.cache/gymfleet/tokens/head-*.token"])
            assert read.exit_code == 0, read.output
            token = {auth.TOKEN_HEADER: read.output.decode().strip()}
            answer = httpx.get(head + "/global_config_dict_yaml", headers=token, timeout=30)
            assert answer.status_code == 200, f"{answer.status_code}: {answer.text[:500]}"
            published = yaml.safe_load(answer.json())
            assert published["code_gen"]["resources_servers"]["code_gen"]["sandbox_url"] == env["SANDBOX_URL"]
            agent = published["code_gen_simple_agent"]["responses_api_agents"]["simple_agent"]
            result = httpx.post(f"http://{agent['host']}:{agent['port']}/run",
                                content=CODE_GEN_ROW.read_text().splitlines()[0], timeout=300,
                                headers={"content-type": "application/json", **token}).json()
            assert "_ng_failure_class" not in result, result.get("failure")
            assert result["reward"] == 1.0, "the program passed its tests in the sandbox service"
            metrics = httpx.get(env["SANDBOX_URL"] + "/metrics", timeout=30).text
            assert re.search(r'gymfleet_requests_total\{[^}]*route="/run_batch"[^}]*\} [1-9]', metrics), \
                "the sandbox service (the container) ran the tests"
        finally:
            if timer is not None:
                timer.stopped.set()
            started = time.perf_counter()
            down = compose(project, env, "down", "--timeout", "30", timeout_s=300)
            print(f"down: {time.perf_counter() - started:.1f}s")
    assert down.returncode == 0, down.stderr[-3000:]
    assert not engine.containers.list(all=True, filters={"label": f"com.docker.compose.project={project}"})
    assert not [n.name for n in engine.networks.list() if n.name.startswith(project)]
