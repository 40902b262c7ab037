"""Grading in a fresh sandbox: the base snapshot, the model's patch, the test patch, then the tests, reported on a
channel the code under test cannot forge.

The sandbox's workspace holds `repo/` (the snapshot) and `grading/` (`model.patch`, `test.patch`, `tests.json`,
`run_tests.py`); nothing of the agent's session is there but its patch. `GRADE_SCRIPT` applies both patches with
`git apply` (exit 81: the model's patch does not apply; 82: the test patch does not), runs the row's setup commands,
then `run_tests.py` under `python3 -I` (no user site, no `PYTHON*` variables, no `sitecustomize` from the
repository). The runner reads a random nonce from stdin before importing anything of the repository, points fds 1
and 2 at /dev/null while the tests run, and writes one line `<nonce><json report>` on a saved copy of stdout, so
nothing the tests print can pass for the report. It also notes when the tests replaced unittest's machinery
(`TestCase.run`, the result's `add*` methods, ...): such a report is refused. And the grader's canary tests
(`gymfleet.grading.canary`: a must-fail and a must-pass test in a random module written only for grading, run
among the task's tests) catch a forgery through any other internal: a report where they come out wrong is
`tests_tampered`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from gymfleet.grading.canary import Canaries, interleave, tampered

RUNNER = r'''
import io, json, os, sys, unittest, unittest.case, unittest.result, unittest.suite, unittest.loader, traceback

nonce = sys.stdin.readline().strip()
sys.stdin.close()
ids = json.load(open(sys.argv[1]))
repo = os.path.abspath(sys.argv[2])
sys.path.append(os.path.dirname(os.path.abspath(sys.argv[1])))  # the grader's canaries live beside tests.json
WATCHED = [(unittest.case.TestCase, n) for n in ("run", "__call__", "debug", "_callTestMethod", "_callSetUp",
                                                 "_callTearDown", "_callCleanup", "doCleanups", "skipTest")]
WATCHED += [(unittest.result.TestResult, n) for n in ("addSuccess", "addFailure", "addError", "addSkip",
                                                      "addExpectedFailure", "addUnexpectedSuccess", "addSubTest",
                                                      "startTest", "stopTest", "wasSuccessful")]
WATCHED += [(unittest.suite.TestSuite, n) for n in ("run", "__call__", "__iter__")]
WATCHED += [(unittest.loader.TestLoader, "loadTestsFromName")]
WATCHED += [(unittest.case.TestCase, n) for n in dir(unittest.case.TestCase) if n.startswith("assert")]
original = {(c.__name__, n): c.__dict__.get(n) for c, n in WATCHED}
saved = os.dup(1)
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
# The repository comes after the standard library, so a module of it cannot shadow one the runner uses.
sys.path.insert(len([p for p in sys.path if "site-packages" not in p and "dist-packages" not in p]), repo)
os.chdir(repo)


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.ok, self.bad = set(), set()

    def addSuccess(self, test):
        self.ok.add(test.id())

    def addExpectedFailure(self, test, err):
        self.ok.add(test.id())

    def addFailure(self, test, err):
        self.bad.add(test.id())

    def addError(self, test, err):
        self.bad.add(getattr(test, "id", lambda: str(test))())

    def addSkip(self, test, reason):
        self.bad.add(test.id())

    def addUnexpectedSuccess(self, test):
        self.bad.add(test.id())

    def addSubTest(self, test, subtest, err):
        if err is not None:
            self.bad.add(test.id())


result = Result()
loader = unittest.TestLoader()
for test_id in ids:
    try:
        suite = loader.loadTestsFromName(test_id)
        suite.run(result)
    except BaseException:
        result.bad.add(test_id)
tampered = sorted(f"{c}.{n}" for (c, n), value in original.items()
                  if {k.__name__: k for k, _ in WATCHED}[c].__dict__.get(n) is not value)
passed = sorted(t for t in ids if t in result.ok and t not in result.bad)
report = {"passed": passed, "tampered": tampered}
os.write(saved, ("\n" + nonce + json.dumps(report) + "\n").encode())
os._exit(0)
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
    if canaries is not None:
        test_ids = interleave(test_ids, canaries)
        files[f"grading/{canaries.module}.py"] = canaries.source
    return {**files, "grading/tests.json": json.dumps(test_ids)}


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
    if canaries is not None and (forged := tampered(canaries, passed)):
        return Grade(0.0, "tests_tampered", status, forged)
    if status["FAIL_TO_PASS"]["failure"]:
        return Grade(0.0, "fail_to_pass_failed", status)
    if status["PASS_TO_PASS"]["failure"]:
        return Grade(0.0, "pass_to_pass_failed", status)
    return Grade(1.0, None, status)
