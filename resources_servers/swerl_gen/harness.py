"""swerl_gen's test runner, run inside the sandbox (standard library only; see app.py).

`python3 .gymfleet/harness.py TESTS_JSON INDEX`: TESTS_JSON lists every test id of the grading run (the task's
and the grader's canaries), INDEX the one this process runs. Each id is unittest's dotted name
(`pkg.tests.test_io.ReadTests.test_empty`) or pytest's node id (`pkg/tests/test_io.py::ReadTests::test_empty`,
`tests/test_io.py::test_plain_function`; a plain function passes when it returns without raising). Every id is
resolved first (so every test module is imported, the same way in every process), then the one test runs.

The result is this process's exit status (0 passed, 1 failed, 2 error, 3 skipped), which the sandbox's launcher
reports on a channel the process does not hold; no secret lives in this process, so there is nothing to read and
replay. A process can still choose its own exit status, which is what the grader's canaries are for: a must-fail
canary that exits 0 means the code under test forges results.
"""

import importlib
import io
import json
import os
import sys
import unittest

PASSED, FAILED, ERROR, SKIPPED = 0, 1, 2, 3


def _resolve(test_id):
    if "::" not in test_id:
        return unittest.defaultTestLoader.loadTestsFromName(test_id)
    path, *names = test_id.split("::")
    if not path.endswith(".py") or any("[" in name for name in names):
        raise ValueError("unsupported test id (parametrized or not a .py file)")
    target = importlib.import_module(path[:-3].replace("/", "."))
    owner = None
    for name in names:
        owner, target = target, getattr(target, name)
    if isinstance(target, type) and issubclass(target, unittest.TestCase):
        return unittest.defaultTestLoader.loadTestsFromTestCase(target)
    if isinstance(owner, type) and issubclass(owner, unittest.TestCase):
        return owner(names[-1])
    return target


def _run(target):
    if isinstance(target, unittest.TestCase | unittest.TestSuite):
        result = unittest.TestResult()
        try:
            target.run(result)
        except BaseException:
            return ERROR
        if result.errors:
            return ERROR
        if result.failures or result.unexpectedSuccesses:
            return FAILED
        if result.skipped and result.testsRun == len(result.skipped) or not result.testsRun:
            return SKIPPED
        return PASSED
    if not callable(target):
        return ERROR
    try:
        target()
    except AssertionError:
        return FAILED
    except BaseException:
        return ERROR
    return PASSED


def main():
    test_ids = json.load(open(sys.argv[1]))
    mine = test_ids[int(sys.argv[2])]
    sys.path.insert(0, os.getcwd())
    sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
    targets = {}
    for test_id in test_ids:
        try:
            targets[test_id] = _resolve(test_id)
        except BaseException as exc:  # an import that raises, exits or is missing: that test errors
            targets[test_id] = exc
    target = targets[mine]
    status = ERROR if isinstance(target, BaseException) else _run(target)
    os._exit(status)


if __name__ == "__main__":
    main()
