"""Fault injectors for the fault-injection suite (`tests/test_fault_injection.py`) and soak (`bench/fault_soak.py`).

- `CuttingProxy`: a TCP proxy in front of a real server that forwards every byte both ways, except that the answer
  to a request whose path matches `cut_path` is cut: after its first `head_bytes` bytes (partial status line or
  headers), or `body_bytes` bytes into its body, both connections are closed. It counts requests by path, so a test
  can tell whether a POST was sent twice.
- `StalledServer`: accepts connections and reads whatever comes, and never answers (a hung judge or sandbox).
- `Outputs`: the rollouts and failure rows a collection wrote, and the checks every fault must pass.
- `wait_for`: poll until a restart (or any other slow event) happened, bounded by `WAIT_S`.

Everything here is plain sockets and threads: the faults must not depend on the code under test.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gymfleet.testing import wait_until

KNOWN_FAILURE_CLASSES = frozenset({
    "connection_error",  # a hop could not connect, or its connection dropped (not retried when it may have run)
    "timeout",  # a hop's deadline passed
    "upstream_error",  # the model's upstream answered an error
    "http_5xx",  # a non-gymfleet 5xx on the collector's hop
    "transport_failed",  # an environment's inner call failed inside /verify
    "judge_failed",
    "sandbox_failed",
    "verify_timeout",
})
"""Failure classes a fault may produce. Not in it, on purpose: `server_error` (an unhandled exception: a bug),
`http_4xx` (the fleet blaming the row), `bad_response`."""

REQUEST_LINE = re.compile(rb"(?:^|\r\n)(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (\S+) HTTP/1\.[01]\r\n")


class _Listener:
    """A TCP listener on `url` (127.0.0.1, a free port) accepting in a daemon thread until `close()`: each
    connection goes to `_take`."""

    def __init__(self, name: str, backlog: int) -> None:
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(backlog)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=name, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for sock in self._sockets():
            _close(sock)

    def _sockets(self) -> list[socket.socket]:
        """The connections `close()` closes too."""
        return []

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._take(sock)

    def _take(self, sock: socket.socket) -> None:
        """Handle one accepted connection (in the accepting thread: hand long work to a thread of its own)."""
        raise NotImplementedError


class CuttingProxy(_Listener):
    """`http://127.0.0.1:<port>` forwarding to `target`; cuts the answers to requests whose path contains `cut_path`.

    Args:
        target: `(host, port)` of the real server.
        cut_path: a path (or part of one, e.g. `b"/verify"`); None cuts nothing.
        head_bytes: cut after this many bytes of the answer (10: inside the status line).
        body_bytes: if set instead, cut this many bytes after the end of the answer's headers.
    """

    def __init__(self, target: tuple[str, int], cut_path: bytes | None, *, head_bytes: int | None = 10,
                 body_bytes: int | None = None):
        self.target = target
        self.cut_path = cut_path
        self.head_bytes = None if body_bytes is not None else head_bytes
        self.body_bytes = body_bytes
        self.requests: Counter[str] = Counter()
        """Requests seen, by path (query string included)."""
        self.cuts = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        super().__init__("cutting-proxy", 128)

    def _sockets(self) -> list[socket.socket]:
        with self._lock:
            return list(self._open)

    def _take(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            _close(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        armed = threading.Event()  # the request now on this connection is one whose answer is cut
        threading.Thread(target=self._requests, args=(client, upstream, armed), daemon=True).start()
        threading.Thread(target=self._answers, args=(upstream, client, armed), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, armed: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                for path in REQUEST_LINE.findall(chunk):
                    with self._lock:
                        self.requests[path.decode("latin-1")] += 1
                    if self.cut_path is not None and self.cut_path in path:
                        armed.set()
                upstream.sendall(chunk)
        self._drop(client, upstream)

    def _answers(self, upstream: socket.socket, client: socket.socket, armed: threading.Event) -> None:
        sent = 0
        seen = b""
        with contextlib.suppress(OSError):
            while chunk := upstream.recv(65536):
                if not armed.is_set():
                    client.sendall(chunk)
                    continue
                seen += chunk
                limit = self._limit(seen)
                if limit is None or len(seen) < limit:
                    client.sendall(chunk)
                    sent = len(seen)
                    continue
                client.sendall(seen[sent:limit])
                with self._lock:
                    self.cuts += 1
                break
        self._drop(client, upstream)

    def _limit(self, seen: bytes) -> int | None:
        """Bytes of the answer to let through, once known."""
        if self.head_bytes is not None:
            return self.head_bytes
        end = seen.find(b"\r\n\r\n")
        return None if end < 0 else end + 4 + (self.body_bytes or 0)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                self._open.discard(sock)
                _close(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class StalledServer(_Listener):
    """Accepts TCP connections on `url`, reads what comes, never answers (until `close()`)."""

    def __init__(self) -> None:
        self.connections = 0
        self._held: list[socket.socket] = []
        super().__init__("stalled-server", 1024)

    def _sockets(self) -> list[socket.socket]:
        return self._held

    def _take(self, sock: socket.socket) -> None:
        self.connections += 1
        self._held.append(sock)
        threading.Thread(target=_drain, args=(sock,), daemon=True).start()


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while sock.recv(65536):
            pass


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of `path` as JSON (a line that does not parse fails the test: outputs must never be corrupt)."""
    if not path.exists():
        return []
    rows = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise AssertionError(f"{path}:{lineno} is not JSON ({exc}): {line[:200]!r}") from None
    return rows


