"""Servers forked from the zygote (`server_start: zygote`, the default) behave as fresh interpreters did: they serve,
come back after a crash, outlive a dead zygote, get their secrets without argv or disk, and their output reaches
the fleet; `server_start: spawn` still starts fresh interpreters."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from gymfleet.cli.run import prestart_zygote
from gymfleet.errors import ConfigError
from gymfleet.fleet import server_start as fleet_module
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.supervisor import Fleet
from gymfleet.fleet.zygote import ForkedProcess, Zygote
from gymfleet.fleet.zygote_main import (
    _claimed,
    _claims_pipe,
    group_key,
    read_import_times,
    slowest_first,
    write_import_times,
)
from gymfleet.testing import fleet_headers, free_port
from tests.fault_tools import WAIT_S, wait_for

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = "configs/quickstart.yaml"
VLLM_MODEL = "responses_api_models/vllm_model/configs/vllm_model.yaml"
ROW = json.loads((ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()[0])
AGENT_REF = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}
SECRET = "sk-zygote-secret-123"


def _config(config_paths: list[str], extra: dict[str, Any] | None):
    initial = {"config_paths": config_paths, "head_server": {"host": "127.0.0.1", "port": free_port()},
               **(extra or {})}
    return parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                            skip_load_from_cli=True))


@contextmanager
def fleet_with(extra: dict[str, Any] | None = None, config_paths: list[str] | None = None,
               zygote: Zygote | None = None) -> Iterator[tuple[Fleet, io.StringIO]]:
    """A started fleet (quickstart by default) and what it says."""
    output = io.StringIO()
    fleet = Fleet(_config(config_paths or [QUICKSTART], extra), output=output, zygote=zygote)
    fleet.start(timeout_s=WAIT_S)
    try:
        yield fleet, output
    finally:
        fleet.shutdown()


def zygotes() -> list[psutil.Process]:
    """This process's zygote children (live ones)."""
    return [child for child in psutil.Process().children() if "--control-fd" in _cmdline(child)]


def forkers(zygote: psutil.Process) -> set[int]:
    """The zygote and its helper (which forks the servers whose class it imported)."""
    return {zygote.pid, *(child.pid for child in zygote.children() if "--helper-of" in _cmdline(child))}


