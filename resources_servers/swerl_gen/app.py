"""swerl_gen: single-shot software engineering (Agentless style), graded by running the repository's tests.

## Task fields
NeMo-Gym's swerl_gen rows are accepted as they are:
- `mode`: `eval` (the answer is SEARCH/REPLACE edits fixing the issue) or `repro-gen` (the answer is a script
  reproducing the issue).
- `instance`: SWE-bench columns. Read here: `instance_id`; `patch` (the gold fix, a git patch; repro-gen applies
  it); `test_patch` (the grading tests, applied after the model's patch in eval); `FAIL_TO_PASS` and
  `PASS_TO_PASS` (lists of test ids, or JSON strings of lists; eval needs at least one `FAIL_TO_PASS`). Test ids are
  unittest's dotted names or pytest node ids without parameters (`tests/test_io.py::ReadTests::test_empty`).
  NeMo-Gym's `setup_script` / `test_script` / `regression_script` are echoed, not run (below).
- `metadata.relevant_file_contents`: `{path: text}` or its JSON string, the files the prompt shows (eval).
  `metadata.remove_repo_name`: those paths start with the repository's folder, left out of the patch.
- The repository at its base commit, needed to run anything: `metadata.repo_archive` (a base64 tar archive, any
  compression, unpacked at the workspace root) and/or `metadata.repo_files` (`{path: text}`, written over it).
  NeMo-Gym's rows name a Singularity image instead (`metadata.image`); see Failures.
- `dataset_name`, `dataset_split` and any other field are echoed untouched.

## Reward
The text read is every assistant message's text, joined by newlines; reasoning (`<think>...</think>`, or all
text up to a lone `</think>`, `gymfleet.grading.think.strip_think`) is dropped. An empty answer scores 0.0 (`empty`).

eval: 1.0 when every FAIL_TO_PASS and every PASS_TO_PASS test passes (`RESOLVED_FULL`); `partial_reward` (0.2)
when some but not all FAIL_TO_PASS tests pass and every PASS_TO_PASS test passes (`RESOLVED_PARTIAL`); else 0.0.
1. The edits are the content of the last complete `<solution>...</solution>` pair (`no_solution`; with
   `relaxed_formatting`, the whole text when there is no pair), over `max_solution_chars` (`solution_too_long`).
2. Each block is a `### path` line, `<<<<<<< SEARCH`, lines, `=======`, lines, `>>>>>>> REPLACE`, each marker
   alone on its line; fence lines between blocks are ignored; a block with no path line of its own edits the
   previous block's file; an identical repeated block counts once. No block: `no_edits`; a marker out of place or
   a block left open: `malformed_edit`.
3. Edits apply in order, each to its file as the earlier edits left it: the SEARCH text must start a line of the
   file and is replaced at its first occurrence (`search_not_found` otherwise). Only the files the row shows can be
   edited (`file_not_provided`; new files cannot be made), never a test file (`edits_tests`: a file the test patch
   touches, a `conftest.py`, anything under `test/`, `tests/`, `testing/`, `test_*.py`, `*_test.py`); an empty
   SEARCH (`empty_search`) or one equal to its REPLACE (`no_op_edit`) is refused; edits that change nothing in the
   end are `empty_patch`. Any of these refuses the whole answer, which scores 0.0 without running anything.
4. The patch (`model_patch`, a git diff with 3 lines of context) is applied with `git apply` in a fresh sandbox
   holding the repository (`patch_does_not_apply`: 0.0), then the task's `test_patch`; only then does any code
   run. `harness.py` runs each FAIL_TO_PASS and PASS_TO_PASS test (unittest, or a plain function that must
   return) and, after the last one, reports each result on a line starting with a one-time token that reaches the
   harness on stdin before any test is imported and is in no file, so a line a program prints ("PASSED test_x",
   even after the report) is not a result. A test that does not report (the run crashed, timed out, exited
   early) failed. Limit: code written to search the harness's own memory for the token could forge results.
repro-gen: 1.0 when the script exits 2 on the repository as it is and 0 once the gold `patch` is applied, else 0.0
(`not_reproduced`). The script is the last ```` ```python ```` block of the last `<solution>` pair, or of the
whole text without one (`no_test`, `solution_too_long`). It runs as `reproduce_bug.py` at the repository's root,
each time in a fresh sandbox whose tree one step prepares (`repro.py`): the gold patch applied or not, every file
it touches rewritten with random comment noise, the grader's files removed, all before the script starts. Once
it has exited 2 on the unfixed tree and 0 on the fixed one, two canary runs must agree (an unfixed tree made by
applying and reverting the gold patch: 2; a fresh fixed tree: 0), else `tests_tampered` (0): a script keyed on
how its tree was made, or on luck, is caught. A script that compares the source with another copy of it (git
history) can still read the fix itself.

Response fields: `reason` (null at 1.0: the codes above, `tests_failed`, `tests_tampered`), `detail` (what exactly was
wrong), `resolution`, `fail_to_pass` / `pass_to_pass` (shares that passed), `test_results` (`{id: PASSED|FAILED|ERROR|
SKIPPED}`), `model_patch`, `repro_test`, `return_codes_before_patch` / `return_codes_after_patch` (repro-gen; null for
a run that timed out or was killed), `verification_result` (NeMo-Gym's `{status, resolution,
return_codes_before_patch, return_codes_after_patch}`), `verification_time` (seconds in the sandbox).

Failures, kept out of rewards (`_ng_failure_class: sandbox_failed`): the sandbox is unreachable or fails; the
task's own `test_patch` or gold `patch` does not apply to its repository (bad data); the row carries no
repository. NeMo-Gym's rows are of that last kind: they run in per-instance Singularity images
(`metadata.image`, e.g. `/swebench-images/...sif`) that the gymfleet sandbox does not run, and the failure names
the image and how to give the row its repository instead. Answers that need nothing run (no solution, bad edits)
are graded all the same.

## Departures from NeMo-Gym
- Execution is in the gymfleet sandbox (bubblewrap, no network) with the repository the row carries, not in
  Singularity images with the row's shell scripts; the tests are run by `harness.py`, not parsed from pytest logs.
- The last `<solution>` pair is read (NeMo-Gym: the first, so an answer echoing the prompt's format line scores 0
  there); the reasoning is dropped by `strip_think` (NeMo-Gym splits at `</think>` only when `<think>` is in the
  answer too); repro-gen reads the answer, not the reasoning.
- Malformed blocks refuse the answer (NeMo-Gym skips blocks its pattern does not match); edits apply in order to
  the file as edited so far (NeMo-Gym finds each SEARCH in the original and applies from the end); test files
  cannot be edited; the test patch is applied after the model's patch, so it wins where they meet.
- The patch is built from "\\n"-separated lines (NeMo-Gym's `splitlines` also splits at form feeds and U+2028,
  giving patches git cannot apply) and keeps "No newline at end of file".

## Config
- `sandbox`: the sandbox instance (`{type: sandbox_servers, name: sandbox}` or its name); `sandbox_url` instead
  names a sandbox outside the fleet.
- `test_timeout_s` (60): CPU seconds for each step in the sandbox (applying patches, the test run, one run of a
  reproduction script; the sandbox allows twice that in wall-clock time and at most its `max_timeout_s`).
- `memory_mb` (2048): memory for each step. `max_output_bytes` (1 MiB): output kept from each step.
- `num_processes` (null): NeMo-Gym's knob, gradings using the sandbox at once (null: the sandbox's queue decides).
- `partial_reward` (0.2): the reward of `RESOLVED_PARTIAL`.
- `relaxed_formatting` (false): NeMo-Gym's knob, eval reads the whole text when there is no `<solution>` pair.
- `max_solution_chars` (100,000): a longer solution (or reproduction script) is refused unread.

## Tools
None.

## Version history
- v1: NeMo-Gym's modes and rewards (FULL 1.0 / PARTIAL 0.2 / 0; repro-gen exit codes 2 then 0) over the gymfleet
  sandbox, with our own edit rules, test harness and typed failures for rows without a repository.
- v2: eval mode runs each test in its own sandbox case and reads its result from the process's exit status (no
  result token in the tested process), with grader-owned canary tests; a forged or hung harness scores
  `tests_tampered` (0).
- v3: repro-gen prepares every tree by one step (the gold patch applied or not, each file it touches rewritten
  with random comment noise, the grader's folder removed), so a script cannot tell the runs apart by their
  traces; once a script reproduces, two canary runs (an unfixed tree made by applying and reverting the gold
  patch: exit 2; a fresh fixed tree: exit 0) must agree, else `tests_tampered` (0). Departure: NeMo-Gym runs
  the script twice, once on the tree as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from gymfleet.errors import SandboxError
from gymfleet.grading.canary import interleave, make_canaries, tampered
from gymfleet.grading.sandbox_client import RunResult
from gymfleet.serving.resources import VerifyRequest, VerifyResponse
from gymfleet.serving.sandboxed import SandboxedConfig, SandboxedServer
from gymfleet.wire import Response
from resources_servers.swerl_gen import edits, repro
from resources_servers.swerl_gen.task import Task, parse_task

log = logging.getLogger(__name__)

HARNESS = (Path(__file__).parent / "harness.py").read_text()
# One driver for every step; a step that applies patches runs before any code of the task does, so its exit status
# is the truth, and it deletes the patch it applied so the code that runs next cannot read it.
DRIVER = """set -u
case "$1" in
""" + repro.PREPARE + """
  apply-model)
    git apply --whitespace=nowarn .gymfleet/model.patch 1>&2 || exit 10
    rm -f .gymfleet/model.patch
    if [ -s .gymfleet/test.patch ]; then git apply --whitespace=nowarn .gymfleet/test.patch 1>&2 || exit 11; fi
    rm -f .gymfleet/test.patch
    : > .gymfleet/applied ;;
  test) [ -f .gymfleet/applied ] || exit 99
    exec python3 .gymfleet/harness.py .gymfleet/tests.json "$2" ;;
  repro) exec python3 reproduce_bug.py ;;
