"""The escape and abuse suite: hostile programs are contained, reported with the right status, and leave the host
and the service unharmed (the service still answers; no process of theirs survives the run)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox.tests.conftest import SECRET, SECRET_ENV, assert_no_leftovers, ran_out, run, sandbox_processes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _host_unharmed(client):
    yield
    assert_no_leftovers()
    assert client.get("/").json() == {"status": "ok"}
    assert run(client, "print('still serving')")["stdout"] == "still serving\n"


NETWORK = {
    "tcp": "import socket, sys\n"
           "for host, port in [('1.1.1.1', 80), ('127.0.0.1', int(sys.argv[1])), ('10.0.0.1', 22)]:\n"
           "    try:\n"
           "        socket.create_connection((host, port), timeout=2); print('CONNECTED', host)\n"
           "    except OSError as exc:\n"
           "        print('blocked', host, type(exc).__name__)\n"
           "print('interfaces', [name for _, name in socket.if_nameindex()])",
    "dns": "import socket\n"
           "try:\n"
           "    print('RESOLVED', socket.getaddrinfo('example.com', 80))\n"
           "except OSError as exc:\n"
           "    print('blocked', type(exc).__name__)",
    "udp": "import socket\n"
           "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
           "try:\n"
           "    s.sendto(b'x' * 64, ('8.8.8.8', 53)); print('SENT')\n"
           "except OSError as exc:\n"
           "    print('blocked', type(exc).__name__)",
    "bash-tcp": "(echo > /dev/tcp/1.1.1.1/80) 2>/dev/null && echo CONNECTED || echo blocked",
}


@pytest.mark.parametrize("name", NETWORK)
def test_no_network(client, sandbox_url, name):
    language = "bash" if name.startswith("bash") else "python"
    result = run(client, NETWORK[name], language=language, args=[sandbox_url.rsplit(":", 1)[1]], timeout_s=10)
    assert result["status"] == "ok", result
    assert "blocked" in result["stdout"]
    assert not any(word in result["stdout"] for word in ("CONNECTED", "RESOLVED", "SENT")), result["stdout"]
    if name == "tcp":
        assert "interfaces ['lo']" in result["stdout"]


def test_host_files_are_invisible(client):
    targets = ["/work", "/root", "/home", "/etc/shadow", "/etc/hostname", "/etc/ssh", str(REPO),
               str(REPO / "sandbox" / "app.py"), "/proc/1/root/etc/shadow", "/sys/class/net"]
    code = ("import os, sys\n"
            "for path in sys.argv[1:]:\n"
            "    try:\n"
            "        print('LEAK', path, os.listdir(path) if os.path.isdir(path) else open(path).read()[:50])\n"
            "    except OSError as exc:\n"
            "        print('blocked', path, type(exc).__name__)\n"
            "print('etc', sorted(os.listdir('/etc')))")
    result = run(client, code, args=targets)
    assert result["status"] == "ok" and "LEAK" not in result["stdout"], result["stdout"]
    assert "etc ['alternatives', 'group', 'hosts', 'ld.so.cache', 'localtime', 'passwd']" in result["stdout"]


def test_the_servers_environment_is_unreadable(client):
    assert os.environ[SECRET_ENV] == SECRET  # the server process (this one) really has it
    code = ("import os, glob\n"
            "print(dict(os.environ))\n"
            "for path in ['/proc/self/environ', '/proc/1/environ', *glob.glob('/proc/[0-9]*/environ')]:\n"
            "    try:\n"
            "        print(path, open(path, 'rb').read())\n"
            "    except OSError as exc:\n"
            "        print(path, type(exc).__name__)")
    result = run(client, code)
    assert result["status"] == "ok" and "/proc/1/environ b''" in result["stdout"], result["stdout"]
    assert SECRET not in result["stdout"] and SECRET_ENV not in result["stdout"]
    assert run(client, "env; cat /proc/1/environ", language="bash")["stdout"].count(SECRET) == 0


def test_writes_outside_the_workspace_fail(client):
    marker = f"gymfleet-escape-{os.getpid()}"
    code = ("import sys\n"
            "for path in ['/usr/x', '/etc/x', '/x', '/dev/x', '/proc/x', '/usr/bin/python3']:\n"
            "    try:\n"
            "        open(path, 'a').write('pwned'); print('WROTE', path)\n"
            "    except OSError as exc:\n"
            "        print('blocked', path, type(exc).__name__)\n"
            f"open('/tmp/{marker}', 'w').write('inside')\n"
            "open('/workspace/ok', 'w').write('ok'); print('workspace ok')")
    result = run(client, code)
    assert result["status"] == "ok" and "WROTE" not in result["stdout"] and "workspace ok" in result["stdout"]
    assert not Path(f"/tmp/{marker}").exists()  # the sandbox's /tmp is its own


@pytest.mark.parametrize("path", ["/workspace/big", "/dev/shm/big"])
def test_filling_a_tmpfs_stops_at_its_size(client, path):
    code = (f"f = open('{path}', 'wb')\n"
            "try:\n    while True: f.write(b'x' * (1 << 20))\nexcept OSError as exc:\n    print(exc)")
    result = run(client, code, timeout_s=20)
    assert result["status"] in ("ok", "killed"), result  # ENOSPC, or the file-size limit's SIGXFSZ


@pytest.mark.parametrize(("code", "language"), [
    ("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", "python"),
    ("import threading, time\nwhile True:\n    try: threading.Thread(target=time.sleep, args=(60,)).start()\n"
     "    except RuntimeError: pass", "python"),
    (":(){ :|:& };:\nsleep 30", "bash"),
], ids=["fork-bomb", "thread-bomb", "bash-fork-bomb"])
def test_fork_bombs_are_capped_and_cleaned_up(client, code, language):
    peak = 0
    stop = threading.Event()

    def watch():
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sum(p.info["num_threads"] or 1 for p in sandbox_processes()))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run(client, code, language=language, timeout_s=2)
    finally:
        stop.set()
        watcher.join()
    assert result["status"] in ("timeout", "failed", "ok"), result
    assert peak <= 64 + 8, f"{peak} tasks at once: the process limit did not hold"


def test_memory_bomb_in_many_processes(client):
    code = ("import os\nfor _ in range(8):\n    if os.fork() == 0:\n        break\n"
            "hog = []\nwhile True: hog.append(bytearray(1 << 24))")
    result = run(client, code, timeout_s=5, memory_mb=128)
    assert result["status"] == "oom", result


# Eight processes of 200 MiB each: every one within the 512 MiB address-space limit, 1.6 GiB together. Each then
# sleeps past the deadline, so only the memory watch can end it as `oom` (without it: a timeout, 1.6 GiB held).
SPREAD_BOMB = ("import os, time\nfor _ in range(7):\n    if os.fork() == 0:\n        break\n"
               "hog = bytearray(200 << 20)\ntime.sleep(60)")


def test_memory_spread_over_processes_is_held_to_the_limit(client):
    single = run(client, SPREAD_BOMB, timeout_s=5, memory_mb=512)
    assert ran_out(single, 512), single
    body = {"code": "import sys\nif input() == 'bomb':\n    exec(sys.argv[1])\nprint('next case')",
            "cases": [{"stdin": "bomb", "args": [SPREAD_BOMB]}, {"stdin": "x", "args": [""]}],
            "timeout_s": 5, "memory_mb": 512}
    batch = client.post("/run_batch", json=body).json()["results"]  # the supervisor is spared: the batch goes on
    assert [r["status"] for r in batch] == ["oom", "ok"] and batch[1]["stdout"] == "next case\n", batch


# Memory that RLIMIT_AS and resident-set checks do not see: memfd files written but never mapped (16 of 64 MiB, the
# file-size limit each), shared anonymous mappings (8 children, 100 MiB each: one "shared" page per process), files
# in the run's tmpfs. Each bomb then sleeps past the deadline, so only the memory accounting (the run's memory
# cgroup, or the sampling watch: `sandbox.cgroups`) can end it as `oom`.
MEMFD_BOMB = ("import os, signal, time\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\nchunk = b'x' * (16 << 20)\n"
              "fds = [os.memfd_create('hog') for _ in range(16)]\n"
              "for fd in fds:\n    for _ in range(4): os.write(fd, chunk)\n"
              "time.sleep(60)")
SHARED_BOMB = ("import mmap, os, time\nfor _ in range(8):\n    if os.fork() == 0:\n"
               "        hog = mmap.mmap(-1, 100 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
               "        for i in range(0, len(hog), 4096): hog[i] = 1\n"
               "        break\n"
               "time.sleep(60)")
TMPFS_BOMB = ("import time\nchunk = b'x' * (8 << 20)\nfor name in 'abcd':\n    with open(f'/tmp/{name}', 'wb') as f:\n"
              "        for _ in range(5): f.write(chunk)\n"
              "time.sleep(60)")


@pytest.mark.parametrize(("code", "memory_mb"), [(MEMFD_BOMB, 128), (SHARED_BOMB, 160), (TMPFS_BOMB, 64)],
                         ids=["memfd", "shared-anonymous", "tmpfs-files"])
def test_memory_outside_the_address_space_is_counted(client, code, memory_mb):
    result = run(client, code, timeout_s=5, memory_mb=memory_mb)
    assert ran_out(result, memory_mb), result


# About 95 MiB under 128: a 30 MiB /tmp file and a 30 MiB memfd, each also mapped and touched, and 20 MiB of shared
# anonymous memory touched by a parent and its child. Counting a page once per way it is held would pass 128 MiB.
WELL_BEHAVED = ("import mmap, os, time\n"
                "def touch(m):\n    for i in range(0, len(m), 4096): m[i] = 1\n"
                "with open('/tmp/data', 'wb') as f:\n    f.truncate(30 << 20)\n"
                "data = mmap.mmap(os.open('/tmp/data', os.O_RDWR), 30 << 20)\n"
                "memfd = os.memfd_create('buffer')\nos.ftruncate(memfd, 30 << 20)\n"
                "buffer = mmap.mmap(memfd, 30 << 20)\n"
                "shared = mmap.mmap(-1, 20 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n"
                "for m in (data, buffer, shared): touch(m)\n"
                "child = os.fork()\n"
                "if child == 0:\n    touch(shared); time.sleep(1); os._exit(0)\n"
                "time.sleep(1)\nos.waitpid(child, 0)\nprint('done')")


def test_memory_within_the_limit_is_counted_once(client):
    result = run(client, WELL_BEHAVED, timeout_s=5, memory_mb=128)
    assert result["status"] == "ok" and result["stdout"] == "done\n", result


def test_huge_output_is_truncated(client):
    finite = run(client, "import sys\nfor _ in range(2000): sys.stdout.write('y' * 100_000)", max_output_bytes=4096)
    assert (finite["status"], finite["truncated"], len(finite["stdout"])) == ("ok", True, 4096)
    endless = run(client, "while True: print('z' * 1000)", timeout_s=1, max_output_bytes=4096)
    assert (endless["status"], endless["truncated"]) == ("timeout", True)


ATTACKS = {
    "kill-parent": "import os, signal; os.kill(os.getppid(), signal.SIGKILL)",
    "kill-all": "import os, signal; os.kill(-1, signal.SIGKILL)",
    "stop-parent": "import os, signal, time; os.kill(os.getppid(), signal.SIGSTOP); time.sleep(60)",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_attacking_the_supervisor_is_the_programs_loss(client, name):
    # In a batch the launcher is the program's parent: killing or freezing it fails the case, and nothing else.
    results = client.post("/run_batch", json={"code": ATTACKS[name], "timeout_s": 1, "cases": [{}, {}]}).json()
    result = results["results"][-1]
    assert result["status"] in ("killed", "timeout") and "supervisor" in (result["message"] or ""), result
    # A single run is the launcher itself, its parent the sandbox's init, which its own namespace cannot signal.
    single = run(client, ATTACKS[name], timeout_s=1)
    expected = {"kill-parent": "ok", "kill-all": "failed", "stop-parent": "timeout"}[name]  # kill(-1): ESRCH
    assert single["status"] == expected, single


def test_init_cannot_be_killed_from_inside(client):
    result = run(client, "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('init survives')")
    assert result["status"] == "ok" and result["stdout"] == "init survives\n"


def test_sleeping_past_the_deadline_with_children(client):
    code = ("import os, subprocess, time\n"
            "subprocess.Popen(['sleep', '600'])\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(600)\n"
            "    os._exit(0)\n"
            "time.sleep(600)")
    result = run(client, code, timeout_s=1)
    assert result["status"] == "timeout" and "limit" in result["message"], result


def test_other_processes_are_invisible_in_proc(client):
    code = ("import os\n"
            "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
            "print(len(pids))\n"
            "print(any(b'pytest' in open(f'/proc/{p}/cmdline', 'rb').read() for p in pids))")
    result = run(client, code)
    count, seen = result["stdout"].split()
    assert int(count) <= 4 and seen == "False", result


def test_no_privileges_inside(client):
    code = ("unshare -r true 2>/dev/null && echo UNSHARED || echo no-unshare\n"
            "mount -t tmpfs x /workspace 2>/dev/null && echo MOUNTED || echo no-mount\n"
            "id -u")
    result = run(client, code, language="bash")
    assert result["stdout"] == "no-unshare\nno-mount\n65534\n", result


def test_overwriting_the_program_or_harness_between_cases_changes_nothing(client):
    # The launcher is a code object in memory, never a file; each Python case runs the program as compiled before
    # the first case, so what one case writes over main.py does not change what the next one runs.
    code = ("import sys\n"
            "if sys.argv[1] == 'attack':\n"
            "    open('/workspace/main.py', 'w').write('print(\"PWNED\")')\n"
            "print('original', sys.argv[1])")
    results = client.post("/run_batch", json={"code": code, "cases": [{"args": ["attack"]}, {"args": ["2"]}]}).json()
    assert [r["stdout"] for r in results["results"]] == ["original attack\n", "original 2\n"], results


def test_forging_the_result_channel_gains_nothing(client):
    code = ("import os\n"
            "for fd in os.listdir(f'/proc/{os.getppid()}/fd'):\n"
            "    try:\n"
            "        os.write(os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY), b'garbage\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "while True: pass")
    result = run(client, code, timeout_s=1)
    assert result["status"] in ("killed", "timeout"), result


def test_a_flood_of_runs_is_served(sandbox_url):
    async def flood():
        async with httpx.AsyncClient(base_url=sandbox_url, timeout=120) as client:
            import asyncio

            answers = await asyncio.gather(*(client.post("/run", json={"code": "print(1)"}) for _ in range(64)))
        return [answer.json()["status"] for answer in answers]

    import asyncio

    assert asyncio.run(flood()) == ["ok"] * 64


# --- Results that cannot be forged (issue 10, item 3) ---------------------------------------------------------------
# The protocol descriptors are the supervisor's alone: a session's code runs in a worker process without them, every
# thread and process an exec starts ends when it returns, a one-shot Python run holds none of them, and the
# supervisor is non-dumpable (see `sandbox.launcher` and `sandbox.kernel`).

# A well-formed result frame with its own stdout, written to every descriptor above stderr (the protocol's, if the
# program holds it).
FORGE = ("def forge():\n"
         "    import os\n"
         "    frame = b'@@GF-RESULT 0 0 1 1 7 0 0\\nFORGED\\n'\n"
         "    for fd in range(3, 64):\n"
         "        try:\n"
         "            os.write(fd, frame)\n"
         "        except OSError:\n"
         "            pass\n")


@contextlib.contextmanager
def _session(client, **fields) -> Iterator[str]:
    """A session of the sandbox (its id), deleted on leaving the block."""
    created = client.post("/sessions", json=fields)
    assert created.status_code == 200, created.text
    session = created.json()["session_id"]
    try:
        yield session
    finally:
        client.delete(f"/sessions/{session}")


def _exec(client, session: str, code: str, **fields) -> dict:
    answer = client.post(f"/sessions/{session}/exec", json={"code": code, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_thread_left_behind_cannot_forge_the_next_result(client):
    # The thread waits for the next exec to start (a file it writes), then forges a frame while it runs.
    start_thread = (FORGE + "import os, threading, time\n"
                    "def later():\n"
                    "    while not os.path.exists('/workspace/go'):\n"
                    "        time.sleep(0.01)\n"
                    "    forge()\n"
                    "threading.Thread(target=later, daemon=True).start()\n"
                    "print('started')")
    with _session(client, timeout_s=5) as session:
        assert _exec(client, session, start_thread)["stdout"] == "started\n"
        second = _exec(client, session, "import time\nopen('/workspace/go', 'w').close()\ntime.sleep(0.5)\n"
                                        "print('second')")
        assert (second["status"], second["stdout"]) == ("ok", "second\n"), second
        third = _exec(client, session, "print('third')")
        assert (third["status"], third["stdout"]) == ("ok", "third\n"), third  # not off by one


def test_an_exec_cannot_forge_its_own_result(client):
    with _session(client, timeout_s=5) as session:
        forged = _exec(client, session, FORGE + "forge()\nprint('real')\nraise SystemExit(3)")
        assert (forged["status"], forged["return_code"], forged["stdout"]) == ("failed", 3, "real\n"), forged
        assert _exec(client, session, "print('next')")["stdout"] == "next\n"


def test_threads_of_an_exec_do_not_run_between_execs(client):
    # A thread that spins forever: when its exec returns it is gone, so its counter stands still from then on.
    spin = ("import threading\ncount = [0]\n"
            "def spin():\n    while True:\n        count[0] += 1\n"
            "threading.Thread(target=spin, daemon=True).start()\n"
            "while count[0] == 0:\n    pass")
    check = ("import os, threading, time\nbefore = count[0]\ntime.sleep(0.3)\n"
             "print(count[0] == before, threading.active_count(), len(os.listdir('/proc/self/task')))")
    with _session(client, timeout_s=5) as session:
        assert _exec(client, session, spin)["status"] == "ok"
        assert _exec(client, session, check)["stdout"] == "True 1 1\n"
        assert _exec(client, session, "count[0] > 0")["stdout"] == "True\n"  # the state itself is kept


def test_processes_of_an_exec_end_with_it(client):
    leave = ("import subprocess, os\n"
             "child = subprocess.Popen(['sleep', '600'])\n"
             "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(600)\n    os._exit(0)\n"
             "pid = child.pid")
    with _session(client, timeout_s=5) as session:
        assert _exec(client, session, leave)["status"] == "ok"
        alive = _exec(client, session, "import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
        assert len(eval(alive["stdout"])) == 3, alive  # the sandbox's init, the kernel, this worker


PROBE_SUPERVISOR = ("import ctypes, os, sys\n"
                    "target = int(sys.argv[1]) if len(sys.argv) > 1 else 2\n"
                    "libc = ctypes.CDLL(None, use_errno=True)\n"
                    "print('ptrace', libc.ptrace(16, target, 0, 0) == 0)\n"
                    "for path in (f'/proc/{target}/mem', f'/proc/{target}/fd'):\n"
                    "    try:\n"
                    "        os.listdir(path) if path.endswith('fd') else open(path, 'rb').close()\n"
                    "        print('opened', path)\n"
                    "    except OSError as exc:\n"
                    "        print('blocked', type(exc).__name__)\n")


def test_the_supervisor_cannot_be_traced_or_read(client):
    with _session(client, timeout_s=5) as session:
        probed = _exec(client, session, PROBE_SUPERVISOR)  # the kernel is the sandbox's pid 2
        assert probed["stdout"] == "ptrace False\nblocked PermissionError\nblocked PermissionError\n", probed
    code = "import os, sys\nsys.argv.append(str(os.getppid()))\n" + PROBE_SUPERVISOR  # a batch case: its launcher
    results = client.post("/run_batch", json={"code": code, "cases": [{}, {}]}).json()["results"]
    assert [r["stdout"] for r in results] == [probed["stdout"]] * 2, results


def test_a_crashing_run_cannot_forge_its_exit_status(client):
    result = run(client, FORGE + "forge()\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (result["status"], result["return_code"], result["stdout"]) == ("failed", -11, ""), result


@pytest.mark.parametrize(("code", "status", "return_code"), [
    ("import sys; sys.exit(-1)", "failed", 255), ("import sys; sys.exit(200)", "failed", 200),
    ("import os, signal; os.kill(os.getpid(), signal.SIGABRT)", "failed", -6),
], ids=["exit-255", "exit-200", "abort"])
def test_a_runs_status_comes_from_its_exit(client, code, status, return_code):
    # With no result frame, a single run's outcome is the sandbox's exit status: codes past every signal are exits.
    result = run(client, code)
    assert (result["status"], result["return_code"]) == (status, return_code), result
