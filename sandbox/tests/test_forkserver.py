"""Runs forked from the fork server (`sandbox.forkserver`) start from the same state each time: nothing a run does,
or leaves running, can be seen by the next run or by one running beside it.

One probe program prints everything a run could observe of another (files in every writable place, environment,
modules, patched built-ins, descriptors, signal handlers, working directory, umask, processes, SysV IPC, sockets,
limits); each way of leaving state behind runs first (or alongside, still running), and the probe must print what it
prints in a fresh sandbox. A forked run also starts as a cold one does: the same probe in a sandbox started for the
run (`fork_server: false`) prints the same.
"""

from __future__ import annotations

import json
import resource
import threading
import time

import httpx
import pytest

from gymfleet.testing import serve
from sandbox.app import SandboxServer
from sandbox.tests.conftest import assert_no_leftovers, run

PROBE = r'''
import builtins, json, os, resource, signal, sys
def listing(path):
    found = []
    for root, dirs, files in os.walk(path):
        found += [os.path.join(root, name) for name in sorted(dirs + files)]
    return sorted(found)
def read(path):
    try:
        return open(path).read()
    except OSError as exc:
        return type(exc).__name__
state = {
    "files": {path: listing(path) for path in ("/workspace", "/tmp", "/dev/shm")},
    "env": dict(os.environ),
    "modules": sorted(sys.modules),
    "builtins": sorted(name for name in dir(builtins)),
    "patched": [hasattr(sys, "leftover"), print.__module__, os.getcwd.__module__, type(open).__name__],
    "fds": sorted(os.listdir("/proc/self/fd")),
    "signals": {int(sig): str(signal.getsignal(sig)) for sig in signal.valid_signals()
                if sig not in (signal.SIGKILL, signal.SIGSTOP)},
    "cwd": os.getcwd(),
    "umask": os.umask(0o22),
    "processes": sorted(name for name in os.listdir("/proc") if name.isdigit()),
    "ipc": [read(f"/proc/sysvipc/{kind}").splitlines()[1:] for kind in ("shm", "msg", "sem")],
    "sockets": [read(f"/proc/net/{kind}").splitlines()[1:] for kind in ("tcp", "tcp6", "udp", "unix")],
    "limits": [resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")],
    "path": sys.path[1:],
    "hostname": os.uname().nodename,
}
print(json.dumps(state, sort_keys=True))
'''

HOLD = "\nimport sys, time\nsys.stdout.write('held\\n')\nsys.stdout.flush()\ntime.sleep(30)\n"

LEAVES = {  # each leaves something behind (the `HOLD` variants keep running while the probe runs beside them)
    "files": "for d in ('/workspace', '/tmp', '/dev/shm'):\n    open(d + '/left', 'w').write('x')\n"
             "import os\nos.makedirs('/workspace/sub/dir', exist_ok=True)",
    "environment": "import os\nos.environ['LEFT'] = '1'\nos.putenv('LEFT2', '1')",
    "modules": "import json, decimal, os, sqlite3, sys\nsys.modules['os'].leftover = 1\nsys.leftover = 1",
    "patched-builtins": "import builtins, os\nbuiltins.print = lambda *a, **k: None\nbuiltins.leftover = 1\n"
                        "os.getcwd = lambda: '/'",
    "descriptors": "import os\nfor _ in range(5):\n    os.open('/dev/null', os.O_RDONLY)\nr, w = os.pipe()\n"
                   "os.set_inheritable(r, True)",
    "signal-handlers": "import signal\nfor sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGALRM):\n"
                       "    signal.signal(sig, signal.SIG_IGN)\nsignal.alarm(100)",
    "cwd-umask": "import os\nos.makedirs('/workspace/elsewhere', exist_ok=True)\nos.chdir('/workspace/elsewhere')\n"
                 "os.umask(0o077)",
    "processes": "import subprocess\nsubprocess.Popen(['sleep', '3700'], start_new_session=True)\n"
                 "import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(3700)",
    "sysv-ipc": "import ctypes\nlibc = ctypes.CDLL(None)\nkey = 0x6766\n"
                "assert libc.shmget(key, 4096, 0o1666) >= 0\nassert libc.msgget(key, 0o1666) >= 0\n"
                "assert libc.semget(key, 1, 0o1666) >= 0",
    "sockets": "import socket\nserver = socket.socket()\nserver.bind(('127.0.0.1', 47011))\nserver.listen()\n"
               "abstract = socket.socket(socket.AF_UNIX)\nabstract.bind('\\0gymfleet-left')\nabstract.listen()\n"
               "udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nudp.bind(('127.0.0.1', 47012))",
    "limits": "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))\n"
              "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))",
    "sys-path": "import sys\nsys.path.insert(0, '/tmp')\nsys.path.append('/workspace/lib')",
}


