"""Memory cgroups (`sandbox.cgroups`): memory that sampling the processes cannot see is counted and ends `oom` within
the limit; no cgroup outlives its sandbox, nor its service; the sampling watch still works where it is chosen.

This module needs a writable memory cgroup (v2, or v1's memory hierarchy, as on CI): where there is none, its server
does not start and says why (`memory_accounting: cgroup`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import serve
from sandbox import cgroups
from sandbox.app import SandboxServer
from sandbox.tests.conftest import assert_no_leftovers, ran_out, run

LIMIT_MB = 64

# Each holds its memory where no process maps it, then sleeps past its deadline: only the cgroup ends it as `oom`.
GAPS = {
    # SysV segments created, filled and detached: they live on in the sandbox's IPC namespace, owned by nobody.
    "sysv-shm-detached": "import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.shmat.restype = ctypes.c_void_p\n"
                         "for _ in range(16):\n"
                         "    segment = libc.shmat(libc.shmget(0, 8 << 20, 0o1600), None, 0)\n"
                         "    ctypes.memset(segment, 1, 8 << 20)\n"
                         "    libc.shmdt(ctypes.c_void_p(segment))\n"
                         "time.sleep(60)",
    # memfds written, sent over a unix socket and closed: their only reference is in flight.
    "memfd-in-a-socket": "import os, socket, time\nsend, keep = socket.socketpair()\n"
                         "for _ in range(16):\n"
                         "    fd = os.memfd_create('hidden')\n    os.write(fd, b'x' * (8 << 20))\n"
                         "    socket.send_fds(send, [b'x'], [fd])\n    os.close(fd)\n"
                         "time.sleep(60)",
    # Pipes (grown to 1 MiB where the per-user pipe quota allows) and unix socket pairs, filled and left unread, in 8
    # processes (each may hold 256 descriptors).
    "pipe-and-socket-buffers": "import fcntl, os, socket, time\n"
                               "for _ in range(7):\n    if os.fork() == 0:\n        break\n"
                               "held = []\n"
                               "for _ in range(60):\n"
                               "    r, w = os.pipe()\n"
                               "    try:\n        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)\n"
                               "    except OSError:\n        pass\n"
                               "    a, b = socket.socketpair()\n    held += [r, w, a, b]\n"
                               "    os.set_blocking(w, False)\n    a.setblocking(False)\n"
                               "    for write in (lambda: os.write(w, b'x' * 65536), lambda: a.send(b'x' * 65536)):\n"
                               "        try:\n            while True: write()\n"
                               "        except OSError:\n            pass\n"
                               "time.sleep(60)",
    # Files in the sandbox's tmpfs (also counted by the sampling watch).
    "tmpfs-files": "chunk = b'x' * (8 << 20)\nfor name in range(16):\n"
                   "    with open(f'/tmp/{name}', 'wb') as f: f.write(chunk)\n"
                   "import time; time.sleep(60)",
}


@pytest.fixture(scope="module")
def cgroup_server():
    server = SandboxServer({"name": "sandbox", "memory_accounting": "cgroup", "default_timeout_s": 5,
                            "default_memory_mb": LIMIT_MB})
    with serve(server.create_app()) as url:
        yield server, url


@pytest.fixture(scope="module")
def client(cgroup_server):
    with httpx.Client(base_url=cgroup_server[1], timeout=120) as http_client:
        yield http_client


def test_the_service_says_it_counts_with_cgroups(client):
    assert client.get("/info").json()["memory_accounting"].startswith("cgroup v"), client.get("/info").text


@pytest.mark.parametrize("name", GAPS)
def test_memory_no_process_maps_ends_oom_within_the_limit(client, name):
    result = run(client, GAPS[name], timeout_s=5)
    assert ran_out(result, LIMIT_MB), result
    assert int(result["message"].split("reached ")[1].split()[0]) <= LIMIT_MB, result
    assert_no_leftovers()


def test_a_batch_goes_on_after_a_case_ran_out(client):
    body = {"code": "import sys\nif input() == 'bomb':\n    exec(sys.argv[1])\nprint('next case')",
            "cases": [{"stdin": "bomb", "args": [GAPS["memfd-in-a-socket"]]}, {"stdin": "x", "args": [""]}],
            "timeout_s": 5}
    results = client.post("/run_batch", json=body).json()["results"]
    assert ran_out(results[0], LIMIT_MB) and results[1]["stdout"] == "next case\n", results


def test_a_sessions_memory_is_its_cgroups(client):
    session = client.post("/sessions", json={"timeout_s": 5}).json()["session_id"]
    try:
        metrics = client.get("/metrics").text  # what the session's cgroup holds, measured (its kernel at least)
        used = [line for line in metrics.splitlines() if line.startswith("gymfleet_sandbox_memory_used_bytes ")]
        assert used and 0 < float(used[0].split()[1]) <= LIMIT_MB << 20, used
        result = client.post(f"/sessions/{session}/exec", json={"code": GAPS["sysv-shm-detached"]}).json()
        assert ran_out(result, LIMIT_MB) and "the session has ended" in result["message"], result
    finally:
        client.delete(f"/sessions/{session}")


def test_no_cgroup_is_left_behind(cgroup_server, client):
    # A timed-out run with children, a run that ran out, an ordinary one, a deleted session: all gone afterwards.
    run(client, "import os, time\nos.fork(); os.fork()\ntime.sleep(60)", timeout_s=1)
    run(client, GAPS["tmpfs-files"], timeout_s=5)
    assert run(client, "print('ok')")["stdout"] == "ok\n"
    session = client.post("/sessions", json={}).json()["session_id"]
    assert client.delete(f"/sessions/{session}").status_code == 200
    hierarchy = cgroup_server[0].runner.cgroups
    deadline = time.monotonic() + 10  # runs are torn down after they answer
    while (left := hierarchy.ours()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left and not hierarchy.live, left
    assert_no_leftovers()


def test_the_cgroups_of_a_service_that_died_are_swept(cgroup_server):
    hierarchy = cgroup_server[0].runner.cgroups
    dead = subprocess.Popen(["true"])  # a service that is gone: its pid is free (and no process started at tick 1)
    dead.wait()
    leftover = hierarchy.parent / f"{cgroups.PREFIX}{dead.pid}-1-abcdef-0123456789ab"
    leftover.mkdir()
    survivor = subprocess.Popen(["sleep", "60"])
    live = hierarchy.create(LIMIT_MB << 20)  # this live service's own: never swept
    try:
        (leftover / "cgroup.procs").write_text(str(survivor.pid))
        assert hierarchy.sweep() >= 1
        assert survivor.wait(10) == -9 and not leftover.exists()
        assert hierarchy.ours() == [live.path]
    finally:
        survivor.kill()
        survivor.wait()
        if leftover.exists():
            leftover.rmdir()
        live.path.rmdir()
        hierarchy.live.discard(live)


def test_the_sampling_watch_still_counts_where_it_is_chosen():
    server = SandboxServer({"name": "sandbox", "memory_accounting": "rss", "default_timeout_s": 5})
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=120) as client:
        assert client.get("/info").json()["memory_accounting"] == "rss"
        result = run(client, GAPS["tmpfs-files"], timeout_s=5, memory_mb=LIMIT_MB)
        assert ran_out(result, LIMIT_MB) and "processes together held" in result["message"], result
        assert server.runner.cgroups is None


def write_proc(folder: Path, cgroup: str, mountinfo: str) -> Path:
    folder.mkdir()
    (folder / "cgroup").write_text(cgroup)
    (folder / "mountinfo").write_text(mountinfo)
    return folder


def test_without_a_memory_cgroup_auto_falls_back_with_one_line_and_cgroup_refuses(tmp_path, caplog):
    # A v2-only host whose cgroup does not show (a container without its cgroup mounted), no v1 memory hierarchy.
    proc = write_proc(tmp_path / "proc", "0::/not/mounted/here\n",
                      f"41 31 0:38 / {tmp_path}/absent rw,relatime - cgroup2 cgroup2 rw\n")
    with caplog.at_level("INFO", logger="sandbox.cgroups"):
        assert cgroups.detect("auto", proc=proc) is None
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "sampling watch" in lines[0] and "cgroup v2 is not visible" in lines[0], lines
    with pytest.raises(cgroups.CgroupUnavailable, match="v1 memory hierarchy"):
        cgroups.detect("cgroup", proc=proc)
    assert cgroups.detect("rss", proc=Path("/proc/self")) is None


@pytest.mark.parametrize("layout", ["v2", "v1-container"])
def test_the_service_finds_its_own_cgroup_in_either_hierarchy(tmp_path, layout):
    # The parsing only (this host has one layout): a v2 host whose service cgroup has the memory controller and
    # enables it for its children; a v1 container whose memory mount shows only its own cgroup (mount root != "/").
    mount = tmp_path / "cgroup"
    if layout == "v2":
        own = mount / "system.slice" / "sandbox.service"
        own.mkdir(parents=True)
        (own / "cgroup.controllers").write_text("cpu io memory pids\n")
        (own / "cgroup.subtree_control").write_text("memory\n")
        proc = write_proc(tmp_path / "proc", "0::/system.slice/sandbox.service\n",
                          f"30 25 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    else:
        own = mount
        own.mkdir()
        proc = write_proc(tmp_path / "proc", "5:memory:/docker/abc\n0::/\n",
                          f"35 31 0:32 /docker/abc {mount} rw,relatime - cgroup cgroup rw,memory\n")
    hierarchy = cgroups._find(proc)
    assert (hierarchy.version, hierarchy.parent) == ((2, own) if layout == "v2" else (1, own))
