"""A fleet that says what it is doing: start-up lines, progress off a terminal, the policy endpoint it waits for.

The end-to-end part starts `configs/nano3_rlvr.yaml` through `ng_run` (a subprocess, its output a pipe, so not a
terminal) against a policy URL where nothing listens yet, reads what it prints, asks `ng_status`, then brings a
scripted policy up on that URL and watches the fleet finish starting.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import psutil
import pytest
import uvicorn
import yaml

from gymfleet.cli.dump_config import UNASSIGNED_PORT, render
from gymfleet.cli.prepare_data import main as prepare_main
from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.readiness import ENDPOINT_ANNOUNCE_AFTER_S, _EndpointWatch
from gymfleet.fleet.supervisor import Fleet
from gymfleet.progress import Progress
from gymfleet.testing import fleet_headers, free_port, ng_status_all_live, serve, wait_until
from responses_api_models.scripted_model.app import ScriptedModel
from responses_api_models.vllm_model.app import VLLMModel

ROOT = Path(__file__).resolve().parents[1]
NANO3 = "configs/nano3_rlvr.yaml"
QUICKSTART = "configs/quickstart.yaml"
ANNOUNCE_DEADLINE_S = 20.0
"""A generous bound, not a speed test (the suite runs on loaded 2-core machines): the URL the fleet waits for must
be on the screen while the fleet is still starting. Typically it takes 1.3-2 s from `ng_run`'s start here."""


def _policy_args(port: int) -> list[str]:
    return [f"+policy_base_url=http://127.0.0.1:{port}/v1", "+policy_api_key=test-key", "+policy_model_name=scripted"]


def _instances(config_path: str, *extra: str) -> list[str]:
    parsed = parse_global_config(GlobalConfigDictParserConfig(cli_args=[f"+config_paths=[{config_path}]", *extra]),
                                 assign_ports=False)
    return list(parsed.instances)


class _Output:
    """The lines of a process's output, read by a thread as they come."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, text: str, deadline: float) -> str:
        """The next line containing `text`, read before `deadline` (monotonic); fails the test otherwise."""
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line with {text!r} by the deadline; output so far:\n{''.join(self.lines)}")
            if line is None:
                pytest.fail(f"output ended without {text!r}:\n{''.join(self.lines)}")
            if text in line:
                return line


@pytest.fixture(scope="module")
def nano3() -> Iterator[SimpleNamespace]:
    """`ng_run` on the Nano 3 recipe, its policy URL pointing at a port where nothing listens (yet)."""
    upstream_port, head_port = free_port(), free_port()
    command = [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{NANO3}]", f"+head_server.port={head_port}",
               *_policy_args(upstream_port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env)
    fleet = SimpleNamespace(process=process, started=started, output=_Output(process.stdout),
                            upstream_port=upstream_port, head=f"http://127.0.0.1:{head_port}",
                            url=f"http://127.0.0.1:{upstream_port}/v1", upstream=None)
    try:
        yield fleet
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        finally:
            process.kill()
            process.stdout.close()
            if fleet.upstream is not None:
                fleet.upstream.should_exit = True


def _ng_status(fleet, *args: str) -> subprocess.CompletedProcess:
    port = fleet.head.rsplit(":", 1)[1]
    return subprocess.run([sys.executable, "-m", "gymfleet.cli.status", f"+head_server.port={port}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)


def _policy_row(fleet) -> dict:
    rows = httpx.get(fleet.head + "/server_instances", timeout=10, headers=fleet_headers(fleet.head)).json()
    return next(row for row in rows if row["process_name"] == "policy_model")


def _wait_until(predicate, what: str):
    """`wait_until` for a state read over HTTP from a fleet still starting (no answer, no row yet: not yet)."""
    return wait_until(predicate, what, timeout_s=240, interval_s=0.2, ignore=(httpx.HTTPError, StopIteration))


def test_an_unreachable_policy_url_is_named_while_the_fleet_starts(nano3):
    line = nano3.output.wait_for("waiting for model endpoint", nano3.started + ANNOUNCE_DEADLINE_S)
    assert f"{nano3.url}/models" in line and "used by policy_model" in line
    assert "connection refused" in line and "timeout 600 s" in line


def test_one_start_up_line_per_server_with_url_pid_and_log(nano3):
    names = _instances(NANO3, *_policy_args(nano3.upstream_port))
    deadline = time.monotonic() + 240
    seen = {}
    while len(seen) < len(names):
        line = nano3.output.wait_for("started ", deadline)
        name = line.split()[1]
        seen[name] = line
    assert sorted(seen) == sorted(names)
    for name, line in seen.items():
        assert " on http://127.0.0.1:" in line and f"log: this output, lines prefixed ({name})" in line
        pid = int(line.split(", pid ")[1].split(",")[0])
        # A forked server renames itself (`--instance <name>` in ps) just after the fork that this line reports.
        process = psutil.Process(pid)
        cmdline = wait_until(lambda process=process: "--instance" in (argv := process.cmdline()) and argv,
                             f"the process of pid {pid} renamed itself with --instance", interval_s=0.05)
        assert cmdline[cmdline.index("--instance") + 1] == name, "the pid is that server's process"


def test_ng_status_says_the_model_server_waits_for_its_upstream(nano3):
    row = _wait_until(lambda: (r := _policy_row(nano3))["status"] == "waiting for upstream" and r,
                      "policy_model to answer while its upstream does not")
    assert row["status"] == "waiting for upstream"
    own = httpx.get(row["url"] + "/upstream_status", timeout=10, headers=fleet_headers(nano3.head)).json()
    assert own["status"] == "waiting for upstream" and own["timeout_s"] == 600
    assert own["upstreams"] == [{"url": nano3.url, "ready": False, "answered_after_s": None,
                                 "last_error": own["upstreams"][0]["last_error"]}]
    assert "cannot reach" in own["upstreams"][0]["last_error"]

    table = _ng_status(nano3)
    assert table.returncode == 1, table.stdout + table.stderr
    policy = next(line for line in table.stdout.splitlines() if line.startswith("policy_model "))
    assert re.split(r"\s{2,}", policy)[-3:] == ["waiting for upstream", "0", "waiting for upstream"], policy
    assert f"policy_model: waiting for upstream {nano3.url}: cannot reach" in table.stdout
    assert "timeout 600 s" in table.stdout

    report = json.loads(_ng_status(nano3, "+json=true").stdout)
    policy = next(item for item in report["instances"] if item["process_name"] == "policy_model")
    assert policy["live"] is False and policy["upstream"]["status"] == "waiting for upstream"
    assert report["live"] < report["total"]


def _serve_policy_on(port: int) -> uvicorn.Server:
    """A scripted policy (a real vLLM-compatible server) on `port`, in this process."""
    scripted = ScriptedModel({"name": "policy_upstream", "model": "scripted", "default": {"text": "\\boxed{B}"}})
    app = scripted.create_app()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    return server


def _bring_the_policy_up(fleet) -> None:
    """Serve the policy on the fleet's policy URL and wait until the fleet is fully started."""
    if fleet.upstream is None:
        fleet.upstream = _serve_policy_on(fleet.upstream_port)
        fleet.output.wait_for("servers ready! Head server", time.monotonic() + 240)


