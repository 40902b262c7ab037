"""`/run` and `/run_batch` over real HTTP: statuses, inputs, limits, Python semantics, metrics."""

from __future__ import annotations

import pytest

from sandbox.tests.conftest import assert_no_leftovers, run

STATUS_CASES = [
    ("print('hi')", "python", "ok", 0),
    ("raise ValueError('boom')", "python", "failed", 1),
    ("import sys; sys.exit(3)", "python", "failed", 3),
    ("while True: pass", "python", "timeout", None),
    ("x = bytearray(8 << 30)", "python", "oom", 1),
    ("grow = []\nwhile True: grow.append(bytearray(1 << 24))", "python", "oom", 1),
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
        assert 0.9 < result["duration_s"] < 3


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
    assert result["status"] == "ok" and result["truncated"]
    assert result["stdout"] == "x" * 1000 and result["stderr"] == "e" * 1000


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
