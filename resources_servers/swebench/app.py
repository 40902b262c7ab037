"""swebench: fix a real repository in a sandbox until its failing tests pass (SWE-bench's task, SWE-bench's rows).

`/seed_session` opens a sandbox session holding the row's repository at its base commit (`/workspace/repo`, history
truncated to the base commit's ancestry, setup commands run); the agent (`agents/swe_agent`) explores and edits it
with four tools; `/verify` collects the session's `git diff` against the base commit, closes the session, and grades
the diff in a FRESH sandbox with the row's test patch. Our own tasks (five small repositories with history, issues,
gold and test patches: `make_tasks.py`, shipped as git bundles in `data/repos/`) run here in the bubblewrap sandbox.

## Task fields
SWE-bench's instance columns: `instance_id`, `repo`, `base_commit`, `patch` (the gold patch; never shown, never
used in grading), `test_patch`, `problem_statement`, `hints_text`, `created_at`, `version`, `FAIL_TO_PASS` and
`PASS_TO_PASS` (JSON strings of test ids, or lists), `environment_setup_commit`, `difficulty`, `subset`, `split`;
NeMo-Gym's rows are accepted as they are. Ours add:
- `repo_source`: the repository, a git bundle, a repository folder or a tar archive (absolute, or relative to the
  repository root). Rows without it are SWE-bench instances that need their container image (below).
- `test_framework` ("unittest"): how tests run; test ids are unittest's dotted names
  (`tests.test_slug.SlugifyTests.test_basic`). The sandbox's Python has no pytest.
- `setup_commands` ([]): bash commands run in the repository after seeding and before grading (no network).
- `image`: the container image of a row that needs one (default: SWE-bench's image for `instance_id`).
- `responses_create_params`: the issue as the prompt, and the four tools below.

## Reward
1.0 iff, in a fresh sandbox holding only the base snapshot, the model's patch and the test patch both apply and
every FAIL_TO_PASS and every PASS_TO_PASS test passes; else 0.0, with `reason`:
- `no_session` (no seeded session: never seeded, or already verified), `session_ended` (the
  sandbox session died of the model's commands, e.g. its CPU or memory limit), `empty_patch` (nothing changed);
- `patch_too_large` (over `max_patch_bytes`), `patch_touches_tests`: the patch adds, edits, deletes or renames a
  test file (a path with a `test`/`tests`/`testing` folder, `test_*.py`, `*_test.py`, `conftest.py`, `pytest.ini`,
  or any file the test patch touches) - rejected without running;
- `patch_does_not_apply`, `test_patch_does_not_apply` (bad row, logged), `setup_failed`;
- `tests_timeout`, `tests_oom`, `no_test_report` (the tests ended the runner before it reported),
  `tests_tampered` (the code under test replaced unittest's machinery), `fail_to_pass_failed`, `pass_to_pass_failed`.
Anti-cheat: the grading tests exist only in the grading sandbox; only the diff leaves the agent's session, so files
it wrote outside the repository, ignored files, a fake result file or a `conftest.py` reach nothing (the last is a
test file: the patch is rejected). The tests run in a child process that loads them all before running any, has no
stdin, stdout or stderr, and sends each outcome on a pipe to a supervisor that never imports the repository; only the
supervisor holds the random nonce behind which the report travels on stdout (`grading.py`). Any function, class or
descriptor of unittest's modules replaced, added or removed (checked after loading and after every test), or a grader
canary that comes out wrong in any of its runs (placed at random and run again at the end), is `tests_tampered`.
Not covered: code that games the tests' assertions by behaving differently under test, as in SWE-bench itself, and
a forgery that patches unittest only for the span of one assertion and restores it before the test ends.
Response fields: `model_patch` (the diff graded, or null), `reason` (null at 1.0), `tests_status`
(`{FAIL_TO_PASS: {success, failure}, PASS_TO_PASS: {...}}`, SWE-bench's report shape), `resolved`,
`grading_detail` (what git or the tests said when it went wrong), `grading_duration_s` (the grading run, seconds).

Failures, kept out of rewards (`_ng_failure_class: sandbox_failed`): the sandbox is unreachable or fails; the
session could not be seeded because the repository cannot be prepared (missing `repo_source`, unknown commit) or
the row needs a container image this host lacks - the message names the image and how to provide it. A tool call
or `/verify` whose session was seeded before this server crashed and was restarted answers HTTP 410
`session_lost` (`gymfleet.serving.sessions`), which the agent ends as a failure row (not a `no_session` 0.0); a
`/verify` whose session was closed after `session_idle_s` idle is a `session_lost` failure row
(`gymfleet.serving.session_store`).
`ng_prepare_data` accepts such rows (they are valid SWE-bench rows) and logs, once per image, which image each
needs and how to provide it.

## Departures from NeMo-Gym
- Our tasks run from git bundles, graded in the bubblewrap sandbox or (`backend: docker`) in a fresh container
  from a per-task image (`containers.py`); NeMo-Gym builds a container per instance from `swebench==4.1.0`'s test
  specs. Rows naming official SWE-bench images (NeMo-Gym's rows) are not run: with `backend: docker` the seeding
  error says whether the engine holds the image (running it needs SWE-bench's per-repository test commands and log
  parsers, not implemented) or lacks it (naming it, and `docker pull`). The agent's session runs in the sandbox
  service with either backend.
- Tests run with the stdlib's unittest through our runner; NeMo-Gym runs the instance's own test command and parses
  its log (`swebench`'s log parsers), where a test's printed text can pass for a result.
- A patch touching test files is rejected outright (NeMo-Gym lets the test patch overwrite them).
- Sessions close at `/verify`, on idling (`session_idle_s`) and at shutdown.

## Config
- `sandbox` ("sandbox"): the sandbox instance (`{type: sandbox_servers, name: sandbox}` or its name); `sandbox_url`
  instead names one outside the fleet.
- `backend` ("bwrap"): where grading runs: `bwrap` (the sandbox service) or `docker` (a fresh container per
  grading: no network, one CPU, `grading_memory_mb` without swap, a pids limit, no capabilities; killed and removed
  at `grading_timeout_s`). A Docker or Podman engine must answer at start-up, holding `base_image`.
- `base_image` ("localhost/gymfleet-base:bookworm", which `scripts/install_container_engine.sh` builds): any image
  with python3 and git; `docker_host` (null: `DOCKER_HOST`, else Docker's socket, else Podman's
  `/run/podman/podman.sock`); `docker_concurrency` (4): gradings in containers at once.
- `command_timeout_s` (30): CPU seconds per tool command (the sandbox allows twice that in wall-clock time);
  `max_command_timeout_s` (120) caps what the model may ask for.
- `max_output_chars` (10000): a tool's output beyond this keeps its head and tail with a note of what was cut.
- `session_memory_mb` (512), `grading_memory_mb` (1024), `grading_timeout_s` (120): sandbox limits.
- `session_idle_s` (1800): a session untouched this long is closed.
- `max_patch_bytes` (1000000).

## Tools
Each answers HTTP 200 with JSON the model reads; `{"error": ...}` when the call cannot be done.
- `bash(command, timeout_s?)`: runs in `/workspace/repo`, a fresh shell each call; `{exit_code, stdout, stderr}`
  (+ `status` and `message` when it timed out or was killed).
- `view_file(path, start_line?, end_line?)`: numbered lines, or a directory listing; `{output}`.
- `create_file(path, content)`: writes the file, making folders; `{output}`.
- `str_replace(path, old_str, new_str)`: `old_str` must occur exactly once; `{output}` with the edited region.
Paths are relative to the repository (absolute ones must lie inside it).

## Version history
- v1: initial.
- v2: `backend: docker` grades in containers (same rewards and reasons as bwrap).
- v3: grader-owned canary tests (one must fail, one must pass) run in every grading; a run where either comes out
  wrong scores `tests_tampered` (0), whatever the patch touched.
- v4: a `/verify` whose session was closed after `session_idle_s` idle is a `session_lost` failure row, not a
  `no_session` 0.0 (`gymfleet.serving.session_store`).
- v5: the runner is a supervisor (holds the nonce, never imports the repository) and a child (runs the tests, no
  nonce in its memory); every test is loaded before the first runs, unittest's modules are watched as a whole after
  every test, and the canaries run again at the end: forgeries through any unittest internal, or a report forged
  with a nonce read from the runner's frames, score `tests_tampered` or fail (v4 scored some of them 1.0).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PositiveFloat, model_validator

from gymfleet.errors import SandboxError
from gymfleet.grading.canary import make_canaries
from gymfleet.grading.sandbox_client import SandboxClient, SandboxSession, SessionGoneError
from gymfleet.grading.text import clip_middle
from gymfleet.serving.resources import (
    SeedSessionRequest,
    VerifyRequest,
    VerifyResponse,
)
from gymfleet.serving.sandboxed import SandboxedConfig, SandboxedServer
from gymfleet.serving.session_store import SessionStore
from gymfleet.serving.sessions import session_id
from resources_servers.swebench import grading, repos
from resources_servers.swebench.containers import ContainerRunner
from resources_servers.swebench.repos import RepoSourceError, Snapshot
from resources_servers.swebench.tools import (
    DIFF_COMMAND,
    FILE_TOOL,
    BashArgs,
    CreateFileArgs,
    StrReplaceArgs,
    ViewFileArgs,
)

log = logging.getLogger(__name__)

REPO = "/workspace/repo"
_warned_images: set[str] = set()


def _test_ids(value: Any) -> Any:
    """SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON strings; lists are accepted too."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON list of test ids: {exc}") from exc
    return value


