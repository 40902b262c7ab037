"""`BatchedWrites`: while a server is busy, what one pass of its event loop writes to a connection leaves in one send.

uvicorn writes a response as the app produces it: the status line and headers in one `transport.write`, the body in
another, and the event loop's transport sends each at once, a system call apiece. While other requests are in
progress in the process, a `BatchedWrites` transport holds what its connection is written in the current pass of the
event loop, in its server's `WriteBatch`, and hands it to the real transport in one `write` when the batch is sent:
at the start of the next pass, or as soon as `BATCH_SIZE` connections hold writes. Headers and body then leave in one
segment, and the peers' next requests arrive while the server is still working through its pass, so its next poll
finds them ready together instead of waking for each. With at most one request in progress (a lone client, one
request at a time) every write goes out at once, as before: holding it would add a pass of the event loop to each
request's round trip and batch nothing.

Measured with `wrk` on one core against mcqa's `/verify` served on the other (`bench/verify_throughput.py --wrk`,
beside the tree before): CPU per request 165 -> 139 µs at 16 in flight and 207 -> 151 µs at 256 (system CPU 32-44
-> 10-13 µs of it), the same with one in flight; mcqa / bare FastAPI 0.79 -> 1.00 and 0.74 -> 1.00 in requests/s.
`GatedServer` (`gymfleet.serving.accept_gate`) gives every connection of every fleet server one.

Order is kept (a write while some are held joins them), `close` and `write_eof` send what is held first, `abort`
drops it, and a connection that closed before its batch was sent gets nothing more. Everything else is the real
transport's (flow control included: what is held counts towards `get_write_buffer_size`, and the real transport
pauses the protocol's writing once the batch is handed over, as it would have for the separate writes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

BATCH_SIZE = 32
"""Connections whose writes one batch holds at most: when one more would start holding, the batch is sent at once.
Past a pass of a few dozen requests, holding every answer to the end of the pass leaves the peers nothing to do
until it ends, and the server then idles while they catch up. mcqa's `/verify` under `wrk`, 5 alternating rounds
(`bench/verify_throughput.py --wrk` servers, each let go idle after its round), requests/s at 256 / 4,096 in
flight: 8 per batch 5,925 / 5,123, 32 5,872 / 5,403, no bound 6,385 / 4,895 (bare FastAPI 5,169 / 4,444)."""


class WriteBatch:
    """The connections of one server whose writes are held in the current pass of its event loop: sent together at
    the start of the next pass (one `loop.call_soon` per batch), or at once when `BATCH_SIZE` are held."""

    __slots__ = ("_held", "_scheduled", "size")

    def __init__(self, size: int = BATCH_SIZE) -> None:
        self.size = size
        self._held: list[BatchedWrites] = []
        self._scheduled = False

    def hold(self, transport: BatchedWrites) -> None:
        if len(self._held) >= self.size:
            self.send()
        self._held.append(transport)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_pass)

    def _next_pass(self) -> None:
        self._scheduled = False
        self.send()

    def send(self) -> None:
        held, self._held = self._held, []
        for transport in held:
            try:
                transport.send_held()
            except Exception:  # one connection's broken transport must not keep the others' answers back
                log.exception("sending a connection's held writes failed; the other connections' go on")


class BatchedWrites:
    """A transport that, while `busy()`, holds its writes in `batch` until the batch is sent, then writes them as
    one."""

    __slots__ = ("_transport", "_busy", "_held", "_batch")

    def __init__(self, transport: asyncio.WriteTransport, busy: Callable[[], bool], batch: WriteBatch) -> None:
        self._transport = transport
        self._busy = busy
        self._batch = batch
        self._held: list[bytes] | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            self._held.append(data if isinstance(data, bytes) else bytes(data))  # the caller may reuse its buffer
            return
        if not self._busy():
            self._transport.write(data)
            return
        self._held = [data if isinstance(data, bytes) else bytes(data)]
        self._batch.hold(self)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def send_held(self) -> None:
        """Write what is held, as one write (nothing if the connection closed meanwhile)."""
        held, self._held = self._held, None
        if not held or self._transport.is_closing():  # sent already by close(), or nobody left to read it
            return
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.send_held()
        self._transport.close()

    def write_eof(self) -> None:
        self.send_held()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._held or ()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def batched(transport: asyncio.BaseTransport, server_state: Any, batch: WriteBatch) -> asyncio.BaseTransport:
    """`transport` wrapped in a `BatchedWrites` that holds writes in `batch` while more than one request of the
    server whose uvicorn `ServerState` is `server_state` is in progress; `transport` itself where that cannot be
    told."""
    tasks = getattr(server_state, "tasks", None)
    if not isinstance(tasks, set) or not hasattr(transport, "write"):
        return transport
    return BatchedWrites(transport, lambda: len(tasks) > 1, batch)  # type: ignore[arg-type]