def probe(client: httpx.Client) -> dict:
    result = run(client, PROBE, timeout_s=10)
    assert result["status"] == "ok", result
    return json.loads(result["stdout"])


@pytest.fixture(scope="module")
def baseline(client_module) -> dict:
    return probe(client_module)


@pytest.fixture(scope="module")
def client_module(sandbox_url):
    with httpx.Client(base_url=sandbox_url, timeout=120) as http_client:
        yield http_client


def differences(state: dict, baseline: dict) -> dict:
    return {key: (state[key], baseline[key]) for key in baseline if state[key] != baseline[key]}


@pytest.mark.parametrize("name", LEAVES)
def test_a_run_leaves_nothing_for_the_next(client_module, baseline, name):
    left = run(client_module, LEAVES[name], timeout_s=10)
    assert left["status"] == "ok", left
    assert not differences(probe(client_module), baseline)
    assert_no_leftovers()


def test_nothing_crosses_between_runs_side_by_side(client_module, baseline):
    # Everything at once, still running while the probe runs beside it.
    holder = "\n".join(LEAVES.values()) + HOLD
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(run(client_module, holder, timeout_s=3)))
    thread.start()
    try:
        for _ in range(3):
            assert not differences(probe(client_module), baseline)
    finally:
        thread.join()
    assert answer["status"] == "timeout" and answer["stdout"] == "held\n", answer
    assert not differences(probe(client_module), baseline)
    assert_no_leftovers()


def test_a_runs_process_limit_is_its_own(client_module):
    # Forked runs share the fork server's user namespace, where RLIMIT_NPROC would count them together: a fork bomb
    # beside a run would leave it no process; each run's pids cgroup keeps the limit per run.
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    forks = ("import os, time\npids = []\nfor _ in range(40):\n    pid = os.fork()\n    if pid == 0:\n"
             "        time.sleep(0.5)\n        os._exit(0)\n    pids.append(pid)\n"
             "for pid in pids:\n    os.waitpid(pid, 0)\nprint('40 processes')")
    answer: dict = {}
    bombing = threading.Thread(target=lambda: answer.update(run(client_module, bomb, timeout_s=3)))
    bombing.start()
    try:
        time.sleep(1.0)
        for _ in range(2):
            result = run(client_module, forks, timeout_s=10)
            assert result["status"] == "ok" and result["stdout"] == "40 processes\n", result
    finally:
        bombing.join()
    assert answer["status"] in ("timeout", "killed", "failed"), answer
    assert_no_leftovers()


def test_a_forked_run_starts_as_a_cold_one(baseline):
    # But for RLIMIT_NPROC: a forked run's processes are limited by its pids cgroup instead (the test above).
    server = SandboxServer({"name": "sandbox", "fork_server": False, "warm_sandboxes": 0, "default_timeout_s": 5})
    with serve(server.create_app()) as url, httpx.Client(base_url=url, timeout=120) as client:
        assert server.runner.forkserver is None
        cold = probe(client)
    nproc = sorted(name for name in dir(resource) if name.startswith("RLIMIT_")).index("RLIMIT_NPROC")
    cold, forked = ({**state, "limits": [limit for index, limit in enumerate(state["limits"]) if index != nproc]}
                    for state in (cold, baseline))
    assert not differences(cold, forked)


INIT_FDS = ("import os\n"
            "print(sorted((fd, os.readlink(f'/proc/1/fd/{fd}')) for fd in os.listdir('/proc/1/fd')))")


def test_a_runs_init_holds_nothing_but_dev_null(client_module):
    # The fork server holds every live run's status pipe and pidfd (and its socket): each run's init is forked with
    # them and must drop them all, whatever runs are idle in the warm pool or running beside it.
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(run(client_module, INIT_FDS, timeout_s=10)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = str([(str(fd), "/dev/null") for fd in range(3)]) + "\n"
    assert [result["stdout"] for result in results] == [expected] * 4, results
