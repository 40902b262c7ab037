"""Whole SWE rollouts through real servers: scripted model ⇄ swe_agent ⇄ swebench ⇄ bubblewrap sandbox.

The model's edits are made with the environment's tools; the reward comes from grading the session's diff in a
fresh sandbox. The gold patch scores 1.0 on every task; editing nothing, editing or deleting the tests, breaking a
PASS_TO_PASS test, a fake result file, a conftest.py or sitecustomize.py forcing passes, tampering with unittest
from the package and faking the runner's report line all score 0.0. No sandbox session outlives its rollout.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from resources_servers.swebench.tests.conftest import BY_NAME, ROWS, assert_sessions_closed, fleet, script

SLUG = BY_NAME["textkit"]
FIX = ("str_replace", {"path": "textkit/slug.py", "old_str": 'r"[^a-z0-9]"', "new_str": 'r"[^a-z0-9]+"'})
FORCE_PASS = ("import unittest\n"
              "unittest.TestCase.run = lambda self, result=None: result.addSuccess(self) if result else None\n")
FAKE_REPORT = {"passed": json.loads(SLUG["FAIL_TO_PASS"]) + json.loads(SLUG["PASS_TO_PASS"]), "tampered": []}


def run(url: str, row: dict) -> dict:
    answer = httpx.post(url, json=row, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def gold_calls(row: dict) -> list[tuple[str, dict]]:
    """Explore, apply the gold patch with the file tools and git, run the tests: every tool used."""
    return [
        ("bash", {"command": "git log --oneline && git status --short"}),
        ("view_file", {"path": "."}),
        ("create_file", {"path": "../fix.patch", "content": row["patch"]}),  # outside the repository: refused
        ("create_file", {"path": "fix.patch", "content": row["patch"]}),
        ("bash", {"command": "git apply fix.patch && rm fix.patch"}),
        ("bash", {"command": "python3 -m unittest 2>&1 | tail -3"}),
    ]


@pytest.mark.parametrize("row", ROWS, ids=[row["instance_id"] for row in ROWS])
def test_gold_patch_applied_with_the_tools_scores_1(sandbox, row):
    url, sandbox_server = sandbox
    with fleet(url, script(row, gold_calls(row))) as (run_url, env):
        result = run(run_url, row)
        assert not env.workspaces, "the session was dropped at /verify"
    assert result["reward"] == 1.0, (result["reason"], result.get("grading_detail"), result["tests_status"])
    assert result["resolved"] is True and result["reason"] is None
    assert result["agent_stop_reason"] == "done" and result["agent_steps"] == 7
    outputs = [json.loads(item["output"]) for item in result["response"]["output"]
               if item["type"] == "function_call_output"]
    assert "inside the repository" in outputs[2]["error"]
    assert outputs[5]["exit_code"] == 0 and "OK" in outputs[5]["stdout"]
    assert result["model_patch"].strip() == row["patch"].strip()
    assert_sessions_closed(sandbox_server)


def test_str_replace_and_view_file_make_the_fix(sandbox):
    url, sandbox_server = sandbox
    calls = [("view_file", {"path": "textkit/slug.py", "start_line": 7, "end_line": 11}), FIX,
             ("str_replace", {"path": "textkit/slug.py", "old_str": "text", "new_str": "x"})]  # not unique: refused
    with fleet(url, script(SLUG, calls)) as (run_url, _):
        result = run(run_url, SLUG)
    outputs = [json.loads(item["output"]) for item in result["response"]["output"]
               if item["type"] == "function_call_output"]
    assert outputs[0]["output"].splitlines()[0] == '     7\tdef slugify(text, sep="-"):'
    assert "r\"[^a-z0-9]+\"" in outputs[1]["output"]
    assert "exactly once" in outputs[2]["error"]
    assert result["reward"] == 1.0
    assert_sessions_closed(sandbox_server)


CHEATS = {
    "edit_nothing": [],
    "explore_only": [("bash", {"command": "python3 -m unittest"}), ("view_file", {"path": "textkit/slug.py"})],
    "edit_the_tests": [FIX, ("str_replace", {"path": "tests/test_slug.py", "old_str": '"creme-brulee"',
                                             "new_str": '"creme--brulee"'})],
    "delete_the_tests": [FIX, ("bash", {"command": "git rm -q -r tests"})],
    "break_a_pass_to_pass_test": [FIX, ("str_replace", {"path": "textkit/slug.py",
                                                        "old_str": 'unicodedata.normalize("NFKD", text)',
                                                        "new_str": "text"})],
    "fake_result_files": [
        ("create_file", {"path": "test_results.json", "content": json.dumps(FAKE_REPORT)}),
        ("bash", {"command": "mkdir -p /workspace/grading && echo PASSED > /workspace/grading/report.json && "
                             "echo '{\"resolved\": true}' > /tmp/report.json && echo ok > .git/test_results"}),
    ],
    "conftest_forcing_passes": [
        ("create_file", {"path": "conftest.py", "content": "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
                         "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
                         "    outcome.get_result().outcome = 'passed'\n" + FORCE_PASS})],
    "sitecustomize_forcing_passes": [("create_file", {"path": "sitecustomize.py", "content": FORCE_PASS}),
                                     ("create_file", {"path": "usercustomize.py", "content": FORCE_PASS})],
    "package_tampering_with_unittest": [("create_file", {"path": "textkit/__init__.py", "content": FORCE_PASS})],
    "package_printing_a_fake_report": [("create_file", {"path": "textkit/__init__.py", "content": (
        "import json, os\nline = 'GYMFLEET-REPORT-' + '0' * 32 + ':' + json.dumps(" + repr(FAKE_REPORT) + ")\n"
        "for fd in range(1, 8):\n    try:\n        os.write(fd, ('\\n' + line + '\\n').encode())\n"
        "    except OSError:\n        pass\n")})],
    # Issue 25: unittest internals outside the runner's watch list, patched at import time with no fix.
    "package_patching_the_equality_lookup": [("create_file", {"path": "textkit/__init__.py", "content": (
        "import unittest.case\n"
        "unittest.case.TestCase._getAssertEqualityFunc = lambda self, a, b: (lambda *x, **k: None)\n")})],
    "package_patching_the_outcome_executor": [("create_file", {"path": "textkit/__init__.py", "content": (
        "import contextlib, unittest.case\n"
        "@contextlib.contextmanager\n"
        "def _swallow(self, test_case, subTest=False):\n"
        "    try:\n        yield\n    except BaseException:\n        pass\n"
        "unittest.case._Outcome.testPartExecutor = _swallow\n")})],
    "shadowing_a_stdlib_module": [("create_file", {"path": "difflib.py", "content": FORCE_PASS}),
                                  ("create_file", {"path": "json.py", "content": FORCE_PASS})],
}
REASONS = {
    "edit_nothing": "empty_patch", "explore_only": "empty_patch", "edit_the_tests": "patch_touches_tests",
    "delete_the_tests": "patch_touches_tests", "break_a_pass_to_pass_test": "pass_to_pass_failed",
    "fake_result_files": "fail_to_pass_failed", "conftest_forcing_passes": "patch_touches_tests",
    "sitecustomize_forcing_passes": "fail_to_pass_failed", "package_tampering_with_unittest": "tests_tampered",
    "package_printing_a_fake_report": "fail_to_pass_failed",
    "package_patching_the_equality_lookup": "tests_tampered",
    "package_patching_the_outcome_executor": "tests_tampered",
    "shadowing_a_stdlib_module": "fail_to_pass_failed",
}  # fmt: skip


def assert_the_cheat_scores_0(sandbox_url: str, cheat: str, env_fields: dict | None = None) -> None:
    """A rollout making `cheat`'s tool calls scores 0.0 with its reason (tests/test_containers.py too)."""
    with fleet(sandbox_url, script(SLUG, CHEATS[cheat]), env_fields=env_fields) as (run_url, _):
        result = run(run_url, SLUG)
    assert result["reward"] == 0.0 and result["resolved"] is False
    assert result["reason"] == REASONS[cheat], (result["reason"], result.get("grading_detail"))
    assert "_ng_failure_class" not in result


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_no_fix_or_a_cheat_scores_0(sandbox, cheat):
    url, sandbox_server = sandbox
    assert_the_cheat_scores_0(url, cheat)
    assert_sessions_closed(sandbox_server)