def _cmdline(process: psutil.Process) -> list[str]:
    """Its command line; [] for one that is gone or a zombie (an earlier test's child not reaped yet)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=5).json() == {"status": "ok"}
    except httpx.HTTPError:
        return False


def back_running(fleet: Fleet, name: str, restarts: int) -> bool:
    row = fleet.process_table()[name]
    return (row["status"], row["restarts"]) == ("running", restarts)


def rollout_reward(fleet: Fleet) -> float:
    answer = httpx.post(fleet.config.instance("mcqa_simple_agent").url + "/run",
                        json={**ROW, "agent_ref": AGENT_REF}, timeout=120, headers=fleet_headers(fleet))
    assert answer.status_code == 200, answer.text
    return answer.json()["reward"]


def assert_replaced_and_a_crash_restarts_through_the_new_one(fleet: Fleet, output: io.StringIO,
                                                            first: psutil.Process) -> None:
    """After `first` (the zygote) went: the supervisor says it starts another, every server keeps serving, and a
    crashed server comes back forked by the new zygote (or its helper), and serves."""
    wait_for(lambda: "starting a new one" in output.getvalue(), "the supervisor saying it starts a new zygote")
    for name in fleet.children:
        assert answers(fleet.config.instance(name).url), f"{name} keeps serving without its zygote"
    [second] = wait_for(zygotes, "a new zygote")
    assert second.pid != first.pid
    old = fleet.children["mcqa"].process
    os.kill(old.pid, signal.SIGKILL)
    wait_for(lambda: back_running(fleet, "mcqa", 1), "mcqa restarted through the new zygote")
    assert psutil.Process(fleet.children["mcqa"].process.pid).ppid() in forkers(second)
    assert rollout_reward(fleet) == 1.0


def test_servers_are_forked_by_one_zygote_serve_report_output_and_a_killed_one_is_forked_again():
    with fleet_with({"uvicorn_logging_show_200_ok": True}) as (fleet, output):
        [zygote] = zygotes()
        for name, child in fleet.children.items():
            assert isinstance(child.process, ForkedProcess), name
            process = psutil.Process(child.process.pid)
            assert process.ppid() in forkers(zygote), f"{name} is the zygote's (or its helper's) child"
            assert os.getpgid(process.pid) == process.pid, f"{name} leads its own process group"
            assert process.cmdline()[3:5] == ["--instance", name], f"{name}: ps names the instance"
            assert answers(fleet.config.instance(name).url), name
        assert rollout_reward(fleet) == 1.0
        wait_for(lambda: "(mcqa) " in output.getvalue() and '"POST /verify HTTP/1.1" 200' in output.getvalue(),
                 "mcqa's access log line in the fleet's output, prefixed with its name")

        old = fleet.children["mcqa"].process
        forker = psutil.Process(old.pid).ppid()
        os.kill(old.pid, signal.SIGKILL)
        assert old.wait(10) == -signal.SIGKILL, "the zygote reports the exit code"
        wait_for(lambda: back_running(fleet, "mcqa", 1), "mcqa running again after one restart")
        new = fleet.children["mcqa"].process
        assert isinstance(new, ForkedProcess) and new.pid != old.pid
        assert psutil.Process(new.pid).ppid() == forker, "forked again by the same process (zygote or helper)"
        assert rollout_reward(fleet) == 1.0
        assert "server 'mcqa' exited unexpectedly with code -9 (SIGKILL)" in output.getvalue()


def test_a_killed_zygote_is_replaced_while_servers_keep_serving_and_a_later_crash_is_restarted(tmp_path):
    extra = {"nemo_gym_log_dir": str(tmp_path), "uvicorn_logging_show_200_ok": True}
    with fleet_with(extra) as (fleet, output):
        [first] = zygotes()
        first.kill()  # not psutil's wait(): it would reap the zygote before the supervisor could read its code
        assert_replaced_and_a_crash_restarts_through_the_new_one(fleet, output, first)
        assert f"the zygote (pid {first.pid}) exited with code -9" in output.getvalue()
        said = output.getvalue()
        assert "server 'mcqa' exited unexpectedly with an unknown code" in said, "its dead zygote had its code"
        # uvicorn logs a request after answering it, and the supervisor copies that line to the file a moment later
        wait_for(lambda: '"POST /verify HTTP/1.1" 200' in (tmp_path / "mcqa.log").read_text(),
                 "the restarted server's output reaching its log file")


def test_with_no_zygote_restarts_left_servers_start_as_fresh_interpreters(monkeypatch):
    monkeypatch.setattr(fleet_module, "ZYGOTE_RESTARTS", 0)
    with fleet_with() as (fleet, output):
        [zygote] = zygotes()
        zygote.kill()
        wait_for(lambda: "fresh interpreters from now on" in output.getvalue(), "the fallback, said once")
        assert not zygotes()
        old = fleet.children["mcqa"].process
        os.kill(old.pid, signal.SIGKILL)
        wait_for(lambda: back_running(fleet, "mcqa", 1), "mcqa restarted as a fresh interpreter")
        new = fleet.children["mcqa"].process
        assert isinstance(new, subprocess.Popen)
        assert "gymfleet.fleet.launch" in psutil.Process(new.pid).cmdline()
        assert rollout_reward(fleet) == 1.0
        assert output.getvalue().count("fresh interpreters from now on") == 1


def test_secrets_reach_the_forked_server_and_never_its_argv_or_environment(recorder):
    url, seen = recorder
    extra = {"policy_base_url": url + "/v1", "policy_api_key": SECRET, "policy_model_name": "scripted"}
    with fleet_with(extra, [VLLM_MODEL]) as (fleet, _):
        model_url = fleet.config.instance("policy_model").url
        seen.clear()  # the supervisor's readiness probe of the upstream carries no key
        answer = httpx.post(model_url + "/v1/responses", json={"input": "hi"}, timeout=60,
                            headers=fleet_headers(fleet))
        assert answer.status_code == 200, answer.text
        assert seen and set(seen) == {f"Bearer {SECRET}"}, "the server authenticates upstream with the real key"
        [zygote] = zygotes()
        for process in (psutil.Process(fleet.children["policy_model"].process.pid), zygote):
            assert SECRET not in " ".join(process.cmdline())
            assert SECRET not in json.dumps(process.environ())


def test_server_start_spawn_starts_fresh_interpreters():
    with fleet_with({"server_start": "spawn"}) as (fleet, _):
        assert not zygotes()
        for name, child in fleet.children.items():
            assert isinstance(child.process, subprocess.Popen), name
            assert "gymfleet.fleet.launch" in psutil.Process(child.process.pid).cmdline()
        assert rollout_reward(fleet) == 1.0


def test_a_bad_server_start_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"server_start: expected one of zygote, spawn, got 'fork'"):
        Fleet(_config([QUICKSTART], {"server_start": "fork"}))


def test_the_zygote_imports_alongside_one_helper_and_a_dead_helper_gets_the_zygote_replaced():
    with fleet_with() as (fleet, output):
        [zygote] = zygotes()
        helpers = forkers(zygote) - {zygote.pid}
        assert len(helpers) == (1 if len(os.sched_getaffinity(0)) > 1 else 0), "one helper where there are 2+ CPUs"
        parents = {psutil.Process(child.process.pid).ppid() for child in fleet.children.values()}
        assert parents <= forkers(zygote), "every server is forked by the zygote or its helper"
        assert rollout_reward(fleet) == 1.0
        for helper in helpers:
            os.kill(helper, signal.SIGKILL)
            assert_replaced_and_a_crash_restarts_through_the_new_one(fleet, output, zygote)


def test_two_claimers_share_the_groups_each_taking_each_once():
    groups = [[f"server{index}"] for index in range(40)]
    claims = _claims_pipe(len(groups))
    try:
        first, second = _claimed(groups, claims), _claimed(groups, claims)
        taken: list[list[str]] = []
        for step in range(60):  # uneven turns, as two importers of unequal servers take them
            claimer = first if step % 3 else second
            taken += [group for group in [next(claimer, None)] if group is not None]
        assert next(first, None) is None and next(second, None) is None
    finally:
        os.close(claims)
    assert sorted(name for [name] in taken) == sorted(name for [name] in groups), "each group claimed exactly once"


def test_a_zygote_started_before_the_config_is_adopted_and_one_a_spawn_fleet_does_not_need_is_closed():
    early = Zygote(None)
    with fleet_with(zygote=early) as (fleet, _):
        assert [zygote.pid for zygote in zygotes()] == [early.pid], "the fleet forks from the zygote it was given"
        assert rollout_reward(fleet) == 1.0
    unused = Zygote(None)
    with fleet_with({"server_start": "spawn"}, zygote=unused) as (fleet, _):
        assert unused.process.poll() is not None, "closed at once: a spawn fleet forks nothing"
        assert not zygotes()
        assert rollout_reward(fleet) == 1.0


@pytest.mark.parametrize(("argv", "starts"), [
    (["+config_paths=[configs/quickstart.yaml]"], True),
    (["+config_paths=[a.yaml]", "+server_start=zygote"], True),
    (["+config_paths=[a.yaml]", "+dry_run=true"], False),
    (["+config_paths=[a.yaml]", "+dry_run=True"], False),
    (["+config_paths=[a.yaml]", "+server_start=spawn"], False),
    (["+config_paths=[a.yaml]", "++placement=ray"], False),
    (["+config_paths=[a.yaml]", "+ray_head_node_address=10.0.0.1:6379"], False),
    (["--help"], False),
])
def test_ng_run_starts_its_zygote_before_the_config_only_where_it_will_fork_servers(argv, starts):
    zygote = prestart_zygote(argv)
    try:
        assert (zygote is not None) == starts
        if zygote is not None:
            assert wait_for(lambda: zygote.alive and "--config" not in psutil.Process(zygote.pid).cmdline(),
                            "a zygote waiting for its config")
    finally:
        if zygote is not None:
            zygote.close()
            assert zygote.process.poll() is not None


@pytest.mark.parametrize("instance", ["mcqa", "mcqa_simple_agent"])
def test_a_bad_field_stops_start_up_before_any_server_whichever_importer_validates_it(instance):
    """The zygote and its helper each validate the servers they imported; a bad field in either half stops the
    start with the field's YAML path, and nothing is left running."""
    kind = "resources_servers/mcqa" if instance == "mcqa" else "responses_api_agents/simple_agent"
    section, impl = kind.split("/")
    bad = {instance: {section: {impl: {"max_concurrent_rollouts" if instance != "mcqa" else "grading_mode": "bogus"}}}}
    output = io.StringIO()
    fleet = Fleet(_config([QUICKSTART], bad), output=output)
    with pytest.raises(ConfigError, match=rf"{instance}\.{section}\.{impl}\.(grading_mode|max_concurrent_rollouts)"):
        fleet.start(timeout_s=WAIT_S)
    assert "started " not in output.getvalue(), "no server was started"
    assert not fleet.children
    wait_for(lambda: not zygotes(), "no zygote left")


