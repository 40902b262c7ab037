"""Fixtures: a real sandbox server (uvicorn on an ephemeral port) and helpers to call it over HTTP."""

from __future__ import annotations

import os
import time

import httpx
import psutil
import pytest

from gymfleet.testing import serve
from sandbox import forked, warm
from sandbox.app import SandboxServer

SECRET_ENV = "GYMFLEET_FAKE_SECRET"
SECRET = "s3cr3t-value-the-sandbox-must-never-see"
SANDBOX_UID = 65534


@pytest.fixture(scope="session")
def sandbox_url():
    """One sandbox server for the session, started with a fake secret in its environment."""
    os.environ[SECRET_ENV] = SECRET
    server = SandboxServer({"name": "sandbox", "default_timeout_s": 5, "max_timeout_s": 30})
    with serve(server.create_app()) as url:
        yield url


@pytest.fixture
def client(sandbox_url):
    with httpx.Client(base_url=sandbox_url, timeout=120) as http_client:
        yield http_client


def run(client: httpx.Client, code: str, **fields) -> dict:
    """POST /run and return the result (asserting HTTP 200)."""
    answer = client.post("/run", json={"code": code, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


def ran_out(result: dict, memory_mb: int) -> bool:
    """Whether `result` is an `oom` of the run's memory as a whole (counted by its cgroup, or by the sampling watch
    where there is none), not of one process's address space."""
    message = result["message"] or ""
    counted = "counted by its memory cgroup" in message or "processes together held" in message
    return result["status"] == "oom" and counted and f"(limit {memory_mb} MiB" in message


def sandbox_processes() -> list[psutil.Process]:
    """Processes running as the sandbox uid (there must be none once a run is over): those under this test process,
    and orphans (nothing but sandboxed processes between them and init). Those a parallel pytest worker's sandbox
    runs are its own business, and so are zombies (dead, holding nothing but a pid, waiting for their parent), and
    the warm sandboxes waiting for a run (`sandbox.warm`: started ahead, no run has been in them) and the fork
    server's own processes (`sandbox.forkserver`: runs are forked from it, it runs none)."""
    found = []
    idle, infrastructure = warm.idle_pids(), forked.server_pids()
    for process in psutil.process_iter(["uids", "pid", "num_threads", "status"]):
        uids = process.info["uids"]
        if (uids is not None and SANDBOX_UID in (uids.real, uids.effective)
                and process.info["status"] != psutil.STATUS_ZOMBIE and process.pid not in infrastructure
                and not fork_server_or_idle(process) and _ours(process, idle)):
            found.append(process)
    return found


IDLE_RUN = {"gf-run-init", "gf-run-idle"}


def fork_server_or_idle(process: psutil.Process) -> bool:
    """A fork server's own process (`sandbox.forkserver`: bwrap outside, the sandbox's init, the fork server), or a
    forked run prepared ahead whose program still waits for its request (by the names they give themselves; so a
    sandbox service in another process is seen through too)."""
    try:
        name = process.name()
        if name == "gf-forkserver":
            return True
        if name in IDLE_RUN:
            tree = [process, *process.children(recursive=True)]
            names = [member.name() for member in tree]
            return all(found in IDLE_RUN for found in names) and "gf-run-idle" in names
        below = process.children()
        return name == "bwrap" and any(member.name() == "gf-forkserver" for child in below
                                       for member in (child, *child.children()))
    except psutil.Error:
        return False


def _ours(process: psutil.Process, idle: set[int]) -> bool:
    try:
        ancestors = process.parents()
        if process.pid in idle or any(ancestor.pid in idle for ancestor in ancestors):
            return False
        if any(ancestor.pid == os.getpid() for ancestor in ancestors):
            return True
        return all(ancestor.pid == 1 or ancestor.uids().real == SANDBOX_UID for ancestor in ancestors)
    except psutil.Error:  # gone meanwhile (or a parent is)
        return False


def assert_no_leftovers(timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {[(p.pid, p.info) for p in left]}"