def test_once_the_policy_answers_the_fleet_finishes_starting_and_reports_in_plain_lines(nano3):
    if nano3.upstream is None:  # run on its own: the fleet must be waiting on the policy before it comes up
        nano3.output.wait_for("waiting for model endpoint", time.monotonic() + 240)
    _bring_the_policy_up(nano3)
    text = "".join(nano3.output.lines)
    total = len(_instances(NANO3, *_policy_args(nano3.upstream_port)))
    assert f"model endpoint {nano3.url}/models answers (after " in text
    assert f"Servers ready: {total}/{total} (100%)" in text
    assert "\r" not in text, "no progress bar redraws in a pipe"
    assert f"All {total} / {total} servers ready!" in text

    _wait_until(lambda: httpx.get(_policy_row(nano3)["url"] + "/upstream_status",
                                  headers=fleet_headers(nano3.head)).json()["status"] == "ready",
                "the model server's own probe to see its upstream")
    table = ng_status_all_live(int(nano3.head.rsplit(":", 1)[1]))
    assert f"{total} / {total} live" in table.stdout


def test_collect_reports_progress_in_plain_lines_off_a_terminal(nano3, tmp_path):
    _bring_the_policy_up(nano3)
    rows = ROOT / "resources_servers/mcqa/data/example.jsonl"
    port = nano3.head.rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "-m", "gymfleet.cli.collect", f"+head_server.port={port}", "+agent_name=mcqa_simple_agent",
         f"+input_jsonl_fpath={rows}", f"+output_jsonl_fpath={tmp_path / 'out.jsonl'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Rollouts: 5/5 (100%)" in done.stderr and "mean_reward=" in done.stderr
    assert "\r" not in done.stderr