TestIds = Annotated[list[str], BeforeValidator(_test_ids)]


class SWEBenchConfig(SandboxedConfig):
    """swebench's fields (the module docstring explains each)."""

    backend: Literal["bwrap", "docker"] = "bwrap"
    """Where grading runs: the bubblewrap sandbox service, or a fresh container per grading (`containers.py`)."""
    base_image: str = "localhost/gymfleet-base:bookworm"
    """Docker backend: the image task images are built on (python3 and git in it)."""
    docker_host: str | None = None
    """Docker backend: the engine (`unix:///...`, `tcp://...`); default `DOCKER_HOST`, then Docker's or Podman's
    socket."""
    docker_concurrency: int = Field(default=4, ge=1)
    """Docker backend: gradings running at once (more wait)."""
    command_timeout_s: PositiveFloat = 30.0
    max_command_timeout_s: PositiveFloat = 120.0
    max_output_chars: int = Field(default=10_000, ge=200)
    session_memory_mb: int = Field(default=512, ge=64)
    grading_memory_mb: int = Field(default=1024, ge=64)
    grading_timeout_s: PositiveFloat = 120.0
    session_idle_s: PositiveFloat = 1800.0
    max_patch_bytes: int = Field(default=1_000_000, ge=1)


class SWEBenchTask(BaseModel):
    """The fields of a row this environment reads (all others are echoed)."""

    model_config = ConfigDict(extra="allow")
    instance_id: str
    base_commit: str | None = None
    test_patch: str
    FAIL_TO_PASS: TestIds
    PASS_TO_PASS: TestIds
    repo_source: str | None = None
    test_framework: Literal["unittest"] = "unittest"
    setup_commands: list[str] = []

    @model_validator(mode="after")
    def _say_which_image(self):
        if self.repo_source is None:
            image = repos.image_for(self.__dict__ | (self.__pydantic_extra__ or {}))
            if image not in _warned_images:
                _warned_images.add(image)
                log.warning("swebench row %s has no repo_source: %s", self.instance_id, repos.image_help(image))
        return self


