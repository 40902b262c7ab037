"""NeMo-Gym 0.7.0's synchronous `nemo_gym.sandbox.Sandbox`: `AsyncSandbox` (`gymfleet.serving.nemo_gym_sandbox`)
for code that cannot await, such as a verifier called from a worker thread or a data-preparation script.

    with Sandbox({"gymfleet": {}}, SandboxSpec(files={"main.py": code})).start() as sandbox:
        result = sandbox.exec("python main.py", timeout_s=10)

Each `Sandbox` owns one event loop on a daemon thread; its methods run the matching `AsyncSandbox` coroutine there
and wait for it (at most `SYNC_OPERATION_TIMEOUT_S`, then `TimeoutError` and the operation is cancelled). Calling one
from inside a running event loop would block that loop, so it raises `RuntimeError` naming `AsyncSandbox` instead.
`pty`, `serialize` and `connect` are async-only, as in NeMo-Gym. Failures are `AsyncSandbox`'s: a command's outcome
is a `SandboxExecResult`, an unreachable or failed sandbox service raises `gymfleet.errors.SandboxError`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import TimeoutError as FutureTimeoutError
from pathlib import Path
from typing import Any, TypeVar

from gymfleet import http
from gymfleet.serving.nemo_gym_sandbox import DEFAULT_EXEC_TIMEOUT_S, AsyncSandbox
from gymfleet.serving.nemo_gym_sandbox_types import SandboxEndpoint, SandboxExecResult, SandboxSpec, SandboxStatus

log = logging.getLogger(__name__)

T = TypeVar("T")
SYNC_OPERATION_TIMEOUT_S = 3600.0
"""The longest a blocking call waits for its coroutine (NeMo-Gym's bound)."""
LOOP_CLOSE_TIMEOUT_S = 5.0


class _LoopThread:
    """One event loop running on a daemon thread; `run(name, make)` awaits `make()` there from a blocking caller."""

    def __init__(self, wait_s: float = SYNC_OPERATION_TIMEOUT_S):
        self.wait_s = wait_s
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self.thread = threading.Thread(target=self.loop.run_forever, name="gymfleet-nemo-gym-sandbox", daemon=True)
        self.thread.start()

    def run(self, operation: str, make: Callable[[], Awaitable[T]]) -> T:
        if self.closed:
            raise RuntimeError(f"Sandbox.{operation}(): the sandbox was stopped (its event loop is closed)")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(f"Sandbox.{operation}() blocks; in async code use AsyncSandbox (await "
                               f"sandbox.{operation}(...)) instead")

        async def call() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self.loop)
        try:
            return future.result(timeout=self.wait_s)
        except FutureTimeoutError as exc:
            future.cancel()
            raise TimeoutError(f"Sandbox.{operation}() did not finish within {self.wait_s:g}s") from exc

    def close(self) -> None:
        if self.closed:
            return
        try:  # this loop's pooled HTTP session (gymfleet.http keeps one per loop)
            asyncio.run_coroutine_threadsafe(http.close(), self.loop).result(timeout=LOOP_CLOSE_TIMEOUT_S)
        except (FutureTimeoutError, RuntimeError) as exc:
            log.warning("sandbox sync loop: closing its HTTP session failed: %s", exc)
        self.closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=LOOP_CLOSE_TIMEOUT_S)
        if not self.thread.is_alive():
            self.loop.close()


class Sandbox:
    """The blocking face of `AsyncSandbox` (module docstring): start / exec / upload / download / status / endpoint /
    pause / resume / stop, and a context manager that stops it."""

    def __init__(self, provider: Mapping[str, Any] | Any, spec: SandboxSpec | None = None):
        self._runner = _LoopThread()

        async def make() -> AsyncSandbox:  # built on its loop: a provider may bind loop-bound state
            return AsyncSandbox(provider, spec)

        try:
            self._sandbox = self._runner.run("__init__", make)
        except BaseException:
            self._runner.close()
            raise
        self._stopped = False

    def start(self, spec: SandboxSpec | None = None) -> Sandbox:
        self._runner.run("start", lambda: self._sandbox.start(spec))
        return self

    def exec(self, command: str, *, cwd: str | None = None, env: dict[str, str] | None = None,
             timeout_s: float | None = DEFAULT_EXEC_TIMEOUT_S, user: str | int | None = None,
             preserve_background_services: bool = False) -> SandboxExecResult:
        return self._runner.run("exec", lambda: self._sandbox.exec(
            command, cwd=cwd, env=env, timeout_s=timeout_s, user=user,
            preserve_background_services=preserve_background_services))

    def upload(self, local_path: Path | str, remote_path: str) -> None:
        self._runner.run("upload", lambda: self._sandbox.upload(local_path, remote_path))

    def download(self, remote_path: str, local_path: Path | str) -> None:
        self._runner.run("download", lambda: self._sandbox.download(remote_path, local_path))

    def status(self) -> SandboxStatus:
        return SandboxStatus.STOPPED if self._stopped else self._runner.run("status", self._sandbox.status)

    def endpoint(self, port: int) -> SandboxEndpoint:
        return self._runner.run("endpoint", lambda: self._sandbox.endpoint(port))

    def pause(self) -> None:
        self._runner.run("pause", self._sandbox.pause)

    def resume(self) -> None:
        self._runner.run("resume", self._sandbox.resume)

    def stop(self) -> None:
        """Stop the sandbox and close its loop (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._runner.run("stop", self._sandbox.stop)
        finally:
            self._runner.close()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