esac
"""
MODEL_PATCH_FAILED, TASK_PATCH_FAILED = 10, 11
FULL, PARTIAL, NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"


class SwerlGenConfig(SandboxedConfig):
    """swerl_gen's fields (the module docstring explains each)."""

    test_timeout_s: float = Field(default=60.0, gt=0)
    """CPU seconds for each step run in the sandbox."""
    memory_mb: int = Field(default=2048, ge=64)
    """Memory for each step run in the sandbox."""
    max_output_bytes: int = Field(default=1 << 20, ge=4096)
    """Output kept from each step."""
    num_processes: int | None = Field(default=None, ge=1)
    """NeMo-Gym's concurrency knob: gradings using the sandbox at once (null: the sandbox's queue decides)."""
    partial_reward: float = Field(default=0.2, ge=0, le=1)
    """Reward when some FAIL_TO_PASS tests pass and every PASS_TO_PASS test does."""
    relaxed_formatting: bool = False
    """NeMo-Gym's knob: without a `<solution>` pair, eval reads the whole (visible) text."""
    max_solution_chars: int = Field(default=100_000, ge=1)
    """A longer solution or reproduction script is refused unread."""


class SwerlGenRequest(VerifyRequest):
    """A row to grade."""

    mode: Literal["eval", "repro-gen"]
    instance: dict[str, Any]
    metadata: dict[str, Any] = {}
    _task: Task = PrivateAttr()

    @model_validator(mode="after")
    def _parse(self):
        self._task = parse_task(self.mode, self.instance, self.metadata)
        return self


