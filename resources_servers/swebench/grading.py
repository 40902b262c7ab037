"""Grading in a fresh sandbox: the base snapshot, the model's patch, the test patch, then the tests, reported on a
channel the code under test cannot forge.

The sandbox's workspace holds `repo/` (the snapshot) and `grading/` (`model.patch`, `test.patch`, `tests.json`,
`run_tests.py`); nothing of the agent's session is there but its patch. `GRADE_SCRIPT` applies both patches with
`git apply` (exit 81: the model's patch does not apply; 82: the test patch does not), runs the row's setup commands,
then `run_tests.py` under `python3 -I` (no user site, no `PYTHON*` variables, no `sitecustomize` from the
repository). The runner is two processes:
- a supervisor that reads a random nonce from stdin, makes itself non-dumpable (no /proc or ptrace access to its
  memory or descriptors by the code under test), never imports the repository, and writes the one report line
  `<nonce><json report>` on stdout;
- a child with no stdin, stdout or stderr, which loads every test (so the repository is imported before the first
  test runs), runs them and sends each outcome on a pipe. The nonce is not in its memory, so nothing it prints or
  writes can pass for the report; a child that exits early leaves its tests unpassed.
The child also notes when any function, class or descriptor of unittest's modules or classes was replaced, added or
removed, checked after loading and after every test: such a report is `tests_tampered`. And the grader's canary
tests (`gymfleet.grading.canary`: a must-fail and a must-pass test in a random module written only for grading, run
at random places among the task's tests and again at the end) catch a forgery through any other internal: a run
where the must-fail one ever passes, or the must-pass one ever fails, is `tests_tampered`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from gymfleet.grading.canary import Canaries, interleave, tampered

RUNNER = r'''
import json, os, subprocess, sys


def supervise(tests_json, repo):
    # Holds the nonce; never imports the repository. Made non-dumpable so a process of the same user cannot read
    # its memory or its file descriptors through /proc or ptrace.
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    try:
        import ctypes
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass
    spec = json.load(open(tests_json))
    known = set(spec["ids"]) | set(spec.get("again", []))
    read_end, write_end = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), "--child", tests_json, repo, str(write_end)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_end,),
    )
    os.close(write_end)
    ok, bad, tampered, size = set(), set(), set(), 0
    with os.fdopen(read_end, "rb") as records:
        for line in records:
            size += len(line)
            if size > 64 << 20:
                break
            try:
                kind, value = json.loads(line)
            except ValueError:
                continue
            if kind == "tampered" and isinstance(value, list):
                tampered.update(str(v) for v in value[:100])
            elif kind in ("ok", "bad") and value in known:
                (ok if kind == "ok" else bad).add(value)
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    else:
        if child.returncode < 0:  # killed (the memory limit's SIGKILL): the run ends as its tests did, unreported
            import signal
            if -child.returncode != signal.SIGKILL:
                signal.signal(-child.returncode, signal.SIG_DFL)
            os.kill(os.getpid(), -child.returncode)
            os._exit(128 - child.returncode)  # as PID 1 of a container no signal ends us: a shell's exit status
    report = {"passed": sorted(ok - bad), "ever_passed": sorted(ok), "tampered": sorted(tampered),
              "tests_exit": child.returncode}
    os.write(1, ("\n" + nonce + json.dumps(report) + "\n").encode())


def watched():
    # Every function, class and descriptor of unittest's modules and of their classes, by identity.
    seen = {}
    for name, module in list(sys.modules.items()):
        if name != "unittest" and not name.startswith("unittest."):
            continue
        for key, value in list(vars(module).items()):
            seen[(name, key)] = value
            if isinstance(value, type) and (value.__module__ or "").startswith("unittest"):
                for attr, member in list(vars(value).items()):
                    seen[(name, key + "." + attr)] = member
    return seen


def changed(before, after):
    def code(value):
        return callable(value) or hasattr(type(value), "__get__") or isinstance(value, type)

    moved = {k for k, v in before.items() if after.get(k, before) is not v and (code(v) or code(after.get(k)))}
    modules = {k[0] for k in before}
    moved |= {k for k, v in after.items() if k not in before and k[0] in modules and code(v)
              and not (type(v).__name__ == "module" or (isinstance(v, type) and "." not in k[1]
                                                       and (v.__module__ or "").startswith("unittest")))}
    return sorted(f"{m}.{k}" for m, k in moved)


def run_child(tests_json, repo, fd):
    import unittest, unittest.case, unittest.result, unittest.suite, unittest.loader, unittest.runner  # noqa: E401
    out = os.fdopen(int(fd), "w", buffering=1)
    spec = json.load(open(tests_json))
    sys.path.append(os.path.dirname(os.path.abspath(tests_json)))  # the grader's canaries live beside tests.json
    before = watched()
    # The repository comes after the standard library, so a module of it cannot shadow one the runner uses.
    sys.path.insert(len([p for p in sys.path if "site-packages" not in p and "dist-packages" not in p]), repo)
    os.chdir(repo)

    def record(kind, value):
        out.write(json.dumps([kind, value]) + "\n")

    class Result(unittest.TestResult):
        def addSuccess(self, test):
            record("ok", test.id())

        def addExpectedFailure(self, test, err):
            record("ok", test.id())

        def addFailure(self, test, err):
            record("bad", test.id())

        def addError(self, test, err):
            record("bad", getattr(test, "id", lambda: str(test))())

        def addSkip(self, test, reason):
            record("bad", test.id())

        def addUnexpectedSuccess(self, test):
            record("bad", test.id())

        def addSubTest(self, test, subtest, err):
            if err is not None:
                record("bad", test.id())

    # Every test is loaded (the repository imported) before the first one runs, so whatever the code under test
    # changes at import time is in force for the grader's canaries wherever they fall; they run again at the end.
    loader, suites = unittest.TestLoader(), []
    for test_id in list(spec["ids"]) + list(spec.get("again", [])):
        try:
            suites.append((test_id, loader.loadTestsFromName(test_id)))
        except BaseException:
            record("bad", test_id)
    tampered = set(changed(before, watched()))
    for test_id, suite in suites:
        try:
            suite.run(Result())
        except BaseException:
            record("bad", test_id)
        tampered.update(changed(before, watched()))
    record("tampered", sorted(tampered))
    out.flush()
    os._exit(0)


if len(sys.argv) > 1 and sys.argv[1] == "--child":
    run_child(*sys.argv[2:5])
else:
    supervise(*sys.argv[1:3])
'''

GRADE_SCRIPT = r"""cd /workspace/repo || exit 90
git apply --whitespace=nowarn ../grading/model.patch </dev/null || exit 81
git apply --whitespace=nowarn ../grading/test.patch </dev/null || exit 82
{setup}
exec python3 -I ../grading/run_tests.py ../grading/tests.json /workspace/repo
"""
APPLY_FAILED, TEST_PATCH_FAILED = 81, 82


@dataclass
class Grade:
    """What a grading run found: `reason` is None when every FAIL_TO_PASS and PASS_TO_PASS test passed."""

    reward: float
    reason: str | None
    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    detail: str | None = None


def grading_files(
    patch: str, test_patch: str, test_ids: list[str], canaries: Canaries | None = None
) -> dict[str, str]:
    """The files of `grading/` in the grading sandbox (with `canaries`, their module, and their ids among the
    tests at random places: `gymfleet.grading.canary`)."""
    files = {"grading/model.patch": patch, "grading/test.patch": test_patch, "grading/run_tests.py": RUNNER}
    again: list[str] = []
    if canaries is not None:
        test_ids, again = interleave(test_ids, canaries), list(canaries.ids)
        files[f"grading/{canaries.module}.py"] = canaries.source
    return {**files, "grading/tests.json": json.dumps({"ids": test_ids, "again": again})}


def grade_script(setup_commands: list[str]) -> str:
    """The bash script of a grading run (setup commands read no stdin: it carries the nonce)."""
    setup = "\n".join(f"( {command} ) </dev/null >/dev/null 2>&1 || exit 83" for command in setup_commands)
    return GRADE_SCRIPT.format(setup=setup)


def new_nonce() -> str:
    return "GYMFLEET-REPORT-" + secrets.token_hex(16) + ":"


def read_report(stdout: str, nonce: str) -> dict | None:
    """The runner's report line (the last one carrying the nonce), or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(nonce):
            try:
                report = json.loads(line[len(nonce):])
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def score(report: dict, fail_to_pass: list[str], pass_to_pass: list[str], canaries: Canaries | None = None) -> Grade:
    """1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed, unittest was not tampered with and the canaries came
    out as they must (the must-fail one failed, the must-pass one passed)."""
    passed = set(report.get("passed") or [])
    status = {
        name: {"success": [t for t in tests if t in passed], "failure": [t for t in tests if t not in passed]}
        for name, tests in (("FAIL_TO_PASS", fail_to_pass), ("PASS_TO_PASS", pass_to_pass))
    }
    if report.get("tampered"):
        return Grade(0.0, "tests_tampered", status, f"unittest internals replaced: {report['tampered'][:10]}")
    if canaries is not None and canaries.must_fail in set(report.get("ever_passed") or []):
        return Grade(0.0, "tests_tampered", status, "the grader's must-fail canary test passed in one of its runs")
    if canaries is not None and (forged := tampered(canaries, passed)):
        return Grade(0.0, "tests_tampered", status, f"{forged} (the tests' process exited {report.get('tests_exit')})")
    if status["FAIL_TO_PASS"]["failure"]:
        return Grade(0.0, "fail_to_pass_failed", status)
    if status["PASS_TO_PASS"]["failure"]:
        return Grade(0.0, "pass_to_pass_failed", status)
    return Grade(1.0, None, status)
