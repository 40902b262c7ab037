"""The client every environment uses to run code in the sandbox service (`sandbox/`).

    client = SandboxClient("sandbox", config=self.client)           # by instance name, or SandboxClient(url=...)
    result = await client.run("print(input())", "python", stdin="hi", timeout_s=10, memory_mb=1024)
    result.status  # "ok" | "failed" | "timeout" | "oom" | "killed"

`run_batch` runs one program on many inputs in one sandbox; `session()` opens a persistent sandbox whose Python
state survives between `exec` calls. Any of them can start from a repository snapshot: `archive=tar_directory(path)`
(or any tar archive's bytes) is unpacked into the workspace before `files` are written. Calls go through
`gymfleet.http`: an overloaded sandbox's 429 is retried, honouring `Retry-After`, a bounded number of times.

A sandbox placed as several replicas (Ray placement, `num_replicas`; `gymfleet.fleet.ray_placement`) is resolved by
instance name per rollout (`gymfleet.http.ServerClient`): rollouts spread over the replicas, and a session stays on
the replica that created it (its kernel and workspace live there) for all its `exec` calls and its deletion.

Failure boundary (ARCHITECTURE decision 4): whatever the *program* does is a `RunResult` (a crash, a timeout, a
memory bomb are statuses). Whatever goes wrong with the *sandbox* - unreachable, no answer in time, a 5xx, still
overloaded after the retries, an answer that is not a result, a run whose sandbox the host killed (status
`sandbox_failed`) - raises `SandboxError`, which a resources server turns into a `sandbox_failed` row instead of a
reward of 0.
"""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gymfleet import http
from gymfleet.errors import SandboxError, ServerRefError, TransportError

__all__ = ["RunResult", "SandboxClient", "SandboxError", "SandboxSession", "SessionGoneError", "tar_directory"]

Status = Literal["ok", "failed", "timeout", "oom", "killed", "sandbox_failed"]
SANDBOX_RETRY = http.RetryPolicy(max_attempts=6, backoff_s=0.2, max_backoff_s=30.0)
"""Overload (429) and gateway errors are retried 5 times, waiting what `Retry-After` says (at most 30 s each);
failures to connect too, with jittered exponential backoff from 0.2 s (a restarting sandbox is waited for a few
seconds, a dead one is reported soon). A run whose connection drops after it was sent is not retried: it may have
run (the policy is not `idempotent`)."""


class SessionGoneError(SandboxError):
    """The session no longer exists (deleted, expired after idling, or ended by its program)."""