class SwerlGenResponse(VerifyResponse):
    """The graded row."""

    reason: str | None = None
    detail: str | None = None
    resolution: str | None = None
    fail_to_pass: float | None = None
    pass_to_pass: float | None = None
    test_results: dict[str, str] | None = None
    model_patch: str | None = None
    repro_test: str | None = None
    return_codes_before_patch: list[int | None] | None = None
    return_codes_after_patch: list[int | None] | None = None
    verification_result: dict[str, Any] | None = None
    verification_time: float | None = None


class SwerlGenServer(SandboxedServer):
    """Grades SEARCH/REPLACE fixes and reproduction scripts by running the task's repository in the sandbox."""

    config: SwerlGenConfig
    driver = DRIVER
    """The bash script every step runs (a class attribute, so a test can run a deliberately weakened one)."""
    ray_resources_default = {"num_cpus": 2}  # Ray placement: repository archives and patches per rollout
    reverify_mode = "stateless"
    reward_libraries = ()
    env_name = "swerl_gen"

    async def verify(self, body: SwerlGenRequest) -> SwerlGenResponse:
        text = edits.visible_text(_assistant_text(body.response))
        if not text:
            return SwerlGenResponse.echo(body, reward=0.0, reason="empty", detail="no answer after the reasoning")
        task = body._task
        try:
            if body.mode == "eval":
                fields = await self._eval(task, text)
            else:
                fields = await self._repro(task, text)
        except edits.EditError as exc:
            return SwerlGenResponse.echo(body, reward=0.0, reason=exc.reason, detail=exc.detail)
        return SwerlGenResponse.echo(body, **fields)

    async def _eval(self, task: Task, text: str) -> dict[str, Any]:
        solution = _bounded(edits.solution_text(text, relaxed=self.config.relaxed_formatting), self.config)
        blocks = edits.parse_edits(solution)
        changed = edits.apply_edits(task.files, blocks, task.test_files, remove_repo_name=task.remove_repo_name)
        patch = edits.make_patch(task.files, changed, remove_repo_name=task.remove_repo_name)
        canaries = make_canaries()
        test_ids = interleave(task.fail_to_pass + task.pass_to_pass, canaries)
        files = {".gymfleet/model.patch": patch, ".gymfleet/test.patch": task.test_patch,
                 ".gymfleet/harness.py": HARNESS, ".gymfleet/tests.json": json.dumps(test_ids),
                 f"{canaries.module}.py": canaries.source}
        cases = [{"args": ["apply-model"]}] + [{"args": ["test", str(index)]} for index in range(len(test_ids))]
        started = time.monotonic()
        results = await self._batch(task, files, cases, stop_on_failure=False)
        elapsed = round(time.monotonic() - started, 3)
        applied = results[0]
        if applied.return_code == TASK_PATCH_FAILED:
            raise SandboxError(f"task {task.instance_id}: its test_patch does not apply to its repository (bad "
                               f"data): {applied.stderr[-500:]}")
        if not applied.ok:
            log.info("task %s: the model's patch does not apply: %s", task.instance_id, applied.stderr[-300:])
            return {"reward": 0.0, "reason": "patch_does_not_apply", "detail": applied.stderr[-2000:] or
                    applied.message, "resolution": NO, "model_patch": patch, "verification_time": elapsed,
                    "verification_result": _nemo_result("done", NO)}
        statuses = {test_id: _status(result) for test_id, result in zip(test_ids, results[1:], strict=False)}
        passed = {test_id for test_id, status in statuses.items() if status == "PASSED"}
        if forged := tampered(canaries, passed):
            log.warning("task %s: results forged: %s", task.instance_id, forged)
            return {"reward": 0.0, "reason": "tests_tampered", "detail": forged, "resolution": NO,
                    "model_patch": patch, "verification_time": elapsed,
                    "verification_result": _nemo_result("done", NO)}
        f2p = _share(task.fail_to_pass, passed)
        p2p = _share(task.pass_to_pass, passed)
        resolution = FULL if f2p == 1 and p2p == 1 else PARTIAL if 0 < f2p < 1 and p2p == 1 else NO
        reward = {FULL: 1.0, PARTIAL: self.config.partial_reward, NO: 0.0}[resolution]
        broken = [result for result in results[1:] if result.status not in ("ok", "failed")]
        detail = broken[0].message if broken else None
        return {"reward": reward, "reason": None if resolution == FULL else "tests_failed", "detail": detail,
                "resolution": resolution, "fail_to_pass": f2p, "pass_to_pass": p2p,
                "test_results": {test_id: statuses.get(test_id, "FAILED") for test_id in
                                 task.fail_to_pass + task.pass_to_pass},
                "model_patch": patch, "verification_time": elapsed,
                "verification_result": _nemo_result("done", resolution)}

    async def _repro(self, task: Task, text: str) -> dict[str, Any]:
        script = edits.last_python_block(edits.repro_scope(text))
        if script is None or not script.strip():
            raise edits.EditError("no_test", "no ```python block in the answer")
        script = _bounded(script, self.config)
        started = time.monotonic()
        before, after = await self._repro_runs(task, script, ("unfixed", "fixed"))
        codes_before, codes_after = [before], [after]
        reproduced = codes_before == [2] and codes_after == [0]
        canaries = await self._repro_runs(task, script, ("reverted", "fixed")) if reproduced else None
        forged = repro.canary_verdict(*canaries) if canaries else None
        elapsed = round(time.monotonic() - started, 3)
        if forged:
            log.warning("task %s: the reproduction script is keyed on the run, not the fix: %s", task.instance_id,
                        forged)
        detail = forged if reproduced else (f"exit status {codes_before[0]} before the fix (2 wanted), "
                                            f"{codes_after[0]} after it (0 wanted)")
        reward = 1.0 if reproduced and not forged else 0.0
        reason = None if reward else "tests_tampered" if forged else "not_reproduced"
        return {"reward": reward, "reason": reason, "detail": detail, "repro_test": script,
                "return_codes_before_patch": codes_before, "return_codes_after_patch": codes_after,
                "verification_time": elapsed,
                "verification_result": _nemo_result("done", None, codes_before, codes_after)}

    async def _repro_runs(self, task: Task, script: str, trees: tuple[str, ...]) -> list[int | None]:
        """The script's exit status in one fresh sandbox per tree (`repro.TREES`), every tree prepared by the same
        step (`repro`), side by side."""
        steps = [{"args": ["prepare"]}, {"args": ["repro"]}]
        runs = await asyncio.gather(*(self._batch(task, repro.run_files(script, task.gold_patch, tree), steps)
                                      for tree in trees))
        for results in runs:
            if results[0].return_code == TASK_PATCH_FAILED:
                raise SandboxError(f"task {task.instance_id}: its gold patch does not apply to its repository (bad "
                                   f"data): {results[0].stderr[-500:]}")
            if not results[0].ok:
                raise SandboxError(f"task {task.instance_id}: the sandbox could not prepare the repository: "
                                   f"{results[0].message or results[0].stderr[-500:]}")
        return [_exit_code(results[1]) for results in runs]

    async def _batch(self, task: Task, files: dict[str, str], cases: list[dict[str, Any]], *,
                     stop_on_failure: bool = True) -> list[RunResult]:
        archive, repo_files = task.repository()
        async with self.slots:
            results = await self.sandbox.run_batch(
                self.driver, cases, "bash", files={**repo_files, **files}, archive=archive,
                stop_on_failure=stop_on_failure,
                timeout_s=self.config.test_timeout_s, memory_mb=self.config.memory_mb,
                max_output_bytes=self.config.max_output_bytes,
            )
        first = results[0]
        if first.return_code is None and first.message and first.message.startswith("could not set up"):
            raise SandboxError(f"task {task.instance_id}: the sandbox could not set the repository up: "
                               f"{first.message}")
        return results


