"""Sessions over real HTTP: state that persists, the shared workspace, per-exec limits, ending and expiry."""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile
import time

import httpx
import pytest

from gymfleet.testing import serve
from sandbox.app import SandboxServer
from sandbox.tests.conftest import assert_no_leftovers, ran_out


def _exec(client, session_id: str, code: str, **fields) -> dict:
    answer = client.post(f"/sessions/{session_id}/exec", json={"code": code, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.fixture
def session_id(client):
    created = client.post("/sessions", json={"files": {"seed.txt": "seeded"}, "timeout_s": 2})
    assert created.status_code == 200, created.text
    yield created.json()["session_id"]
    client.delete(f"/sessions/{created.json()['session_id']}")


def test_python_state_persists_between_execs(client, session_id):
    assert _exec(client, session_id, "import math\nx = 41\nprint('set')")["stdout"] == "set\n"
    assert _exec(client, session_id, "x + 1")["stdout"] == "42\n"  # a final expression is displayed
    assert _exec(client, session_id, "def f(): return math.pi\nround(f(), 2)")["stdout"] == "3.14\n"


def test_bash_and_python_share_the_workspace(client, session_id):
    assert _exec(client, session_id, "cat seed.txt; echo made > made.txt", language="bash")["stdout"] == "seeded"
    assert _exec(client, session_id, "open('made.txt').read()")["stdout"] == "'made\\n'\n"


def test_errors_are_results_and_the_session_goes_on(client, session_id):
    failed = _exec(client, session_id, "1 / 0")
    assert failed["status"] == "failed" and "ZeroDivisionError" in failed["stderr"]
    assert _exec(client, session_id, "import sys; sys.exit(2)")["return_code"] == 2
    assert _exec(client, session_id, "'still here'")["stdout"] == "'still here'\n"


def test_an_interruptible_timeout_keeps_the_session(client, session_id):
    _exec(client, session_id, "y = 'kept'")
    assert _exec(client, session_id, "import time; time.sleep(30)", timeout_s=0.5)["status"] == "timeout"
    assert _exec(client, session_id, "y")["stdout"] == "'kept'\n"


@pytest.mark.parametrize(("code", "status"), [("sum(range(10**11))", "timeout"), ("import os; os._exit(0)", "ok")],
                         ids=["uninterruptible", "exit"])
def test_a_broken_worker_ends_the_session(client, session_id, code, status):
    # The worker that held the session's state is gone (killed past its limit, or it exited): the result is its
    # real outcome, and the session ends with it.
    result = _exec(client, session_id, code, timeout_s=0.5)
    assert result["status"] == status and "session has ended" in result["message"], result
    assert client.post(f"/sessions/{session_id}/exec", json={"code": "1"}).status_code == 404
    assert_no_leftovers()


def test_delete_then_404(client, session_id):
    assert client.delete(f"/sessions/{session_id}").json() == {"deleted": True}
    assert client.delete(f"/sessions/{session_id}").status_code == 404
    assert client.post(f"/sessions/{session_id}/exec", json={"code": "1"}).status_code == 404


def test_session_memory_limit(client):
    session = client.post("/sessions", json={"memory_mb": 256}).json()["session_id"]
    assert _exec(client, session, "x = bytearray(1 << 30)")["status"] == "oom"
    assert _exec(client, session, "'alive'")["stdout"] == "'alive'\n"
    client.delete(f"/sessions/{session}")


def test_idle_sessions_expire_and_the_session_count_is_capped():
    server = SandboxServer({"name": "sandbox", "session_idle_timeout_s": 0.5, "max_sessions": 1})
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=60) as client:
        first = client.post("/sessions", json={}).json()["session_id"]
        refused = client.post("/sessions", json={})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        time.sleep(1.5)
        assert client.post(f"/sessions/{first}/exec", json={"code": "1"}).status_code == 404
        assert client.post("/sessions", json={}).status_code == 200
    assert_no_leftovers()


async def test_the_client_session_api(sandbox_url):
    from gymfleet.grading.sandbox_client import SandboxClient, SessionGoneError

    client = SandboxClient(url=sandbox_url)
    async with await client.session(files={"a.txt": "A"}) as session:
        await session.exec("data = open('a.txt').read()")
        assert (await session.exec("data * 2")).stdout == "'AA'\n"
        assert (await session.exec("ls", "bash")).stdout.split() == ["a.txt"]
    with pytest.raises(SessionGoneError):
        await session.exec("1")
    await asyncio.sleep(0)


def test_a_session_starts_from_a_repository_snapshot(client):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in {"repo/pkg/__init__.py": "def answer():\n    return 42\n", "repo/README": "hi"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    archive = base64.b64encode(buffer.getvalue()).decode()
    created = client.post("/sessions", json={"archive": archive, "files": {"repo/notes.txt": "mine"}})
    session = created.json()["session_id"]
    try:
        listing = _exec(client, session, "cd repo && ls && cat notes.txt", language="bash")
        assert listing["stdout"] == "README\nnotes.txt\npkg\nmine", listing
        imported = _exec(client, session, "import sys\nsys.path.insert(0, 'repo')\nimport pkg\npkg.answer()")
        assert imported["stdout"] == "42\n", imported
    finally:
        client.delete(f"/sessions/{session}")


def test_a_snapshot_that_reaches_outside_is_a_400(client):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../../etc/evil")
        tar.addfile(info, io.BytesIO(b""))
    refused = client.post("/sessions", json={"archive": base64.b64encode(buffer.getvalue()).decode()})
    assert refused.status_code == 400 and "outside the workspace" in refused.text, refused.text
    assert client.post("/sessions", json={"archive": "%%%"}).status_code == 422
    assert_no_leftovers()


def test_a_forked_copy_of_the_kernel_does_not_answer_for_it(client, session_id):
    code = ("import os\npid = os.fork()\nif pid == 0:\n    print('child')\n"
            "else:\n    os.waitpid(pid, 0)\n    print('main')")
    assert _exec(client, session_id, "x = 'kept'")["status"] == "ok"
    assert _exec(client, session_id, code)["stdout"] == "child\nmain\n"
    assert _exec(client, session_id, "x")["stdout"] == "'kept'\n"  # the next answer is the kernel's, in order


def test_the_memory_of_an_execs_processes_together_is_limited(client):
    session = client.post("/sessions", json={"memory_mb": 512, "timeout_s": 5}).json()["session_id"]
    hogs = ("import subprocess, sys\n"
            "hog = 'b = bytearray(200 << 20); import time; time.sleep(60)'\n"
            "procs = [subprocess.Popen([sys.executable, '-c', hog]) for _ in range(6)]\n"
            "print([p.wait() for p in procs])")
    try:
        _exec(client, session, "kept = 'yes'")
        result = _exec(client, session, hogs)
        assert ran_out(result, 512), result
        # The watch killed every process of the program, the worker holding the session's state among them (only
        # the kernel, which runs no model code, is spared): the session ends, and nothing of it is left.
        assert "the session has ended" in result["message"], result
        assert client.post(f"/sessions/{session}/exec", json={"code": "kept"}).status_code == 404
        assert_no_leftovers()
    finally:
        client.delete(f"/sessions/{session}")