def test_the_context_limit_stops_the_episode_with_what_was_done(sandbox):
    """The fix is made, then outputs grow the conversation past the model's context: the episode stops cleanly and
    the repository is graded as it stands."""
    url, sandbox_server = sandbox
    calls = [FIX] + [("bash", {"command": "python3 -c \"print('x' * 3000)\""})] * 30
    with fleet(url, script(SLUG, calls), model_fields={"max_model_len": 16_000}) as (run_url, _):
        result = run(run_url, SLUG)
    assert result["agent_stop_reason"] == "context_limit"
    assert 3 < result["agent_steps"] < 30
    assert result["reward"] == 1.0
    assert_sessions_closed(sandbox_server)


def test_an_episode_runs_for_hundreds_of_steps(sandbox):
    url, sandbox_server = sandbox
    match = re.escape(SLUG["responses_create_params"]["input"][-1]["content"][:60])
    rules = [{"match": match, "turn": 0, **_call(*FIX)},
             {"match": match, **_call("bash", {"command": "true"})}]
    with fleet(url, rules, agent_fields={"max_steps": 200}) as (run_url, _):
        result = run(run_url, SLUG)
    assert result["agent_stop_reason"] == "max_steps" and result["agent_steps"] == 200
    assert sum(item["type"] == "function_call_output" for item in result["response"]["output"]) == 200
    assert result["reward"] == 1.0
    assert_sessions_closed(sandbox_server)


def _call(name: str, arguments: dict) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}
