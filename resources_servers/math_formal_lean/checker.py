"""The Lean checker client: NeMo-Skills' sandbox `/execute` protocol, or gymfleet's own sandbox running `lean`.

NeMo-Skills' sandbox (the `lean4` language of its `/execute` route):

    POST /execute {"generated_code": <program>, "language": "lean4", "timeout": <s>, "max_output_characters": <n>}
    -> {"process_status": "completed" | "failed" | "timeout" | ..., "stdout": "...", "stderr": "..."}

`completed` is a compile with exit status 0 (warnings, `sorry` ones included, are in the output), `failed` one with
errors, `timeout` one that ran out of time: all three are the proof's doing. Anything else is the checker's:
unreachable, no answer within the deadline, a non-2xx answer once the bounded retries are spent, an answer that is
not such an object, or another `process_status` (NeMo-Skills answers `error` when running the compiler itself
failed). Those raise `SandboxError`, which the resources server turns into a `sandbox_failed` row, never a reward.

With `lean_command` set, the program runs instead in gymfleet's sandbox service (`sandbox/`, through
`gymfleet.grading.sandbox_client`) as `Proof.lean` in a fresh workspace, compiled by `<lean_command> Proof.lean`
(a bash command line: the toolchain must be visible inside the sandbox). Exit 0 is `completed`, another exit status
or running out of memory `failed`, the time limit `timeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from gymfleet import http
from gymfleet.errors import SandboxError, TransportError
from gymfleet.grading.sandbox_client import SandboxClient

PROOF_STATUSES = frozenset({"completed", "failed", "timeout"})
"""Checker statuses that grade the proof; any other is a checker failure."""
_CHECKER_RETRY_STATUSES = http.RETRY_STATUSES | {500}


@dataclass(frozen=True)
class CompilerOutput:
    """What compiling one program gave (NeMo-Gym's `compiler_output`)."""

    process_status: str
    stdout: str
    stderr: str

    def as_dict(self) -> dict[str, str]:
        return {"process_status": self.process_status, "stdout": self.stdout, "stderr": self.stderr}


class ExecuteChecker:
    """Compiles Lean programs through a NeMo-Skills-style `/execute` endpoint.

    Args:
        server: Instance name of the checker in the fleet (used when `url` is None).
        url: Base URL of a checker outside the fleet (`http://host:port`).
        client: The calling server's `ServerClient` (resolves `server`).
        compile_timeout_s: The compile time limit sent to the checker.
        deadline_s: Deadline of one HTTP attempt (the compile time limit plus queueing and transfer).
        max_attempts: Attempts per program. Failures to connect, 429 and 5xx answers, and (compiling is a pure
            function of the program) dropped connections are retried; a call with no answer within the deadline is
            not (the checker may still be compiling it).
        max_output_characters: Output the checker is asked to keep.
        max_concurrency: Programs in flight at once from this client (None: no cap).
    """

    def __init__(self, server: str | None, *, url: str | None, client: http.ServerClient, compile_timeout_s: float,
                 deadline_s: float, max_attempts: int, max_output_characters: int, max_concurrency: int | None):
        self.server = server
        self.base_url = url.rstrip("/") if url else None
        self.client = client
        self.compile_timeout_s = compile_timeout_s
        self.deadline_s = deadline_s
        self.max_output_characters = max_output_characters
        self.retry = http.RetryPolicy(max_attempts=max_attempts, backoff_s=0.5, idempotent=True,
                                      retry_statuses=_CHECKER_RETRY_STATUSES)
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    def describe(self) -> str:
        return f"{self.base_url}/execute" if self.base_url else f"instance {self.server!r} /execute"

    async def compile(self, program: str) -> CompilerOutput:
        """Compile `program`.

        Raises:
            SandboxError: the checker failed (see the module docstring).
        """
        body = {"generated_code": program, "language": "lean4", "timeout": self.compile_timeout_s,
                "max_output_characters": self.max_output_characters}
        where = self.describe()
        try:
            async with self._slots:
                if self.base_url is not None:
                    answer = await http.request("POST", self.base_url + "/execute", json=body,
                                                timeout_s=self.deadline_s, retry=self.retry)
                else:
                    answer = await self.client.post(self.server, "/execute", json=body, timeout_s=self.deadline_s,
                                                    retry=self.retry)
            return parse_answer(answer.raise_for_status().json(), where)
        except TransportError as exc:  # unreachable, past the deadline, or a non-2xx answer once retries are spent
            raise SandboxError(f"Lean checker at {where}: {exc}") from exc
        except ValueError as exc:
            raise SandboxError(f"Lean checker at {where} answered non-JSON: {answer.text[:300]!r}") from exc


def parse_answer(data: Any, where: str) -> CompilerOutput:
    """Read an `/execute` answer.

    Raises:
        SandboxError: it is not an object with a proof status and string outputs.
    """
    if not isinstance(data, dict) or not isinstance(data.get("process_status"), str):
        raise SandboxError(f"Lean checker at {where} answered without a process_status: {str(data)[:300]}")
    status = data["process_status"]
    stdout, stderr = data.get("stdout", ""), data.get("stderr", "")
    if not isinstance(stdout, str) or not isinstance(stderr, str):
        raise SandboxError(f"Lean checker at {where} answered non-text stdout/stderr: {str(data)[:300]}")
    if status not in PROOF_STATUSES:
        raise SandboxError(f"Lean checker at {where} could not compile (process_status {status!r}): "
                           f"{(stderr or stdout)[:300]}")
    return CompilerOutput(status, stdout, stderr)


class SandboxLeanChecker:
    """Compiles Lean programs with `lean_command` in gymfleet's sandbox service."""

    def __init__(self, sandbox: SandboxClient, *, lean_command: str, compile_timeout_s: float, memory_mb: int,
                 max_output_characters: int, max_concurrency: int | None):
        self.sandbox = sandbox
        self.lean_command = lean_command
        self.compile_timeout_s = compile_timeout_s
        self.memory_mb = memory_mb
        self.max_output_characters = max_output_characters
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()

    def describe(self) -> str:
        return f"the sandbox at {self.sandbox.url} running {self.lean_command!r}"

    async def compile(self, program: str) -> CompilerOutput:
        """Compile `program` in a fresh sandbox.

        Raises:
            SandboxError: the sandbox failed (not the compile).
        """
        async with self._slots:
            result = await self.sandbox.run(f"{self.lean_command} Proof.lean", "bash", files={"Proof.lean": program},
                                            timeout_s=self.compile_timeout_s, memory_mb=self.memory_mb)
        status = {"ok": "completed", "timeout": "timeout"}.get(result.status, "failed")
        cut = self.max_output_characters
        return CompilerOutput(status, result.stdout[:cut], result.stderr[:cut])