def test_a_zygote_dead_while_importing_leaves_fresh_interpreters_and_the_fleet_starts(monkeypatch):
    """Its reader thread may notice the death before start-up asks it to validate: the fleet validates here, says
    once that servers start as fresh interpreters, and they serve."""
    start = Fleet._start_zygote

    def start_then_lose(fleet: Fleet) -> None:
        start(fleet)
        os.kill(fleet._zygote.pid, signal.SIGKILL)
        wait_for(lambda: fleet._zygote is None, "the supervisor noticing its zygote died")

    monkeypatch.setattr(Fleet, "_start_zygote", start_then_lose)
    with fleet_with() as (fleet, output):
        assert output.getvalue().count("fresh interpreters from now on") == 1
        assert not zygotes()
        assert all(isinstance(child.process, subprocess.Popen) for child in fleet.children.values())
        assert rollout_reward(fleet) == 1.0


def test_server_classes_are_claimed_slowest_first_as_last_timed(tmp_path, monkeypatch):
    """The import times one zygote records order the next one's claims, longest first; untimed groups keep config
    order after them; a missing or broken record is config order."""
    from types import SimpleNamespace

    monkeypatch.setenv("GYMFLEET_CACHE_DIR", str(tmp_path))
    groups = [[SimpleNamespace(name=name, dir=tmp_path / name, entrypoint="app.py")]
              for name in ("policy", "agent", "reasoning_gym", "mcqa", "instruction_following")]
    assert read_import_times() == {} and slowest_first(groups, {}) == groups
    write_import_times({group_key(groups[2]): 2.5, group_key(groups[4]): 3.0})
    write_import_times({group_key(groups[3]): 0.1})  # merged into what was recorded
    order = [group[0].name for group in slowest_first(groups, read_import_times())]
    assert order == ["instruction_following", "reasoning_gym", "mcqa", "policy", "agent"]
    (tmp_path / "zygote-import-seconds.json").write_text("{not json")
    assert read_import_times() == {}


