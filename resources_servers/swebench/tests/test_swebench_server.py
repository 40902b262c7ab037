"""swebench's pieces and routes: patch paths and test-file rules, the report reader, snapshots (history truncated),
NeMo-Gym's rows (accepted by ng_prepare_data; seeding names the missing image), a sandbox that is down, idle
expiry, and the Docker backend's start-up error (the backend itself: tests/test_containers.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
import subprocess
import tarfile
from pathlib import Path

import httpx
import pytest

from gymfleet import http
from gymfleet.cli.prepare_data import main as prepare_main
from gymfleet.errors import ConfigError
from gymfleet.testing import free_port, make_response, nemo_gym_examples, serve, wait_until
from gymfleet.testing.fleets import datasets_config
from resources_servers.swebench import grading, repos
from resources_servers.swebench.app import SWEBenchServer
from resources_servers.swebench.tests.conftest import ROWS, assert_sessions_closed

NEMO_GYM_ROWS = [json.loads(line) for line in (nemo_gym_examples("swebench") / "example.jsonl").read_text()
                 .splitlines() if line.strip()]


@pytest.mark.parametrize("patch, paths", [
    ("diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1 +1 @@\n-x\n+y\n", {"pkg/a.py"}),
    ("diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n", {"new.py"}),
    ("diff --git a/tests/t.py b/tests/t.py\ndeleted file mode 100644\n--- a/tests/t.py\n+++ /dev/null\n",
     {"tests/t.py"}),
    ("diff --git a/a.py b/tests/a.py\nsimilarity index 100%\nrename from a.py\nrename to tests/a.py\n",
     {"a.py", "tests/a.py"}),
    ('diff --git "a/sp ace.py" "b/sp ace.py"\n--- "a/sp ace.py"\n+++ "b/sp ace.py"\n', {"sp ace.py"}),
    ("--- a/x.py\t2024-01-01\n+++ b/x.py\t2024-01-01\n", {"x.py"}),  # plain unified diff
    ("", set()),
], ids=["edit", "new_file", "deletion", "rename_into_tests", "quoted", "unified", "empty"])
def test_patch_paths(patch, paths):
    assert repos.patch_paths(patch) == paths


@pytest.mark.parametrize("path, is_test", [
    ("tests/test_slug.py", True), ("tests/__init__.py", True), ("pkg/tests/helpers.py", True),
    ("testing/utils.py", True), ("test_x.py", True), ("pkg/x_test.py", True), ("conftest.py", True),
    ("pkg/conftest.py", True), ("pytest.ini", True), ("pkg/slug.py", False), ("pkg/testament.py", False),
    ("latest/x.py", False), ("README.md", False), ("contest.py", False),
])  # fmt: skip
def test_test_file_rule(path, is_test):
    assert repos.is_test_path(path) is is_test


F2P, P2P = ["t.A.test_new"], ["t.A.test_old", "t.A.test_other"]


@pytest.mark.parametrize("report, reward, reason", [
    ({"passed": F2P + P2P, "tampered": []}, 1.0, None),
    ({"passed": P2P, "tampered": []}, 0.0, "fail_to_pass_failed"),
    ({"passed": F2P + P2P[:1], "tampered": []}, 0.0, "pass_to_pass_failed"),
    ({"passed": F2P + P2P, "tampered": ["TestCase.run"]}, 0.0, "tests_tampered"),
    ({"passed": [], "tampered": []}, 0.0, "fail_to_pass_failed"),
    ({}, 0.0, "fail_to_pass_failed"),
], ids=["all_pass", "f2p_fails", "p2p_breaks", "tampered", "nothing_passes", "empty_report"])
def test_score(report, reward, reason):
    grade = grading.score(report, F2P, P2P)
    assert (grade.reward, grade.reason) == (reward, reason)


def test_the_report_needs_the_nonce():
    nonce = grading.new_nonce()
    real = json.dumps({"passed": F2P, "tampered": []})
    forged = "GYMFLEET-REPORT-" + "0" * 32 + ":" + json.dumps({"passed": F2P + P2P})
    assert grading.read_report(f"noise\n{forged}\n{nonce}{real}\n{forged}\n", nonce) == json.loads(real)
    assert grading.read_report(f"{forged}\n", nonce) is None
    assert grading.read_report(f"{nonce}not json\n", nonce) is None
    assert grading.new_nonce() != nonce


def _repo_with_a_later_fix(root: Path) -> tuple[Path, str, str]:
    """A repository whose second commit (after the base) holds a fix that must not reach the snapshot."""
    work = root / "src"
    env = {**repos.GIT_ENV, "PATH": "/usr/bin:/bin"}
    work.mkdir()
    (work / "a.py").write_text("x = 1\n")
    for args in (["init", "-q", "-b", "trunk"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(["git", *args], cwd=work, env=env, check=True)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()
    (work / "a.py").write_text("x = 2  # the fix\n")
    subprocess.run(["git", "commit", "-q", "-am", "fix"], cwd=work, env=env, check=True)
    subprocess.run(["git", "tag", "v2"], cwd=work, env=env, check=True)
    fix = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, env=env, check=True, capture_output=True,
                         text=True).stdout.strip()
    return work, base, fix


def _unpacked(snapshot: repos.Snapshot, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(snapshot.archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "repo"


@pytest.mark.parametrize("kind", ["folder", "bundle", "tar_with_git", "tar_without_git"])
def test_snapshot_truncates_history(tmp_path, kind):
    work, base, fix = _repo_with_a_later_fix(tmp_path)
    source = work
    if kind == "bundle":
        source = tmp_path / "r.bundle"
        subprocess.run(["git", "bundle", "create", "-q", str(source), "--all"], cwd=work, check=True)
    elif kind.startswith("tar"):
        subprocess.run(["git", "checkout", "-q", base], cwd=work, check=True)
        if kind == "tar_without_git":
            shutil.rmtree(work / ".git")
        source = tmp_path / "r.tar.gz"
        with tarfile.open(source, "w:gz") as tar:
            tar.add(work, arcname="project-1.0")
    snapshot = repos.build_snapshot(source, None if kind == "tar_without_git" else base)
    repo = _unpacked(snapshot, tmp_path / "out")
    assert (repo / "a.py").read_text() == "x = 1\n"
    log = subprocess.run(["git", "log", "--all", "--format=%s"], cwd=repo, capture_output=True, text=True).stdout
    assert log.split() == ["base"], log
    later = subprocess.run(["git", "cat-file", "-e", fix], cwd=repo, capture_output=True)
    assert later.returncode != 0, "the later commit (the fix) survived in the snapshot's objects"
    assert subprocess.run(["git", "tag"], cwd=repo, capture_output=True, text=True).stdout == ""
    if kind != "tar_without_git":  # else the commit is made from the archive's files
        assert snapshot.base_commit == base


def test_snapshot_errors_name_the_problem(tmp_path):
    work, _, _ = _repo_with_a_later_fix(tmp_path)
    with pytest.raises(repos.RepoSourceError, match="not found"):
        repos.resolve_source(str(tmp_path / "missing.bundle"))
    with pytest.raises(repos.RepoSourceError, match="base_commit 0{40} is not in"):
        repos.build_snapshot(work, "0" * 40)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(repos.RepoSourceError, match="neither a git bundle"):
        repos.build_snapshot(tmp_path / "notes.txt", None)


def test_nemo_gym_rows_are_accepted_by_prepare_data(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    shutil.copy(nemo_gym_examples("swebench") / "example.jsonl", tmp_path / "nemo_gym.jsonl")
    datasets_config(tmp_path / "cfg.yaml", "resources_servers/swebench/configs/swebench.yaml", "swebench_swe_agent",
                    "swe_agent", [{"name": "example", "type": "example", "jsonl_fpath": "nemo_gym.jsonl"}])
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit) as exited:
        prepare_main(["+config_paths=[cfg.yaml]", "+output_dirpath=out", "+mode=example_validation"])
    assert exited.value.code == 0
    assert len((tmp_path / "out/example.jsonl").read_text().splitlines()) == len(NEMO_GYM_ROWS) == 5
    assert "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest" in caplog.text
    assert "docker pull" in caplog.text


def test_a_row_needing_an_image_fails_naming_it(sandbox):
    url, sandbox_server = sandbox
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": url})
    row = NEMO_GYM_ROWS[0]
    with serve(server.create_app()) as env_url, httpx.Client(base_url=env_url, timeout=60) as client:
        seeded = client.post("/seed_session", json=row).json()
        assert "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest" in seeded["error"]
        assert "docker pull" in seeded["error"] and "repo_source" in seeded["error"]
        tool = client.post("/bash", json={"command": "ls"}).json()
        assert "not available" in tool["error"]
        result = client.post("/verify", json={**row, "response": make_response("done")}).json()
    assert result["_ng_failure_class"] == "sandbox_failed" and "astropy_1776_astropy-12907" in result["failure"]
    assert result["reward"] == 0.0 and result["instance_id"] == row["instance_id"]
    assert_sessions_closed(sandbox_server)


def test_a_sandbox_that_is_down_is_a_failure_row_not_a_zero():
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": f"http://127.0.0.1:{free_port()}"})
    server.sandbox.retry = http.RetryPolicy(max_attempts=1)  # refused at once, not after the backoff
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert "sandbox" in client.post("/seed_session", json=ROWS[0]).json()["error"]
        result = client.post("/verify", json={**ROWS[0], "response": make_response("")}).json()
    assert result["_ng_failure_class"] == "sandbox_failed" and result["reward"] == 0.0


def test_idle_sessions_are_closed_and_tools_need_a_session(sandbox):
    url, sandbox_server = sandbox
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": url, "session_idle_s": 0.3})
    with serve(server.create_app()) as env_url, httpx.Client(base_url=env_url, timeout=60) as client:
        assert "seed_session" in client.post("/bash", json={"command": "ls"}).json()["error"]
        assert client.post("/seed_session", json=ROWS[0]).json() == {}
        assert client.post("/bash", json={"command": "sleep 30 & echo started"}).json()["stdout"] == "started\n"
        assert len(sandbox_server.sessions) == 1
        wait_until(lambda: not server.workspaces, "the idle workspace was closed (session_idle_s=0.3)",
                   interval_s=0.05)
        assert_sessions_closed(sandbox_server)  # the background sleep died with its session
        assert "seed_session" in client.post("/bash", json={"command": "ls"}).json()["error"]
        result = client.post("/verify", json={**ROWS[0], "response": make_response("")}).json()
        assert (result["_ng_failure_class"], result["reward"]) == ("session_lost", 0.0), "no grade of a closed session"
        result = client.post("/verify", json={**ROWS[0], "response": make_response("")}).json()
    assert (result["reward"], result["reason"]) == (0.0, "no_session")


def test_bash_reports_timeouts_and_truncates_output(sandbox):
    url, sandbox_server = sandbox
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": url, "max_output_chars": 500})
    with serve(server.create_app()) as env_url, httpx.Client(base_url=env_url, timeout=60) as client:
        client.post("/seed_session", json=ROWS[0])
        big = client.post("/bash", json={"command": "seq 1 5000; echo oops >&2; exit 3"}).json()
        assert big["exit_code"] == 3 and "characters cut" in big["stdout"] and big["stdout"].endswith("5000\n")
        assert big["stderr"] == "oops\n"
        spin = client.post("/bash", json={"command": "while :; do :; done", "timeout_s": 1}).json()
        assert spin["status"] == "timeout" and "limit" in spin["message"]
        assert client.post("/bash", json={"command": "echo alive"}).json()["stdout"] == "alive\n"
        assert "error" in client.post("/view_file", json={"path": "/etc/passwd"}).json()
        assert "invalid arguments" in client.post("/bash", json={"cmd": "ls"}).json()["error"]
        client.post("/verify", json={**ROWS[0], "response": make_response("")})
    assert_sessions_closed(sandbox_server)


def test_docker_backend_without_an_engine_fails_at_start_up_saying_so(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing listens there
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": "http://127.0.0.1:1",
                             "backend": "docker"})
    with pytest.raises(ConfigError, match="does not answer"):
        asyncio.run(server.startup())
