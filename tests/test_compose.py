"""compose.yaml, checked without a Docker engine: Debian's docker-compose validates and renders it, and each
service's command (and health check) is run here for real, as the project installs it.

`docker-compose` comes from scripts/install_test_tools.sh (the README's test command and .ci/run call it). A file
docker-compose cannot load fails here with its message; a command the project does not accept fails when it runs:
the fleet's command through `ng_run +dry_run=true` for the default recipe, and the sandbox and a small fleet started
for real from the rendered commands, each reaching healthy by its own health check, with code_gen grading a program
in the sandbox service (the fleet has no sandbox of its own). The same in containers: tests/test_compose_up.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet.errors import ServerRefError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.testing import fleet_headers, free_port, serve
from responses_api_models.scripted_model.app import ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "compose.yaml"
COMPOSE_VARS = frozenset(re.findall(r"\$\{(\w+)", COMPOSE.read_text()))
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SANDBOX_PRIVILEGES = {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"}
START_TIMEOUT_S = 180  # how long a service may take to turn healthy before the test gives up on it
CODE_GEN_ROW = ROOT / "resources_servers/code_gen/data/example.jsonl"
PROGRAM = ("```python\nn = int(input())\nbest, low = 0, None\nfor x in map(int, input().split()):\n"
           "    if low is not None:\n        best = max(best, x - low)\n"
           "    low = x if low is None else min(low, x)\nprint(best)\n```")


def compose_config(tmp_path: Path, env: dict[str, str] | None = None, profiles: tuple[str, ...] = ()) -> dict:
    """compose.yaml as docker-compose renders it, with only `env` set among the variables it reads."""
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose is missing: run scripts/install_test_tools.sh"
    environ = {key: value for key, value in os.environ.items()
               if key not in COMPOSE_VARS and not key.startswith("COMPOSE_")}
    empty = tmp_path / "empty.env"
    empty.write_text("")
    args = [exe, "-f", str(COMPOSE), "--env-file", str(empty)]
    for profile in profiles:
        args += ["--profile", profile]
    result = subprocess.run([*args, "config"], cwd=ROOT, env={**environ, **(env or {})}, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def local_argv(command: list[str]) -> list[str]:
    """A service's command as this checkout runs it: a console script of pyproject.toml, or `python`."""
    name, *args = command
    if name in SCRIPTS:
        return [sys.executable, "-m", SCRIPTS[name].split(":")[0], *args]
    assert name == "python", f"{name!r} is neither `python` nor a command this project installs"
    return [sys.executable, *args]


def healthcheck_argv(service: dict) -> list[str]:
    kind, *command = service["healthcheck"]["test"]
    assert kind == "CMD", "exec form: no shell needed in the image"
    return local_argv(command)


def fleet_workdir(tmp_path: Path, fleet: dict) -> Path:
    """The fleet's working directory as the container has it: the files compose.yaml mounts into it."""
    workdir = tmp_path / "workdir"
    workdir.mkdir(exist_ok=True)
    for volume in fleet["volumes"]:
        source, target, *_ = volume.split(":")
        assert Path(target).parent == Path(fleet["working_dir"]), volume
        shutil.copy(source, workdir / Path(target).name)
    return workdir