def test_gc_paused_pauses_the_collector_and_restores_what_it_found():
    import gc

    from gymfleet.fleet.zygote_main import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        gc.disable()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # an inner block leaves the outer one's pause alone
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("an import failed")
    assert gc.isenabled()


def test_fastapi_imported_lean_builds_its_openapi_models_on_first_use():
    """The zygote and `ng_run` import FastAPI with its OpenAPI document models left to build themselves on first use
    (`lean_imports.import_fastapi`): a server builds its app and answers without them, `/openapi.json` (FastAPI's
    `get_openapi` validates with them) builds them and works as ever, and pydantic's default is restored."""
    code = """if True:
        import inspect, json
        from gymfleet.fleet.lean_imports import import_fastapi
        import_fastapi()
        from fastapi.openapi import models
        from pydantic import BaseModel
        from pydantic._internal._config import config_defaults
        from resources_servers.mcqa.app import MCQAServer
        classes = [cls for _, cls in inspect.getmembers(models, inspect.isclass)
                   if issubclass(cls, BaseModel) and cls.__module__ == models.__name__]
        app = MCQAServer({"name": "mcqa"}).create_app()
        built_by_app = models.OpenAPI.__pydantic_complete__
        schema = app.openapi()  # what GET /openapi.json answers
        print(json.dumps([len(classes), sum(cls.__pydantic_complete__ for cls in classes), built_by_app,
                          models.OpenAPI.__pydantic_complete__, "/verify" in schema["paths"],
                          config_defaults["defer_build"]]))
    """
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    count, complete, built_by_app, built_after, verify_listed, default = json.loads(done.stdout.splitlines()[-1])
    assert count > 30 and complete < count / 2, (count, complete)  # most deferred (a few built as fields of others)
    assert (built_by_app, built_after, verify_listed, default) == (False, True, True, False)
