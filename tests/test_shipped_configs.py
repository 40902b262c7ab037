"""Every shipped YAML starts the way a user starts it: `ng_run "+config_paths=[<file>]"`, nothing added by hand.

A config read with a friendlier loader than `ng_run`'s (PyYAML's `safe_load`, a hand-built server) can pass its
tests and still fail for every user: YAML 1.1 reads an unquoted `on:` key as `true`, and a recipe listing only an
environment's config must bring what that environment needs. So each file goes through the real CLI: `+dry_run=true`
validates every server's fields against its config class, then a real start (`ng_run`'s `main` in a process of its
own, forked from one that imported it once: `tests/forked_commands.py`; the fleet's zygote and servers start as
usual) must report every server ready, `ng_status +json=true` (its `main`, in the test's process) must find them
live, and Ctrl-C must stop the fleet cleanly.

An environment's config is listed beside `vllm_model.yaml` (as NeMo-RL's recipes list it beside
`vllm_model_for_training.yaml`); the policy endpoint is a scripted model this test serves.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gymfleet.cli.run import main as run_main
from gymfleet.cli.status import main as status_main
from gymfleet.fleet.config_merge import load_config_files
from gymfleet.testing import free_port, serve, wait_until
from responses_api_models.scripted_model.app import ScriptedModel
from tests.forked_commands import CommandForks

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(
    str(path.relative_to(ROOT))
    for pattern in ("configs/*.yaml", "*/configs/*.yaml", "*/*/configs/*.yaml")
    for path in ROOT.glob(pattern)
)
POLICY = "responses_api_models/vllm_model/configs/vllm_model.yaml"
READY_TIMEOUT_S = 180


STAND_IN_VLLM = ROOT / "responses_api_models/local_vllm_model/tests/fake_vllm.py"


@pytest.fixture(scope="module", autouse=True)
def stand_in_vllm():
    """`local_vllm_model.yaml` starts `vllm serve`: here (no GPU, no vLLM), a stand-in taking its command line."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GYMFLEET_VLLM_EXECUTABLE", str(STAND_IN_VLLM))
        yield


def test_every_config_folder_is_covered():
    """The glob finds the configs of every server folder (a new folder's configs join automatically)."""
    folders = {str(p.relative_to(ROOT).parent) for p in ROOT.glob("*/*/configs")} | {"sandbox"}
    covered = {str(Path(path).parent.parent) for path in SHIPPED}
    assert folders <= covered, folders - covered
    assert "configs/quickstart.yaml" in SHIPPED and "configs/nano3_rlvr.yaml" in SHIPPED


@pytest.fixture(scope="module")
def policy_url():
    """The LLM behind every policy server: the scripted model, answering everything with one sentence."""
    with serve(ScriptedModel({"default": {"text": "I am not sure."}}).create_app()) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def ng_run_forks():
    """Forks of one process that imported `ng_run` and what it imports as it starts a fleet (~1.3 CPU s a start)."""
    forks = CommandForks(["gymfleet.cli.run", "gymfleet.fleet.config", "gymfleet.fleet.ray_placement",
                          "gymfleet.fleet.readiness", "gymfleet.fleet.supervisor", "gymfleet.fleet.head",
                          "hydra.core.override_parser.overrides_parser"])
    try:
        yield forks
    finally:
        forks.close()


def command_line(config_file: str, policy_url: str, head_port: int) -> list[str]:
    """What a user types: the file (beside a policy server when it has none), the endpoint, a free head port."""
    files = load_config_files([config_file], [ROOT])
    defines_policy = any("policy_model" in data for _, data, _ in files)
    paths = [config_file] if defines_policy or config_file.endswith("scripted_model.yaml") else [POLICY, config_file]
    return [
        f"+config_paths=[{','.join(paths)}]",
        f"+policy_base_url={policy_url}",
        "+policy_api_key=not-a-real-key",
        "+policy_model_name=scripted",
        f"+head_server.port={head_port}",
    ]


@pytest.mark.parametrize("config_file", SHIPPED)
def test_dry_run_validates_every_server(config_file, policy_url, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_:
        run_main([*command_line(config_file, policy_url, free_port()), "+dry_run=true"])
    out = capsys.readouterr()
    assert exit_.value.code == 0, out.err
    assert "nothing started" in out.out and "ready" not in out.out


STARTED_ELSEWHERE = {
    # 53 servers, ~80 s to start on 2 cores: tests/test_super3_recipe.py starts it with ng_run's supervisor, checks
    # ng_status, and rolls out through every agent; starting it twice would add that much to every CI run.
    "configs/super3_rlvr.yaml",
}


@pytest.mark.parametrize("config_file", [path for path in SHIPPED if path not in STARTED_ELSEWHERE])
def test_ng_run_starts_it(config_file, policy_url, ng_run_forks, tmp_path, capsys, monkeypatch):
    head_port = free_port()
    log = tmp_path / "ng_run.log"
    log.touch()
    process = ng_run_forks.start("gymfleet.cli.run", command_line(config_file, policy_url, head_port), cwd=ROOT,
                                 output=log)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "servers ready!" not in log.read_text():
            assert process.poll() is None, f"ng_run exited {process.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not ready after {READY_TIMEOUT_S}s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)
        monkeypatch.chdir(ROOT)
        said: list[str] = []

        def all_live() -> bool:
            with pytest.raises(SystemExit) as exit_:  # in this process: ng_status's start-up adds ~0.6 CPU s a config
                status_main([f"+head_server.port={head_port}", "+json=true"])
            out = capsys.readouterr()
            said[:] = [out.out + out.err]
            report = json.loads(out.out)
            return exit_.value.code == 0 and report["live"] == report["total"] > 0

        # Asked again while not all live: on a loaded machine a server may miss ng_status's 2 s probe, and a model
        # server's own probe of its upstream (every second) may not have answered yet when the fleet says ready.
        wait_until(all_live, "ng_status reports every server live", interval_s=1, explain=lambda: said[0])
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