class RunResult(BaseModel):
    """What one program run (one case) did: the sandbox service's answer, and what this client returns."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    status: Status
    """`ok` (exit 0), `failed` (non-zero exit, exception, crash), `timeout`, `oom` or `killed`; the service's
    `sandbox_failed` (the host killed the sandbox) is raised as `SandboxError` by this client, never returned."""
    stdout: str
    """Standard output (decoded as UTF-8, invalid bytes replaced), possibly truncated."""
    stderr: str
    """Standard error, likewise."""
    return_code: int | None
    """Exit status; minus the signal number when a signal ended it; null on timeout."""
    duration_s: float
    """Time the program ran inside the sandbox."""
    truncated: bool = False
    """Stdout or stderr was cut at the output limit."""
    stdout_truncated: bool = False
    """Stdout was (`truncated` with this false: only stderr was), so what it shows is not all the program printed."""
    message: str | None = None
    """Why, in words, when the status is not `ok`."""

    @property
    def ok(self) -> bool:
        """Whether the program exited 0 within its limits."""
        return self.status == "ok"


class SandboxClient:
    """Runs code in a sandbox server, found by instance name in the fleet config or by URL.

    Args:
        server: Instance name of the sandbox in the global config (ignored when `url` is given).
        url: Base URL of a sandbox server (`http://host:port`).
        config: The global config dict, or a `gymfleet.http.ServerClient` (a server's `self.client`).
        queue_timeout_s: How long a request may wait in the sandbox's queue, on top of its own run time.
        retry: Retry policy for overload (429) and gateway errors.
    """

    def __init__(
        self,
        server: str = "sandbox",
        *,
        url: str | None = None,
        config: dict[str, Any] | http.ServerClient | None = None,
        queue_timeout_s: float = 600.0,
        retry: http.RetryPolicy = SANDBOX_RETRY,
    ):
        self.server = server
        self._url = url.rstrip("/") if url else None
        self._servers = config if isinstance(config, http.ServerClient) else http.ServerClient(config or {})
        self.queue_timeout_s = queue_timeout_s
        self.retry = retry

    @property
    def url(self) -> str:
        """The sandbox's base URL (with replicas: the one this rollout uses).

        Raises:
            SandboxError: the instance name is not in the config (say `sandbox_url`, or add a sandbox instance).
        """
        if self._url is not None:
            return self._url
        try:
            return self._servers.url_of(self.server)
        except ServerRefError as exc:
            raise SandboxError(f"no sandbox to run code in: {exc}") from exc

    async def run(
        self,
        code: str,
        language: str = "python",
        *,
        stdin: str | None = None,
        args: list[str] | None = None,
        files: dict[str, str] | None = None,
        archive: bytes | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_bytes: int | None = None,
    ) -> RunResult:
        """Run `code` once (`archive`: a tar archive unpacked into the workspace first, see `tar_directory`).

        Raises:
            SandboxError: the sandbox failed (not the program).
        """
        body = {"language": language, "code": code, "stdin": stdin, "args": args or [], "files": files or {},
                "archive": _b64(archive), "timeout_s": timeout_s, "memory_mb": memory_mb,
                "max_output_bytes": max_output_bytes}
        return _result(await self._post("/run", body, _wall_s(timeout_s) + 30))

    async def run_batch(
        self,
        code: str,
        cases: list[dict[str, Any]],
        language: str = "python",
        *,
        files: dict[str, str] | None = None,
        archive: bytes | None = None,
        prelude: str | None = None,
        stop_on_failure: bool = False,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        max_output_bytes: int | None = None,
    ) -> list[RunResult]:
        """Run `code` once per case (`{"stdin": ..., "args": [...]}`) in one sandbox, each case in a fresh process.

        Returns:
            One result per case run: fewer than the cases when `stop_on_failure` stopped at a non-`ok` one.

        Raises:
            SandboxError: the sandbox failed (not the program).
        """
        body = {"language": language, "code": code, "cases": cases, "files": files or {}, "archive": _b64(archive),
                "prelude": prelude,
                "stop_on_failure": stop_on_failure, "timeout_s": timeout_s, "memory_mb": memory_mb,
                "max_output_bytes": max_output_bytes}
        base = self.url
        answer = await self._post("/run_batch", body, len(cases) * (_wall_s(timeout_s) + 3) + 30, base=base)
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or not 0 < len(results) <= len(cases):
            raise SandboxError(f"malformed answer from the sandbox at {base}/run_batch: {str(answer)[:300]}")
        return [_result(item) for item in results]

    async def session(
        self,
        *,
        files: dict[str, str] | None = None,
        archive: bytes | None = None,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ) -> SandboxSession:
        """Open a persistent session (use it as `async with await client.session() as session:`), its workspace
        seeded with `files` and/or a repository snapshot (`archive`, see `tar_directory`).

        Raises:
            SandboxError: the sandbox failed, or refused the seed (a bad archive).
        """
        body = {"files": files or {}, "archive": _b64(archive), "timeout_s": timeout_s, "memory_mb": memory_mb}
        base = self.url
        answer = await self._post("/sessions", body, 60, base=base)
        if not isinstance(answer, dict) or not isinstance(answer.get("session_id"), str):
            raise SandboxError(f"malformed answer from the sandbox at {base}/sessions: {str(answer)[:300]}")
        return SandboxSession(self, answer["session_id"], timeout_s, base=base)

    async def _post(self, path: str, body: dict[str, Any], run_time_s: float, base: str | None = None) -> Any:
        base = base or self.url
        url = base + path
        try:
            response = await http.request("POST", url, json=body, timeout_s=run_time_s + self.queue_timeout_s,
                                          retry=self.retry)
        except TransportError as exc:
            if exc.failure_class == "connection_error" and self._url is None:
                self._servers.replica_failed(self.server, base)
            raise SandboxError(f"sandbox call failed: {exc}") from exc
        if response.status == 404 and "/sessions/" in path:
            raise SessionGoneError(f"sandbox session gone: {response.text[:300]}")
        if not response.ok:
            raise SandboxError(f"sandbox answered HTTP {response.status} for {url}: {response.text[:500]}")
        try:
            return response.json()
        except ValueError as exc:
            raise SandboxError(f"sandbox answered non-JSON for {url}: {response.text[:300]!r}") from exc


class SandboxSession:
    """A persistent sandbox: Python variables and workspace files survive between `exec` calls."""

    def __init__(self, client: SandboxClient, session_id: str, timeout_s: float, base: str | None = None):
        self.client = client
        self.id = session_id
        self.timeout_s = timeout_s
        self.base = base or client.url
        """The sandbox replica that holds this session: every call of the session goes there."""

    async def exec(
        self, code: str, language: str = "python", *, stdin: str | None = None, timeout_s: float | None = None
    ) -> RunResult:
        """Run a Python chunk in the session's namespace, or a bash command in its workspace.

        Raises:
            SessionGoneError: the session no longer exists.
            SandboxError: the sandbox failed.
        """
        limit = timeout_s or self.timeout_s
        body = {"code": code, "language": language, "stdin": stdin, "timeout_s": limit}
        return _result(await self.client._post(f"/sessions/{self.id}/exec", body, _wall_s(limit) + 30,
                                               base=self.base))

    async def close(self) -> None:
        """Delete the session (a session that is already gone is fine)."""
        try:
            await http.request("DELETE", f"{self.base}/sessions/{self.id}", timeout_s=30)
        except TransportError as exc:
            raise SandboxError(f"could not delete sandbox session {self.id}: {exc}") from exc

    async def __aenter__(self) -> SandboxSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def tar_directory(path: str | Path, *, exclude: tuple[str, ...] = (".git",)) -> bytes:
    """A gzipped tar of the folder at `path` (its contents at the archive's root), for `archive=`: a repository
    snapshot. Entries whose name is in `exclude` are left out at any depth; ownership is not kept.

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     _ = (Path(folder) / "a.py").write_text("x = 1")
        ...     (Path(folder) / ".git").mkdir()
        ...     names = tarfile.open(fileobj=io.BytesIO(tar_directory(folder))).getnames()
        >>> names
        ['a.py']
    """
    root = Path(path)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if exclude and set(Path(info.name).parts) & set(exclude):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for child in sorted(root.iterdir()):
            tar.add(child, arcname=child.name, filter=keep)
    return buffer.getvalue()


def _wall_s(timeout_s: float) -> float:
    """The wall-clock time a run may take: `timeout_s` is CPU time, and a sandbox allows `wall_time_factor` (2 by
    default) times that in wall-clock time; this client allows up to 4 times."""
    return 4 * timeout_s


def _b64(archive: bytes | None) -> str | None:
    return base64.b64encode(archive).decode() if archive else None


def _result(answer: Any) -> RunResult:
    try:
        result = RunResult.model_validate(answer)
    except ValidationError as exc:
        raise SandboxError(f"malformed run result from the sandbox: {exc}: {str(answer)[:300]}") from exc
    if result.status == "sandbox_failed":  # the host killed the sandbox: infrastructure, not the program
        raise SandboxError(f"the sandbox failed: {result.message}")
    return result
