"""The sandbox service's wire shapes, and how a launcher frame becomes a `RunResult`.

Statuses: `ok` (exit 0 in time), `failed` (non-zero exit, an uncaught exception, a crash signal such as SIGSEGV,
or files/prelude that could not be set up), `timeout` (wall-clock or CPU limit), `oom` (the memory limit: Python's
`MemoryError`, C++'s `bad_alloc`, an allocation error message, or the memory watch killed its processes), `killed`
(ended by SIGKILL or the file-size limit without a timeout, or the program broke the sandbox's own supervisor),
`sandbox_failed` (the host killed the sandbox from outside - its OOM killer, an operator - which the program cannot
do: an infrastructure failure, never the program's, which `gymfleet.grading.sandbox_client` raises as `SandboxError`).
"""

from __future__ import annotations

import base64
import binascii
import signal
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gymfleet.grading.sandbox_client import RunResult, Status
from sandbox.process import Frame

Language = Literal["python", "bash"]
EXITED, SIGNALED, TIMED_OUT, SETUP_FAILED = 0, 1, 2, 3
OOM_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
KILL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGXFSZ})


def _relative_names(files: dict[str, str]) -> dict[str, str]:
    for name in files:
        if not name or name.startswith("/") or ".." in name.split("/") or "\0" in name:
            raise ValueError(f"file name {name!r} must be a relative path inside the workspace")
    return files


Files = Annotated[dict[str, str], AfterValidator(_relative_names)]


def _base64(text: str) -> str:
    try:
        base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64: {exc}") from exc
    return text


Archive = Annotated[str, AfterValidator(_base64)]
"""A tar archive (plain, gzip, bz2 or xz), base64-encoded: a repository snapshot unpacked into the workspace."""


class _Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(None, gt=0, examples=[10])
    """CPU time limit of each process (whole seconds, rounded up); the wall-clock limit is this times the server's
    `wall_time_factor`. Default: the server's."""
    memory_mb: int | None = Field(None, ge=16, examples=[1024])
    """Memory limit in MiB: the address space of each process, and all the memory of the run's processes together,
    files in its tmpfs (`/tmp`, `/workspace`, `/dev/shm`) and memfds included (`sandbox.memory`). Default: the
    server's."""
    max_output_bytes: int | None = Field(None, ge=0)
    """Keep at most this much of stdout and of stderr (the rest is drained and dropped; `truncated` says so)."""


class _Program(_Limits):
    language: Language = "python"
    code: str = Field(examples=['print("hello")'])
    files: Files = {}
    """Extra files written into the workspace before the program starts (relative paths, text)."""
    archive: Archive | None = None
    """A repository snapshot (base64 tar) unpacked into the workspace before `files` are written."""


class RunRequest(_Program):
    """`POST /run`: one program, one input."""

    stdin: str | None = None
    args: list[str] = Field(default=[], fail_fast=True)


class Case(BaseModel):
    """One input of a batch."""

    model_config = ConfigDict(extra="forbid")
    stdin: str | None = None
    args: list[str] = Field(default=[], fail_fast=True)


class BatchRequest(_Program):
    """`POST /run_batch`: one program run once per case, in one sandbox, each case in a fresh process."""

    cases: list[Case] = Field(min_length=1, fail_fast=True)
    stop_on_failure: bool = False
    """Stop after the first case whose status is not `ok`."""
    prelude: str | None = None
    """Python run once before the cases; each case starts from the state it leaves (e.g. shared imports)."""


class BatchResult(BaseModel):
    """`POST /run_batch` answer: one result per case run (fewer than the cases when it stopped early)."""

    results: list[RunResult]


class SessionRequest(_Limits):
    """`POST /sessions`: a persistent sandbox (limits apply to each exec; memory to the whole session), seeded with
    `files` and/or a repository snapshot (`archive`)."""

    files: Files = {}
    archive: Archive | None = None


class SessionCreated(BaseModel):
    session_id: str
    idle_timeout_s: float


class ExecRequest(BaseModel):
    """`POST /sessions/{id}/exec`: Python runs in the session's namespace; bash in its workspace."""

    model_config = ConfigDict(extra="forbid")
    code: str
    language: Language = "python"
    stdin: str | None = None
    timeout_s: float | None = Field(None, gt=0)


def to_result(frame: Frame, limits: Any) -> RunResult:
    """Classify one launcher frame run under `limits` (`timeout_s`, `wall_timeout_s`, `memory_mb`, `max_output`)."""
    timeout_s, memory_mb, max_output = limits.timeout_s, limits.memory_mb, limits.max_output
    stdout = frame.stdout.decode("utf-8", "replace")
    stderr = frame.stderr.decode("utf-8", "replace")
    truncated = bool(frame.flags & 3)
    status: Status
    code: int | None = frame.code
    message = None
    if frame.kind == TIMED_OUT:
        status, code, message = "timeout", None, f"exceeded the {limits.wall_timeout_s:g}s wall-clock limit"
    elif frame.kind == SETUP_FAILED:
        status, code, message = "failed", None, f"could not set up the program: {stderr.strip()}"
    elif frame.kind == SIGNALED:
        code = -frame.code
        name = _signal_name(frame.code)
        if frame.code == signal.SIGXCPU or frame.code == signal.SIGKILL and frame.cpu_s >= timeout_s:
            status, code, message = "timeout", None, f"exceeded the {timeout_s:g}s CPU time limit ({name})"
        elif frame.code in KILL_SIGNALS:
            status, message = "killed", f"killed by {name}"
        elif _mentions_oom(stderr):
            status, message = "oom", f"ran out of memory (limit {memory_mb} MiB; {name})"
        else:
            status, message = "failed", f"crashed with {name}"
    elif frame.code == 0:
        status = "ok"
    elif _mentions_oom(stderr):
        status, message = "oom", f"ran out of memory (limit {memory_mb} MiB)"
    else:
        status, message = "failed", f"exited with status {frame.code}"
    if truncated:
        note = f"output truncated to {max_output} bytes"
        message = f"{message}; {note}" if message else note
    return RunResult(status=status, stdout=stdout, stderr=stderr, return_code=code, duration_s=frame.duration_s,
                     truncated=truncated, stdout_truncated=bool(frame.flags & 1), message=message)


def broken(message: str, status: Status = "killed", duration_s: float = 0.0) -> RunResult:
    """A result for a case whose supervisor was broken or stopped answering (the program's doing)."""
    return RunResult(status=status, stdout="", stderr="", return_code=None, duration_s=duration_s, message=message)


def killed_from_outside(signal_name: str, duration_s: float = 0.0) -> RunResult:
    """A result for a run whose sandbox the host killed (`SandboxProcess.killed_from_outside`): infrastructure."""
    message = f"the sandbox was killed from outside by {signal_name} (the host's OOM killer or an operator): an " \
              "infrastructure failure, not the program's"
    return RunResult(status="sandbox_failed", stdout="", stderr="", return_code=None, duration_s=duration_s,
                     message=message)


def _mentions_oom(stderr: str) -> bool:
    tail = stderr[-2000:]
    return any(marker in tail for marker in OOM_MARKERS)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