def test_a_model_endpoint_that_never_answers_stops_the_start_naming_it_and_why():
    url = f"http://127.0.0.1:{free_port()}/v1"
    initial = {"config_paths": ["responses_api_models/vllm_model/configs/vllm_model.yaml"],
               "head_server": {"host": "127.0.0.1", "port": free_port()}, "policy_base_url": url,
               "policy_api_key": "k", "policy_model_name": "m", "model_endpoint_readiness_timeout_seconds": 1}
    config = parse_global_config(GlobalConfigDictParserConfig(initial_global_config_dict=initial,
                                                              skip_load_from_cli=True))
    out = io.StringIO()
    fleet = Fleet(config, output=out)
    with pytest.raises(ConfigError, match=rf"not reachable after 1s: \['{url}/models'\] \({url}/models: connection "
                                          r"refused\); check policy_base_url"):
        fleet.start(timeout_s=60)
    said = out.getvalue()
    assert f"waiting for model endpoint {url}/models (used by policy_model): connection refused; timeout 1 s" in said
    assert "started policy_model (responses_api_models/vllm_model) on http://127.0.0.1:" in said
    assert "Servers ready: 1/1 (100%)" in said and "\r" not in said
    assert fleet.children["policy_model"].process.poll() is not None, "a failed start stops what it started"


def test_an_endpoint_served_by_the_fleet_itself_is_waited_for_without_alarm():
    """quickstart's policy is its own scripted_llm: it comes up with the servers, so no "waiting for" line."""
    config = parse_global_config(GlobalConfigDictParserConfig(
        initial_global_config_dict={"config_paths": [QUICKSTART]}, skip_load_from_cli=True))
    said: list[str] = []
    watch = _EndpointWatch.for_config(config, said.append)
    try:
        scripted = config.instance("scripted_llm").url + "/v1/models"
        assert watch.internal == {scripted} and watch.pending() == [scripted]
        assert watch.pending("policy_model") == [scripted] and watch.pending("mcqa") == []
        time.sleep(ENDPOINT_ANNOUNCE_AFTER_S + 0.3)
        assert said == []
    finally:
        watch.stop()


