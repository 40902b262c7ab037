"""`/run` and `/run_batch` over real HTTP: statuses, inputs, limits, Python semantics, metrics."""

from __future__ import annotations

import base64
import io
import tarfile

import pytest

from sandbox.tests.conftest import assert_no_leftovers, run

STATUS_CASES = [
    ("print('hi')", "python", "ok", 0),
    ("raise ValueError('boom')", "python", "failed", 1),
    ("import sys; sys.exit(3)", "python", "failed", 3),
    ("while True: pass", "python", "timeout", None),
    ("x = bytearray(8 << 30)", "python", "oom", 1),
    ("grow = []\nwhile True: grow.append(bytearray(1 << 26))", "python", "oom", 1),  # 64 MiB steps: quick under load
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "python", "killed", -9),
    ("import ctypes; ctypes.string_at(0)", "python", "failed", -11),
    ("echo hi", "bash", "ok", 0),
    ("exit 4", "bash", "failed", 4),
    ("while :; do :; done", "bash", "timeout", None),
]


@pytest.mark.parametrize(("code", "language", "status", "return_code"), STATUS_CASES,
                         ids=["ok", "exception", "exit-3", "loop", "alloc-8g", "grow", "self-kill", "segfault",
                              "bash-ok", "bash-exit", "bash-loop"])
def test_statuses(client, code, language, status, return_code):
    result = run(client, code, language=language, timeout_s=1, memory_mb=256)
    assert (result["status"], result["return_code"]) == (status, return_code), result
    assert (result["message"] is None) == (status == "ok")
    if status == "timeout":
        assert "limit" in result["message"], result  # CPU or wall-clock, whichever a busy machine hits first


def test_stdin_args_and_files(client):
    code = "import sys, helper\nprint(sys.stdin.read().upper(), sys.argv[1:], helper.VALUE, open('data/x.txt').read())"
    result = run(client, code, stdin="abc", args=["-v", "2"], files={"helper.py": "VALUE = 7", "data/x.txt": "xyz"})
    assert result["stdout"] == "ABC ['-v', '2'] 7 xyz\n"


def test_bash_sees_stdin_args_and_files(client):
    result = run(client, 'read line; echo "$line $1 $(cat f.txt)"', language="bash", stdin="in\n", args=["a"],
                 files={"f.txt": "file"})
    assert result["stdout"] == "in a file\n"


def test_output_is_truncated_with_a_flag(client):
    result = run(client, "import sys\nprint('x' * 10**7)\nsys.stderr.write('e' * 10**6)", max_output_bytes=1000)
    assert result["status"] == "ok" and result["truncated"] and result["stdout_truncated"]
    assert result["stdout"] == "x" * 1000 and result["stderr"] == "e" * 1000
    only = run(client, "import sys\nprint('short')\nsys.stderr.write('e' * 10**6)", max_output_bytes=1000)
    assert (only["truncated"], only["stdout_truncated"], only["stdout"]) == (True, False, "short\n")  # stderr only


@pytest.mark.parametrize(("code", "stdout", "stderr_end", "return_code"), [
    ("exit()", "", "", 0),
    ("print('a'); quit(5)", "a\n", "", 5),
    ("import sys; sys.exit('bye')", "", "bye\n", 1),
    ("import atexit; atexit.register(print, 'at exit'); print('main')", "main\nat exit\n", "", 0),
    ("import threading\nthreading.stack_size(1 << 26)\nthreading.Thread(target=lambda: print('in thread')).start()",
     "in thread\n", "", 0),
    ("print(__name__, __file__)", "__main__ /workspace/main.py\n", "", 0),
    ("from multiprocessing import Pool\nwith Pool(2) as pool: print(pool.map(abs, [-1, -2]))", "[1, 2]\n", "", 0),
    ("def f(:\n  pass", "", "SyntaxError: invalid syntax\n", 1),
], ids=["exit", "quit-5", "exit-message", "atexit", "thread-main", "dunder-main", "multiprocessing", "syntax-error"])
def test_python_behaves_like_the_interpreter(client, code, stdout, stderr_end, return_code):
    result = run(client, code)
    assert (result["stdout"], result["return_code"]) == (stdout, return_code), result
    assert result["stderr"].endswith(stderr_end) and "gymfleet" not in result["stderr"]


@pytest.mark.parametrize(("code", "status", "return_code", "stdout"), [
    ("import os\npid = os.fork()\nif pid == 0:\n    print('child')\nelse:\n    os.waitpid(pid, 0)\n    print('main')",
     "ok", 0, "child\nmain\n"),
    ("import os\npid = os.fork()\nif pid == 0:\n    raise SystemExit(0)\nos.waitpid(pid, 0)\nraise SystemExit(3)",
     "failed", 3, ""),
    ("import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    raise SystemExit(3)", "ok", 0, ""),
], ids=["child-ends-first", "child-exits-0-main-3", "main-exits-0-child-left"])
def test_the_main_process_decides_when_a_program_forks(client, code, status, return_code, stdout):
    # As with `python main.py`: the exit status is the main process's, whichever copy ends first.
    result = run(client, code)
    assert (result["status"], result["return_code"], result["stdout"]) == (status, return_code, stdout), result