def _assistant_text(response: Response) -> str:
    """Every assistant message's text, messages joined by newlines (NeMo-Gym's rule; reasoning items excluded)."""
    texts = []
    for item in response.output:
        if item.type == "message" and getattr(item, "role", "assistant") == "assistant":
            texts.append("".join(getattr(part, "text", "") or "" for part in item.content))
    return "\n".join(texts).strip()


def _bounded(text: str, config: SwerlGenConfig) -> str:
    if len(text) > config.max_solution_chars:
        raise edits.EditError("solution_too_long", f"{len(text)} characters; at most {config.max_solution_chars}")
    return text


def _status(result: RunResult) -> str:
    """A test's status from its process's exit (`harness.py`): the launcher reports it, the test cannot write it."""
    if result.status not in ("ok", "failed"):
        return "ERROR"
    return {0: "PASSED", 1: "FAILED", 2: "ERROR", 3: "SKIPPED"}.get(result.return_code, "ERROR")


def _share(tests: list[str], passed: set[str]) -> float:
    return sum(test in passed for test in tests) / len(tests) if tests else 1.0


def _exit_code(result: RunResult) -> int | None:
    return result.return_code if result.status in ("ok", "failed") else None


def _nemo_result(status: str, resolution: str | None, before: list | None = None, after: list | None = None):
    return {"status": status, "resolution": resolution, "return_codes_before_patch": before,
            "return_codes_after_patch": after}