def key(row: dict[str, Any]) -> tuple[Any, Any]:
    return row["_ng_task_index"], row["_ng_rollout_index"]


@dataclass
class Outputs:
    """What a collection into `output` wrote: results and failure rows (superseded ones included)."""

    results: list[dict[str, Any]]
    failures: list[dict[str, Any]]

    @classmethod
    def of(cls, output: Path) -> Outputs:
        return cls(read_jsonl(output), read_jsonl(output.with_name(output.stem + "_failures.jsonl")))

    def open_failures(self) -> list[dict[str, Any]]:
        """Failure rows not superseded by a later result."""
        return [row for row in self.failures if not row.get("_ng_superseded")]

    def check_nothing_lost(self, expected: set[tuple[Any, Any]], not_sent: int = 0) -> None:
        """Every expected rollout is in exactly one place: a result, an open failure row, or (at most `not_sent`
        of them) left unsent by a collection that stopped; no result is there twice; every failure is typed."""
        done = Counter(key(row) for row in self.results)
        assert not [k for k, n in done.items() if n > 1], f"rollouts with two results: {done.most_common(3)}"
        failed = {key(row) for row in self.open_failures()}
        assert not failed & set(done), f"rollouts both done and failed: {sorted(failed & set(done))[:5]}"
        assert set(done) | failed <= expected, "rollouts nobody asked for"
        assert len(expected - set(done) - failed) == not_sent, (
            f"{len(expected - set(done) - failed)} rollouts neither done nor failed, {not_sent} reported not sent")
        classes = Counter(row.get("_ng_failure_class") for row in self.failures)
        assert set(classes) <= KNOWN_FAILURE_CLASSES, f"untyped or unexpected failures: {classes}"
        assert all(not row.get("_ng_failure_class") for row in self.results), "a failure row among the results"

    def check_complete(self, expected: set[tuple[Any, Any]]) -> None:
        """Every expected rollout has exactly one result, and every failure row is superseded."""
        assert sorted(key(row) for row in self.results) == sorted(expected), "each rollout exactly once"
        assert not self.open_failures(), f"failure rows not superseded: {self.open_failures()[:2]}"


WAIT_S = 120
"""How long a test waits for something that takes seconds (a bound against hanging, not a timing assertion)."""


def wait_for(condition: Callable[[], Any], what: str) -> Any:
    """Poll `condition` until it returns something truthy (returned); fail naming `what` if it never does."""
    return wait_until(condition, what, timeout_s=WAIT_S, interval_s=0.1)
