"""A fleet leaves no secret on disk, and a port another process holds is one clear error, never "ready".

Fleet 2 in these tests reuses the ports of a running fleet 1, as a second `ng_run` with the same explicit ports
would; the model server's upstream is a real scripted model wrapped in a recorder of `Authorization` headers.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil
import pytest

from gymfleet.fleet import ports
from gymfleet.fleet.config import GlobalConfigDictParserConfig, find_free_port, parse_global_config
from gymfleet.fleet.credential import answers_as
from gymfleet.fleet.launch import bind_socket, take_secrets
from gymfleet.fleet.secret_handoff import CREDENTIALS_FD_ENV, credentials_fd, merge_secrets, split_secrets
from gymfleet.fleet.supervisor import Fleet, PortInUseError, remove_stale_workdirs
from gymfleet.testing import fleet_headers, free_port, running_fleet, wait_until

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = "configs/quickstart.yaml"
VLLM_MODEL = "responses_api_models/vllm_model/configs/vllm_model.yaml"
SECRET = "sk-secret-xyz"
MCQA_PORT_PATH = "mcqa.resources_servers.mcqa.port"


def _port_error(port: int, path: str, unset_hint: bool = True) -> str:
    unset = " (or leave the port unset to get a free one)" if unset_hint else ""
    return (f"error: port {port} ({path}) is already in use by another process; "
            f"free it or set ++{path}=<free port>{unset}")


def _config(extra: dict):
    initial = {"config_paths": [QUICKSTART], "head_server": {"host": "127.0.0.1", "port": free_port()}, **extra}
    return parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                            skip_load_from_cli=True))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point `tempfile` (and child processes, through TMPDIR) at an empty folder, to see what a fleet leaves."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def fleet1():
    with running_fleet([QUICKSTART]) as running:
        yield running


# ------------------------------------------------------------------------------------------ secrets


def test_resolved_config_is_private_secret_free_and_removed_while_servers_still_authenticate(private_tmp, recorder):
    url, seen = recorder
    workers = {"responses_api_models": {"vllm_model": {"num_workers": 2}}}
    extra = {"policy_base_url": url + "/v1", "policy_api_key": SECRET, "policy_model_name": "scripted",
             "restart_crashed_servers": 1, "policy_model": workers}
    with running_fleet([VLLM_MODEL], extra) as fleet:
        [workdir] = private_tmp.glob("gymfleet-*")
        files = [path for path in workdir.rglob("*") if path.is_file()]
        assert files, "the children's resolved config is in the work folder"
        assert stat.S_IMODE(workdir.stat().st_mode) == 0o700
        for path in files:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            assert SECRET not in path.read_text(), f"{path} holds the API key"
        model_url = fleet.config.instance("policy_model").url
        _ask_several_times(model_url, seen)  # both workers authenticate upstream with the real key

        old = fleet.children["policy_model"].process  # a restarted child (restart_crashed_servers) gets it too
        old.kill()
        old.wait(5)
        fleet.poll()
        fleet._wait_ready(60)
        _wait_for_workers(fleet.children["policy_model"].process, 2)  # the old workers do not keep the port
        _ask_several_times(model_url, seen)
    assert not workdir.exists(), "shutdown removes the work folder"
    assert not list(private_tmp.iterdir())


def _wait_for_workers(process: subprocess.Popen, count: int) -> None:
    """Wait until the server `process` serves with `count` worker processes; fail if it exits first."""
    master = psutil.Process(process.pid)

    def serving() -> bool:
        assert process.poll() is None, f"the restarted server exited with code {process.returncode}"
        return len([child for child in master.children() if "spawn_main" in " ".join(child.cmdline())]) == count

    wait_until(serving, f"the server serves with {count} worker processes", interval_s=0.1,
               ignore=(psutil.NoSuchProcess,))  # a worker of the last process, exiting as it is listed


def _ask_several_times(model_url: str, seen: list[str]) -> None:
    seen.clear()
    for index in range(6):
        answer = httpx.post(model_url + "/v1/responses", json={"input": f"hi {index}"}, timeout=60,
                            headers=fleet_headers())
        assert answer.status_code == 200, answer.text
    assert seen and set(seen) == {f"Bearer {SECRET}"}, seen


def test_a_failed_start_removes_the_work_folder(private_tmp):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = _config({"head_server": {"host": "127.0.0.1", "port": taken.getsockname()[1]}})
        with pytest.raises(PortInUseError):
            Fleet(config).start(timeout_s=60)
    assert not list(private_tmp.glob("gymfleet-*"))


def test_work_folders_of_supervisors_killed_with_all_their_servers_are_removed_by_the_next_fleet(private_tmp):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = private_tmp / f"gymfleet-{gone.stdout.strip()}-abcd1234"
    live = private_tmp / f"gymfleet-{os.getpid()}-abcd1234"
    others = [private_tmp / "gymfleet-sandbox-etc-abcd1234", private_tmp / "gymfleet-abcd1234"]
    for path in [stale, live, *others]:
        path.mkdir()
        (path / "resolved_config.json").write_text("{}")
    assert remove_stale_workdirs(private_tmp) == [stale]
    assert not stale.exists() and live.exists() and all(path.exists() for path in others)


def test_secrets_split_from_the_config_and_merged_back_give_the_same_config():
    data = _config({"policy_api_key": SECRET, "hf_token": "hf-abc", "judge": {"keys": {"api_key": ["a", "b"]}}}).data
    masked, secrets = split_secrets(data)
    text = json.dumps(masked)
    assert SECRET not in text and "hf-abc" not in text and '"a"' not in text
    assert masked["policy_model"]["responses_api_models"]["vllm_model"]["api_key"] == "****"
    assert merge_secrets(json.loads(text), json.loads(json.dumps(secrets))) == data


def test_a_child_takes_its_secrets_and_token_from_an_inherited_descriptor_never_its_environment(monkeypatch):
    from gymfleet import auth

    fd = credentials_fd([(["policy_api_key"], SECRET)], "fleet-token")
    monkeypatch.setenv(CREDENTIALS_FD_ENV, str(fd))
    try:
        assert take_secrets() == [(["policy_api_key"], SECRET)]
        assert auth.fleet_token() == auth.server_token() == "fleet-token"
        assert CREDENTIALS_FD_ENV not in os.environ and auth.FLEET_TOKEN_ENV not in os.environ
        with pytest.raises(OSError):
            os.fstat(fd)  # read once, then closed
    finally:
        auth.hold(None)


# ------------------------------------------------------------------------------------------ ports


def _ng_run(*overrides: str, tmpdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{QUICKSTART}]", *overrides],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmpdir)},
    )


def test_ng_run_on_a_server_port_another_fleet_holds_is_one_error_line_and_never_ready(fleet1, tmp_path):
    port = fleet1.config.instance("mcqa").port
    out = _ng_run(f"+head_server.port={free_port()}", f"++{MCQA_PORT_PATH}={port}", tmpdir=tmp_path)
    seen = out.stdout + out.stderr
    assert out.returncode == 2, seen
    assert out.stderr.strip().splitlines()[-1] == _port_error(port, MCQA_PORT_PATH), seen
    assert "servers ready" not in seen and "Traceback" not in seen and "Errno" not in seen, seen
    assert not list(tmp_path.glob("gymfleet-*"))


def test_ng_run_on_a_head_port_another_fleet_holds_is_one_error_line(fleet1, tmp_path):
    port = fleet1.config.head_port
    out = _ng_run(f"+head_server.port={port}", tmpdir=tmp_path)
    seen = out.stdout + out.stderr
    assert out.returncode == 2, seen
    assert out.stderr.strip().splitlines()[-1] == _port_error(port, "head_server.port", unset_hint=False), seen
    assert "servers ready" not in seen and "Traceback" not in seen and "Errno" not in seen, seen
    assert not list(tmp_path.glob("gymfleet-*"))


def test_a_port_the_fleet_chose_is_held_from_its_choice_until_its_server_listens_on_it():
    """No window between choosing a free port and serving on it: another process (a concurrent fleet) cannot bind
    it meanwhile, with or without SO_REUSEADDR; the supervisor takes the bound socket and hands it over."""
    config = _config({})
    instance = config.instance("mcqa")
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind((instance.host, instance.port))
    with pytest.raises(PortInUseError):
        bind_socket(instance.host, instance.port, "another.fleet.port")
    held = ports.take(instance.host, instance.port)
    assert held is not None and held.getsockname()[1] == instance.port
    assert ports.take(instance.host, instance.port) is None, "handed over once"
    held.close()
    bind_socket(instance.host, instance.port, "another.fleet.port").close()  # released: free again


def test_port_reservations_nobody_takes_are_bounded_in_number_and_time(monkeypatch):
    """A process that parses many configs and starts no fleet holds at most MAX_RESERVATIONS ports, none for long."""
    monkeypatch.setattr(ports, "MAX_RESERVATIONS", 3)
    chosen = [find_free_port("127.0.0.1", 10001, 20000, set()) for _ in range(5)]
    taken = [ports.take("127.0.0.1", port) for port in chosen]
    assert [sock is not None for sock in taken] == [False, False, True, True, True]
    for sock in taken[2:]:
        sock.close()
    port = find_free_port("127.0.0.1", 10001, 20000, set())
    monkeypatch.setattr(ports, "RESERVATION_TTL_S", -1.0)
    assert ports.take("127.0.0.1", port) is None, "expired, and released"
    bind_socket("127.0.0.1", port, "x.port").close()


def test_readiness_counts_only_the_fleets_own_server(fleet1):
    url = fleet1.config.instance("mcqa").url
    # 30 s, not a fleet probe's 2: a loaded machine's answer may be late, and a probe timed out is False too
    assert answers_as(url, fleet1.token, "mcqa", timeout_s=30)
    assert not answers_as(url, Fleet(fleet1.config).token, "mcqa", timeout_s=30), "another fleet's token"
    assert not answers_as(url, fleet1.token, "policy_model", timeout_s=30), "another instance of the same fleet"
    assert httpx.get(url + "/").json() == {"status": "ok"}, "GET / still answers what ng_status and clients read"