@pytest.mark.parametrize("internal", [True, False])
def test_the_endpoint_probe_shows_the_fleet_token_to_the_fleets_own_servers_only(internal):
    """A fleet's own scripted policy checks the fleet token like every fleet server: probed without it, it logs a
    refused request at every start. A policy outside the fleet (vLLM) is never shown the token."""
    seen: list[str | None] = []

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        seen.append(dict(scope["headers"]).get(b"x-gymfleet-token", b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    with serve(app) as url:
        endpoint = url + "/v1/models"
        watch = _EndpointWatch({endpoint: ["policy_model"]}, 30, lambda line: None,
                               frozenset({endpoint}) if internal else frozenset(), token="the-fleet-token")
        try:
            wait_until(lambda: watch.pending() == [], "the endpoint answers")
        finally:
            watch.stop()
    assert seen == (["the-fleet-token"] if internal else [None])


# ---------------------------------------------------------------------------------------------- vllm_model probe


def _vllm(base_url: str, **global_config) -> VLLMModel:
    return VLLMModel({"name": "policy", "base_url": base_url, "model": "m", "upstream_max_attempts": 1},
                     global_config)


def test_vllm_model_reports_waiting_then_unreachable_and_never_holds_requests_back():
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with serve(_vllm(dead, model_endpoint_readiness_timeout_seconds=1.5).create_app()) as url:
        first = httpx.get(url + "/upstream_status").json()
        assert first["status"] == "waiting for upstream" and first["timeout_s"] == 1.5
        answer = httpx.post(url + "/v1/responses", json={"input": "hi"}, timeout=30)
        assert answer.status_code == 502 and answer.json()["error_type"] == "connection_error"
        later = _wait_until(lambda: (r := httpx.get(url + "/upstream_status").json())["waited_s"] > 1.5 and r,
                            "the probe's timeout")
        assert later["status"] == "upstream unreachable"
        assert later["upstreams"][0]["url"] == dead and "cannot reach" in later["upstreams"][0]["last_error"]


def test_vllm_model_reports_ready_once_its_upstream_answers_and_probes_nothing_unless_asked():
    scripted = ScriptedModel({"name": "llm", "model": "m", "default": {"text": "ok"}})
    with serve(scripted.create_app()) as upstream:
        with serve(_vllm(upstream + "/v1", model_endpoint_readiness_timeout_seconds=30).create_app()) as url:
            ready = _wait_until(lambda: (r := httpx.get(url + "/upstream_status").json())["status"] == "ready" and r,
                                "the upstream to be seen")
            assert ready["upstreams"][0]["ready"] and ready["upstreams"][0]["last_error"] is None
        with serve(_vllm(upstream + "/v1").create_app()) as url:  # built in-process, outside a fleet, key unset
            assert httpx.get(url + "/upstream_status").json()["status"] == "not checked"


# ---------------------------------------------------------------------------------------------- ng_dump_config


def test_ng_dump_config_never_prints_a_none_port():
    out = subprocess.run([sys.executable, "-m", "gymfleet.cli.dump_config", f"+config_paths=[{QUICKSTART}]"],
                         cwd=ROOT, capture_output=True, text=True, check=True, timeout=180).stdout
    assert ":None" not in out
    assert f"base_url: http://127.0.0.1:{UNASSIGNED_PORT}/v1" in out
    assert "port: null  # assigned at start" in out
    loaded = yaml.safe_load(out)
    assert loaded["mcqa"]["resources_servers"]["mcqa"]["port"] is None
    assert loaded["head_server"]["port"] == 11000, "a port that is set is printed as it is"


@pytest.mark.parametrize(("dumped", "expected"), [
    ("base_url: http://127.0.0.1:None/v1\n", f"base_url: http://127.0.0.1:{UNASSIGNED_PORT}/v1\n"),
    ("url: http://[::1]:None\n", f"url: http://[::1]:{UNASSIGNED_PORT}\n"),
    ("urls:\n- http://localhost:None/v1\n", f"urls:\n- http://localhost:{UNASSIGNED_PORT}/v1\n"),
    ("  port: null\n", "  port: null  # assigned at start\n"),
    ("  port: 8000\n", "  port: 8000\n"),
    ("note: 'None of the above'\n", "note: 'None of the above'\n"),
    ("ratio: a:None\n", f"ratio: a:{UNASSIGNED_PORT}\n"),
    ("support_port: null\n", "support_port: null\n"),
], ids=["url", "ipv6", "list item", "null port", "set port", "prose", "host-like prefix", "other key"])
def test_dump_rendering_of_unassigned_ports(dumped, expected):
    assert render(dumped) == expected


# ---------------------------------------------------------------------------------------------- progress


def test_off_a_terminal_progress_is_periodic_plain_lines():
    out = io.StringIO()
    with Progress(4, "Rollouts", unit="rollout", file=out, every_s=0) as bar:
        for reward in (1.0, 0.0, 1.0, 1.0):
            bar.update()
            bar.set_postfix(mean_reward=f"{reward:.3f}")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("Rollouts: 1/4 (25%), 0 s elapsed")
    assert lines[-1].startswith("Rollouts: 4/4 (100%)") and lines[-1].endswith("mean_reward=1.000")
    assert "\r" not in out.getvalue()


def test_off_a_terminal_no_line_before_it_is_due_and_a_last_line_at_the_end():
    out = io.StringIO()
    with Progress(1000, "Checking big.jsonl", unit="B", file=out, every_s=3600) as bar:
        bar.update(512)
        bar.tick()
        assert out.getvalue() == ""
        bar.update(488)
    assert out.getvalue() == "Checking big.jsonl: 1000 B/1000 B (100%), 0 s elapsed\n"


def test_on_a_terminal_progress_is_a_bar_and_lines_go_above_it():
    out = io.StringIO()
    with Progress(3, "Servers ready", unit="server", file=out, terminal=True) as bar:
        bar.update(2)
        bar.write("started mcqa")
    text = out.getvalue()
    assert "\r" in text and "Servers ready" in text and "started mcqa\n" in text


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    with Progress(3, "Rollouts", file=out, enabled=False, every_s=0) as bar:
        bar.update(3)
    assert out.getvalue() == ""


def test_prepare_data_shows_progress_on_large_files(tmp_path, monkeypatch, capsys):
    data = tmp_path / "resources_servers/mcqa/data/example.jsonl"
    data.parent.mkdir(parents=True)
    data.write_bytes((ROOT / "resources_servers/mcqa/data/example.jsonl").read_bytes())
    monkeypatch.chdir(tmp_path)

    def prepare() -> str:
        with pytest.raises(SystemExit) as exited:
            prepare_main([f"+config_paths=[{ROOT / 'resources_servers/mcqa/configs/mcqa.yaml'}]",
                          "+output_dirpath=out", "+mode=example_validation", "+overwrite_metrics_conflicts=true"])
        assert exited.value.code == 0
        return capsys.readouterr().err

    assert "Checking example.jsonl" not in prepare(), "a small file shows no progress"
    monkeypatch.setattr("gymfleet.rollouts.prepare_data.PROGRESS_MIN_BYTES", 1)
    size = data.stat().st_size
    err = prepare()
    assert f"Checking example.jsonl: {size / 1024:.1f} kB/{size / 1024:.1f} kB (100%)" in err
    assert "\r" not in err