def test_an_archive_seeds_the_workspace_before_the_files(client):
    archive = _tar({"pkg/__init__.py": "VALUE = 'from the archive'", "data/x.txt": "old", "run.sh": "echo sh"})
    code = "import pkg\nprint(pkg.VALUE, open('data/x.txt').read())"
    result = run(client, code, archive=archive, files={"data/x.txt": "new"})
    assert result["stdout"] == "from the archive new\n", result
    assert run(client, "bash run.sh", language="bash", archive=archive)["stdout"] == "sh\n"


@pytest.mark.parametrize("member", ["../outside.txt", "/abs.txt", "link-out"], ids=["dotdot", "absolute", "symlink"])
def test_an_archive_that_reaches_outside_is_refused(client, member):
    archive = _tar({member: "x"}, symlink_to="/etc" if member == "link-out" else None)
    result = run(client, "print('ran')", archive=archive)
    assert result["status"] == "failed" and "could not set up" in result["message"], result
    assert "outside the workspace" in result["message"] or "leaves the workspace" in result["message"]


def test_an_archive_that_is_not_base64_is_a_422(client):
    assert client.post("/run", json={"code": "", "archive": "not base64!"}).status_code == 422


def _tar(files: dict[str, str], symlink_to: str | None = None) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            if symlink_to:
                info.type, info.linkname = tarfile.SYMTYPE, symlink_to
                tar.addfile(info)
                continue
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("code", ["x = " + "-" * 100_000 + "1", "x = " + "+".join(["1"] * 200_000)],
                         ids=["parser-memory-error", "compiler-recursion-error"])
def test_a_program_too_deep_to_compile_is_the_programs_failure(client, code):
    # Not a set-up failure: that would read as the sandbox's fault (and a resources server would not score it).
    result = run(client, code)
    assert result["status"] in ("failed", "oom") and "could not set up" not in result["message"], result
    assert "Error" in result["stderr"], result


def test_tracebacks_show_only_the_program(client):
    stderr = run(client, "def f():\n    return 1 / 0\nf()")["stderr"]
    assert stderr.startswith("Traceback (most recent call last):\n  File \"/workspace/main.py\", line 3")
    assert "ZeroDivisionError" in stderr and "launcher" not in stderr


def test_deep_recursion_works(client):
    code = "import sys\nsys.setrecursionlimit(10**6)\ndef d(n): return 0 if n == 0 else 1 + d(n - 1)\nprint(d(200000))"
    assert run(client, code, memory_mb=2048)["stdout"] == "200000\n"


def test_batch_runs_each_case_in_a_fresh_process(client):
    code = "import sys\nseen = globals().setdefault('seen', [])\nseen.append(1)\nprint(int(input()) * 2, len(seen))"
    answer = client.post("/run_batch", json={"code": code, "cases": [{"stdin": "1"}, {"stdin": "2"}, {"stdin": "3"}]})
    assert [r["stdout"] for r in answer.json()["results"]] == ["2 1\n", "4 1\n", "6 1\n"]


def test_batch_stops_at_first_failure_when_asked(client):
    cases = [{"stdin": "1"}, {"stdin": "x"}, {"stdin": "3"}]
    body = {"code": "print(int(input()))", "cases": cases}
    assert len(client.post("/run_batch", json=body).json()["results"]) == 3
    results = client.post("/run_batch", json={**body, "stop_on_failure": True}).json()["results"]
    assert [r["status"] for r in results] == ["ok", "failed"]


def test_batch_prelude_is_shared_and_args_reach_each_case(client):
    body = {"code": "import sys\nprint(PRELUDE_VALUE, sys.argv[1])", "prelude": "PRELUDE_VALUE = 'pre'",
            "cases": [{"args": ["a"]}, {"args": ["b"]}]}
    assert [r["stdout"] for r in client.post("/run_batch", json=body).json()["results"]] == ["pre a\n", "pre b\n"]


def test_a_timeout_in_a_batch_is_per_case(client):
    body = {"code": "import time\nn = int(input())\ntime.sleep(n)\nprint(n)", "timeout_s": 1,
            "cases": [{"stdin": "0"}, {"stdin": "5"}, {"stdin": "0"}]}
    results = client.post("/run_batch", json=body).json()["results"]
    assert [r["status"] for r in results] == ["ok", "timeout", "ok"]


def test_limits_above_the_maxima_are_a_400_and_bad_bodies_a_422(client):
    assert client.post("/run", json={"code": "", "timeout_s": 10_000}).status_code == 400
    assert client.post("/run", json={"code": "", "memory_mb": 10**7}).status_code == 400
    assert client.post("/run", json={"code": "", "language": "cobol"}).status_code == 422
    assert client.post("/run", json={"code": "", "files": {"../escape": "x"}}).status_code == 422
    assert client.post("/run_batch", json={"code": "", "cases": []}).status_code == 422


def test_metrics_and_info(client):
    run(client, "print(1)")
    metrics = client.get("/metrics").text
    assert 'gymfleet_sandbox_runs_total{language="python",status="ok"}' in metrics
    for family in ("gymfleet_sandbox_queue_depth", "gymfleet_sandbox_run_seconds_bucket", "gymfleet_sandbox_running"):
        assert family in metrics
    info = client.get("/info").json()
    assert info["isolation"] == "bwrap" and info["max_concurrent_runs"] >= 1


def test_nothing_outlives_a_run(client):
    run(client, "import subprocess\nsubprocess.Popen(['sleep', '300'])\nprint('started')")
    run(client, "nohup sleep 300 >/dev/null 2>&1 &\necho started", language="bash")
    assert_no_leftovers()