class SWEBenchSeedRequest(SeedSessionRequest, SWEBenchTask):
    """`/seed_session` body: the row."""


class SWEBenchRequest(VerifyRequest, SWEBenchTask):
    """A row to grade."""


class SWEBenchResponse(VerifyResponse):
    """The graded row."""

    model_patch: str | None = None
    reason: str | None = None
    resolved: bool = False
    tests_status: dict[str, dict[str, list[str]]] | None = None
    grading_detail: str | None = None
    grading_duration_s: float | None = None


@dataclass
class Workspace:
    """One rollout's sandbox session (or why it has none)."""

    sandbox: SandboxSession | None
    base_commit: str
    error: str | None = None
    """Why the session could not be seeded: an infrastructure or data problem, reported at `/verify`."""
    ended: str | None = None
    """Why the session ended under the model's commands."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SWEBenchServer(SandboxedServer):
    """Repositories in sandbox sessions, edited through tools, graded in a fresh sandbox."""

    config: SWEBenchConfig
    ray_resources_default = {"num_cpus": 2}  # Ray placement: repository archives and diffs per rollout
    reverify_mode = "unsupported"  # the diff lives in the session, which /verify closes
    reward_libraries = ()
    env_name = "swebench"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.containers: ContainerRunner | None = None
        self.grader: SandboxClient | ContainerRunner = self.sandbox
        if self.config.backend == "docker":
            self.containers = self.grader = ContainerRunner(self.config.base_image, host=self.config.docker_host,
                                                            concurrency=self.config.docker_concurrency)
        self.snapshots = repos.SNAPSHOTS
        self.workspaces: SessionStore[Workspace] = SessionStore(
            self.config.session_idle_s, name=self.config.name or "swebench", close=self._close,
            busy=lambda workspace: workspace.lock.locked())

    async def startup(self) -> None:
        await super().startup()  # a missing sandbox instance fails here
        if self.containers is not None:
            await asyncio.to_thread(self.containers.start)
        self.workspaces.start_sweeping()

    async def shutdown(self) -> None:
        await self.workspaces.close_all()
        if self.containers is not None:
            await asyncio.to_thread(self.containers.close)
        await super().shutdown()

    # ------------------------------------------------------------------------------------------------ sessions

    async def seed_session(self, body: SWEBenchSeedRequest) -> dict[str, Any]:
        key = session_id()
        old = self.workspaces.pop(key)
        if old is not None:
            await self._close(old)
        try:
            workspace = await self._open(body)
        except (RepoSourceError, SandboxError) as exc:
            log.warning("swebench %s: could not seed a session: %s", body.instance_id, exc)
            workspace = Workspace(None, body.base_commit or "", error=str(exc))
        self.workspaces.put(key, workspace)
        return {"error": workspace.error} if workspace.error else {}

    async def _open(self, task: SWEBenchTask) -> Workspace:
        if task.repo_source is None:
            image = repos.image_for(task.__dict__ | (task.__pydantic_extra__ or {}))
            if self.containers is not None and await asyncio.to_thread(self.containers.has_image, image):
                raise RepoSourceError(f"row {task.instance_id}: its image {image} is on this engine, but running "
                                      "official SWE-bench images (their own test commands and log parsers) is not "
                                      "implemented; give the row a repo_source")
            raise RepoSourceError(f"row {task.instance_id}: {repos.image_help(image)}")
        snapshot: Snapshot = await self.snapshots.get(task.repo_source, task.base_commit)
        sandbox = await self.sandbox.session(archive=snapshot.archive, timeout_s=self.config.command_timeout_s,
                                             memory_mb=self.config.session_memory_mb)
        try:
            for command in task.setup_commands:
                result = await sandbox.exec(f"cd {REPO} || exit 1\n{command}", "bash")
                if not result.ok:
                    raise RepoSourceError(f"setup command {command!r} failed ({result.status}): "
                                          f"{(result.stderr or result.stdout)[-500:]}")
        except BaseException:
            await sandbox.close()
            raise
        return Workspace(sandbox, snapshot.base_commit)

    async def _close(self, workspace: Workspace) -> None:
        sandbox, workspace.sandbox = workspace.sandbox, None
        if sandbox is not None:
            try:
                await sandbox.close()
            except SandboxError as exc:  # the sandbox service expires it on its own
                log.warning("could not close sandbox session %s: %s", sandbox.id, exc)

    # ------------------------------------------------------------------------------------------------ tools

    async def bash(self, body: BashArgs) -> dict[str, Any]:
        """Run a bash command in the repository."""
        timeout_s = min(body.timeout_s or self.config.command_timeout_s, self.config.max_command_timeout_s)
        return await self._exec(f"cd {REPO} || exit 1\n{body.command}", timeout_s, raw=True)

    async def view_file(self, body: ViewFileArgs) -> dict[str, Any]:
        """Show a file with line numbers, or list a directory."""
        return await self._file_tool({"op": "view", **body.model_dump()})

    async def create_file(self, body: CreateFileArgs) -> dict[str, Any]:
        """Create or overwrite a file."""
        return await self._file_tool({"op": "create", **body.model_dump()})

    async def str_replace(self, body: StrReplaceArgs) -> dict[str, Any]:
        """Replace a unique string in a file."""
        return await self._file_tool({"op": "replace", **body.model_dump()})

    async def _file_tool(self, arguments: dict[str, Any]) -> dict[str, Any]:
        command = f"python3 -I -c {shlex.quote(FILE_TOOL)}"
        return await self._exec(command, self.config.command_timeout_s, stdin=json.dumps(arguments))

    async def _exec(self, command: str, timeout_s: float, *, stdin: str | None = None, raw: bool = False):
        key = session_id()
        workspace = self.workspaces.get(key)
        if workspace is None:
            return {"error": "no repository session: /seed_session was not called, or the session was closed"}
        if workspace.sandbox is None:
            return {"error": f"the repository session is not available: {workspace.error or workspace.ended}"}
        async with workspace.lock:
            try:
                result = await workspace.sandbox.exec(command, "bash", stdin=stdin, timeout_s=timeout_s)
            except SessionGoneError as exc:
                workspace.ended, workspace.sandbox = f"the sandbox session ended: {exc}", None
                return {"error": workspace.ended}
            except SandboxError as exc:  # infrastructure: the rollout will be a failure row, not a 0
                log.warning("swebench tool call failed: %s", exc)
                workspace.error = f"the sandbox failed during a tool call: {exc}"
                return {"error": "the sandbox failed; this rollout will not be scored"}
            finally:
                self.workspaces.touch(key)
        limit = self.config.max_output_chars
        if result.message and "session has ended" in result.message:
            workspace.ended, workspace.sandbox = result.message, None
        if raw:
            answer: dict[str, Any] = {"exit_code": result.return_code, "stdout": clip_middle(result.stdout, limit),
                                      "stderr": clip_middle(result.stderr, limit)}
            if result.status not in ("ok", "failed"):
                answer |= {"status": result.status, "message": result.message}
            return answer
        if not result.ok:
            return {"error": clip_middle((result.stderr or result.message or result.status).strip(), limit)}
        return {"output": clip_middle(result.stdout, limit)}

    # ------------------------------------------------------------------------------------------------ verify

    async def verify(self, body: SWEBenchRequest) -> SWEBenchResponse:
        key = session_id()
        if self.workspaces.lost(key):  # closed as idle: the diff went with it, so this is no grade of the model's
            self.workspaces.pop(key)
            return SWEBenchResponse.echo(body, reward=0.0, **self.workspaces.lost_fields())
        workspace = self.workspaces.pop(key)
        if workspace is None:
            return SWEBenchResponse.echo(body, reward=0.0, reason="no_session", model_patch=None)
        try:
            if workspace.error:
                raise SandboxError(workspace.error)
            if workspace.sandbox is None:
                return SWEBenchResponse.echo(body, reward=0.0, reason="session_ended", model_patch=None)
            patch = await self._collect_diff(workspace)
        finally:
            await self._close(workspace)
        if patch is None:
            return SWEBenchResponse.echo(body, reward=0.0, reason="patch_too_large", model_patch=None)
        started = time.perf_counter()
        grade = await self._grade(body, patch, workspace.base_commit)
        return SWEBenchResponse.echo(body, reward=grade.reward, reason=grade.reason, model_patch=patch,
                                     resolved=grade.reward == 1.0, tests_status=grade.tests_status or None,
                                     grading_detail=grade.detail,
                                     grading_duration_s=round(time.perf_counter() - started, 4))

    async def _collect_diff(self, workspace: Workspace) -> str | None:
        """The session's changes against the base commit, new files included; None when over `max_patch_bytes`.

        Raises:
            SandboxError: the sandbox failed, or git could not diff (the model broke `.git`: then the diff is "").
        """
        command = DIFF_COMMAND.format(base=shlex.quote(workspace.base_commit))
        try:
            result = await workspace.sandbox.exec(command, "bash", timeout_s=self.config.command_timeout_s)
        except SessionGoneError:
            return ""
        if result.stdout_truncated or len(result.stdout.encode()) > self.config.max_patch_bytes:
            return None
        if not result.ok:
            log.info("git diff failed in the agent's session (%s): %s", result.status, result.stderr[-300:])
            return ""
        return result.stdout

    async def _grade(self, task: SWEBenchRequest, patch: str, base_commit: str) -> grading.Grade:
        if not patch.strip():
            return grading.Grade(0.0, "empty_patch")
        protected = repos.patch_paths(task.test_patch)
        touched = sorted(p for p in repos.patch_paths(patch) if repos.is_test_path(p) or p in protected)
        if touched:
            return grading.Grade(0.0, "patch_touches_tests", detail=f"test files in the patch: {touched}")
        try:
            snapshot = await self.snapshots.get(task.repo_source, task.base_commit)
        except RepoSourceError as exc:
            raise SandboxError(f"cannot prepare the grading repository: {exc}") from exc
        nonce, canaries = grading.new_nonce(), make_canaries()
        result = await self.grader.run(
            grading.grade_script(task.setup_commands), "bash", stdin=nonce + "\n", archive=snapshot.archive,
            files=grading.grading_files(patch, task.test_patch, task.FAIL_TO_PASS + task.PASS_TO_PASS, canaries),
            timeout_s=self.config.grading_timeout_s, memory_mb=self.config.grading_memory_mb,
        )  # fmt: skip
        exits = {grading.APPLY_FAILED: "patch_does_not_apply", grading.TEST_PATCH_FAILED: "test_patch_does_not_apply",
                 83: "setup_failed"}
        if result.status == "failed" and result.return_code in exits:
            reason = exits[result.return_code]
            if reason != "patch_does_not_apply":
                log.error("swebench %s: %s: %s", task.instance_id, reason, result.stderr[-500:])
            return grading.Grade(0.0, reason, detail=result.stderr[-2000:])
        if result.status in ("timeout", "oom"):
            return grading.Grade(0.0, f"tests_{result.status}", detail=result.message)
        report = grading.read_report(result.stdout, nonce)
        if report is None:
            return grading.Grade(0.0, "no_test_report", detail=result.message or result.stderr[-2000:])
        return grading.score(report, task.FAIL_TO_PASS, task.PASS_TO_PASS, canaries)