def wait_healthy(service: dict, env: dict, cwd: Path, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        check = subprocess.run(healthcheck_argv(service), cwd=cwd, env=env, capture_output=True, text=True,
                               timeout=60)
        if check.returncode == 0:
            return
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"not healthy:\n{check.stdout}{check.stderr}\n{log.read_text()[-3000:]}"
        time.sleep(1)


def start(argv: list[str], cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(process: subprocess.Popen) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            return process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def test_docker_compose_accepts_the_file_with_and_without_the_gpu_profile(tmp_path):
    compose_config(tmp_path)
    gpu = compose_config(tmp_path, profiles=("gpu",))
    assert set(gpu["services"]) == {"fleet", "sandbox", "vllm"}
    # `docker compose up` starts the services without a profile; vLLM only with --profile gpu
    assert {name: service.get("profiles") for name, service in gpu["services"].items()} == {
        "fleet": None, "sandbox": None, "vllm": ["gpu"]}
    for name, service in gpu["services"].items():
        assert service["healthcheck"]["test"][0] == "CMD" and service["healthcheck"]["test"][1:], name
        assert service["network_mode"] == "host", name


def test_the_sandbox_gets_what_bubblewrap_needs_and_no_capabilities(tmp_path):
    services = compose_config(tmp_path)["services"]
    sandbox = services["sandbox"]
    assert set(sandbox["security_opt"]) == SANDBOX_PRIVILEGES
    assert not sandbox.get("privileged") and not sandbox.get("cap_add")
    assert not services["fleet"].get("security_opt"), "the fleet runs no code of its own: no privileges"
    text = COMPOSE.read_text()
    for option in SANDBOX_PRIVILEGES:  # each one is explained next to the service
        assert re.search(rf"#\s+{re.escape(option)}\s+\S", text), option
    assert services["fleet"]["depends_on"] == {"sandbox": {"condition": "service_healthy"}}


def test_fleet_variables_map_to_env_yaml_keys(tmp_path):
    """POLICY_BASE_URL -> policy_base_url, ...: docker/env.yaml reads each, with compose.yaml's default."""
    fleet = compose_config(tmp_path)["services"]["fleet"]
    env_yaml = yaml.safe_load((ROOT / "docker/env.yaml").read_text())
    assert set(env_yaml) == {name.lower() for name in fleet["environment"]}
    for name, default in fleet["environment"].items():
        assert env_yaml[name.lower()] == f"${{oc.env:{name},{default}}}", name
    assert f"{ROOT}/docker/env.yaml:{fleet['working_dir']}/env.yaml:ro" in fleet["volumes"]
    workdirs = re.findall(r"^WORKDIR (\S+)", (ROOT / "docker/Dockerfile").read_text(), re.MULTILINE)
    assert workdirs[-1] == fleet["working_dir"], "the image's working directory is where env.yaml is mounted"
    rendered = compose_config(tmp_path, {"POLICY_BASE_URL": "http://gpu-node:9000/v1"})["services"]["fleet"]
    assert rendered["environment"]["POLICY_BASE_URL"] == "http://gpu-node:9000/v1"


def test_the_default_fleet_command_passes_ng_run_dry_run(tmp_path, monkeypatch):
    fleet = compose_config(tmp_path)["services"]["fleet"]
    assert fleet["command"][0] == "ng_run"
    workdir = fleet_workdir(tmp_path, fleet)
    env = {**os.environ, **fleet["environment"]}
    run = subprocess.run([*local_argv(fleet["command"]), "+dry_run=true"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "nothing started" in run.stdout
    assert not re.search(r"^sandbox\s", run.stdout, re.MULTILINE), "the fleet starts no sandbox of its own"
    # Every server that runs code uses the sandbox service, at the address the environment variable gives.
    for name, value in fleet["environment"].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SANDBOX_URL", "http://127.0.0.1:18080")
    monkeypatch.chdir(workdir)
    config = parse_global_config(GlobalConfigDictParserConfig(cli_args=fleet["command"][1:]), assign_ports=False)
    users = {name: inst for name, inst in config.instances.items() if "sandbox" in inst.fields}
    assert set(users) == {"code_gen"}
    assert all(inst.fields["sandbox_url"] == "http://127.0.0.1:18080" for inst in users.values())
    assert not config.instances_of("sandbox_servers")


def test_super3_cannot_use_the_sandbox_service_until_swerl_gen_can(monkeypatch, tmp_path):
    """compose.yaml says so: swerl_gen has no sandbox_url. When it gets one, update the overlay and compose.yaml."""
    monkeypatch.chdir(fleet_workdir(tmp_path, compose_config(tmp_path)["services"]["fleet"]))
    ns_tools = "ns_tools.resources_servers.ns_tools"  # it has sandbox_url: point it at the service as well
    args = ["+config_paths=[configs/super3_rlvr.yaml,docker/external_sandbox.yaml]",
            f"++{ns_tools}.sandbox=sandbox", f"++{ns_tools}.sandbox_url=http://127.0.0.1:8080"]
    with pytest.raises(ServerRefError) as error:
        parse_global_config(GlobalConfigDictParserConfig(cli_args=args), assign_ports=False)
    assert "unknown server 'sandbox' at swerl_gen_resources_server.resources_servers.swerl_gen.sandbox" in str(
        error.value)
    assert "swerl_gen has no sandbox_url" in COMPOSE.read_text()


def test_the_vllm_service_serves_what_the_policy_server_expects(tmp_path):
    services = compose_config(tmp_path, profiles=("gpu",))["services"]
    vllm, fleet = services["vllm"], services["fleet"]
    assert vllm["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(flag.removeprefix("--").partition("=")[::2] for flag in vllm["command"])
    policy = httpx.URL(fleet["environment"]["POLICY_BASE_URL"])
    assert (flags["host"], int(flags["port"]), policy.path) == (policy.host, policy.port, "/v1")
    assert flags["model"] == fleet["environment"]["POLICY_MODEL_NAME"]
    training = yaml.safe_load((ROOT / "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml")
                              .read_text())["policy_model"]["responses_api_models"]["vllm_model"]
    assert training["uses_reasoning_parser"] is True and flags["reasoning-parser"]
    assert "enable-auto-tool-choice" in flags and flags["tool-call-parser"]
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert f"http://127.0.0.1:{policy.port}/health" in vllm["healthcheck"]["test"][-1]


def test_the_services_run_and_turn_healthy_with_code_gen_using_the_sandbox_service(tmp_path):
    sandbox_port, head_port = free_port(), free_port()
    row = CODE_GEN_ROW.read_text().splitlines()[0]
    script = ScriptedModel({"rules": [{"match": "largest value of a_j - a_i", "text": PROGRAM}],
                            "default": {"text": "I am not sure."}})
    with serve(script.create_app()) as llm:
        env_vars = {
            "SANDBOX_PORT": str(sandbox_port), "SANDBOX_URL": f"http://127.0.0.1:{sandbox_port}",
            "HEAD_SERVER_PORT": str(head_port), "POLICY_BASE_URL": f"{llm}/v1", "POLICY_MODEL_NAME": "scripted",
            "GYMFLEET_CONFIG_PATHS": "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml,"
                                     "resources_servers/code_gen/configs/code_gen.yaml,docker/external_sandbox.yaml",
        }
        services = compose_config(tmp_path, env_vars)["services"]
        sandbox, fleet = services["sandbox"], services["fleet"]
        workdir = fleet_workdir(tmp_path, fleet)
        fleet_env = {**os.environ, **fleet["environment"]}
        processes: dict[str, subprocess.Popen] = {}
        try:
            processes["sandbox"] = start(local_argv(sandbox["command"]), tmp_path, dict(os.environ),
                                         tmp_path / "sandbox.log")
            wait_healthy(sandbox, dict(os.environ), tmp_path, processes["sandbox"], tmp_path / "sandbox.log")
            processes["fleet"] = start(local_argv(fleet["command"]), workdir, fleet_env, tmp_path / "fleet.log")
            wait_healthy(fleet, fleet_env, workdir, processes["fleet"], tmp_path / "fleet.log")

            head = f"http://127.0.0.1:{head_port}"
            token = fleet_headers(head_port)  # what ng_run wrote for this head address: a client here needs nothing
            assert httpx.get(head + "/global_config_dict_yaml", timeout=30).status_code == 401
            published = yaml.safe_load(httpx.get(head + "/global_config_dict_yaml", headers=token, timeout=30).json())
            assert "sandbox" not in published
            assert published["code_gen"]["resources_servers"]["code_gen"]["sandbox_url"] == env_vars["SANDBOX_URL"]
            agent = published["code_gen_simple_agent"]["responses_api_agents"]["simple_agent"]
            result = httpx.post(f"http://{agent['host']}:{agent['port']}/run", content=row, timeout=120,
                                headers={"content-type": "application/json", **token}).json()
            assert "_ng_failure_class" not in result, result.get("failure")
            assert result["reward"] == 1.0, "the program passed its tests in the sandbox service"
            metrics = httpx.get(env_vars["SANDBOX_URL"] + "/metrics", timeout=30).text
            ran = re.search(r'gymfleet_requests_total\{[^}]*route="/run_batch"[^}]*\} [1-9]', metrics)
            assert ran, "the sandbox service ran the tests"

            assert stop(processes["fleet"]) == 0, (tmp_path / "fleet.log").read_text()[-3000:]
            check = subprocess.run(healthcheck_argv(fleet), cwd=workdir, env=fleet_env, capture_output=True,
                                   timeout=60)
            assert check.returncode != 0, "with the fleet gone its health check fails"
        finally:
            for process in processes.values():
                stop(process)


def test_ci_and_the_readme_install_docker_compose_with_the_same_test_command():
    commands = (ROOT / ".ci/run").read_text().splitlines()
    ci = [line for line in commands if line and not line.startswith(("#", "set ", "cd "))]
    assert len(ci) == 1 and "scripts/install_test_tools.sh" in ci[0]
    assert f"```bash\n{ci[0]}\n```" in (ROOT / "README.md").read_text(), "README's test command is .ci/run's"


def test_the_image_holds_what_the_services_run(tmp_path):
    """docker/Dockerfile copies folders that exist, installs bubblewrap and the project, for every service's build."""
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    sources = [part for line in dockerfile.splitlines() if line.startswith("COPY ") for part in line.split()[1:-1]]
    assert sources and all((ROOT / source).exists() for source in sources), sources
    copied = {Path(source).parts[0] for source in sources}
    assert {"gymfleet", "sandbox", "configs", "docker", "resources_servers"} <= copied
    assert "bubblewrap" in dockerfile and "pip install --no-cache-dir --no-deps -e ." in dockerfile
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\nFROM \$\{BASE_IMAGE\}$", dockerfile, re.MULTILINE)
    services = compose_config(tmp_path)["services"]
    for name in ("fleet", "sandbox"):
        assert services[name]["build"] == {"context": str(ROOT), "dockerfile": "docker/Dockerfile", "network": "host",
                                           "args": {"BASE_IMAGE": "python:3.11-slim", "EXTRA_CA_CERTS": ""}}, name
    local = compose_config(tmp_path, {"GYMFLEET_BASE_IMAGE": "localhost/gymfleet-base:bookworm"})["services"]
    assert local["sandbox"]["build"]["args"]["BASE_IMAGE"] == "localhost/gymfleet-base:bookworm"
