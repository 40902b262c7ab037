"""`GatedServer`: a uvicorn server that stops accepting connections while its process is near its open-files limit.

Out of descriptors, uvloop (libuv) drains its listen queue by accepting each waiting connection and closing it at
once. The client has usually written its request by then and sees "Server disconnected", which a POST must not
retry: the request may have been read (reproduced: soft limit 128, 300 POSTs at once, 186 failed on uvloop, 0 on
asyncio's loop, which stops accepting for a second instead). So a `GatedServer` stops accepting first:
when the process's open descriptors reach its soft limit less a reserve (`OPEN_FILES_RESERVE`, at most a quarter of
a small limit) and less one listen burst (uvloop accepts everything queued in one pass, before a pause can take
effect; `BURST_CAP`), it closes its listening server. That server listens on a duplicate of the listening socket, so
the kernel keeps queueing new connections on the original, unread, in the listen backlog. Once the process is below
the pause point less the reserve (checked as its connections close, and every `RESUME_CHECK_S`), it listens again on
a new duplicate and the queued connections are served, late, not lost. Past the backlog the kernel drops new
connection attempts; the client's connect then times out, which is safe to retry (nothing was sent).

Descriptors are counted (`/proc/self/fd`) every `CHECK_EVERY` connections the server accepts once it holds a
quarter of the limit's worth, so a quiet server pays nothing; outbound connections (the server's own HTTP pool)
count, since they use the same descriptors. Where `/proc/self/fd` cannot be read the server accepts as uvicorn does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from gymfleet.connections import OPEN_FILES_RESERVE
from gymfleet.serving.read_pacer import IntakePacer
from gymfleet.serving.write_batch import WriteBatch, batched

log = logging.getLogger(__name__)

CHECK_EVERY = 16
"""Connections accepted between two counts of the open descriptors, once they may matter."""
RESUME_CHECK_S = 1.0
"""While paused, how often the descriptors are counted again (besides when a connection closes)."""


def open_files() -> int | None:
    """Descriptors this process has open, or None where that cannot be read."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def reserve_for(limit: int) -> int:
    """Descriptors kept free below `limit`: `OPEN_FILES_RESERVE`, at most a quarter of a small limit."""
    return max(4, min(OPEN_FILES_RESERVE, limit // 4))


BURST_CAP = 1024
"""At most this many connections are assumed to queue between two accept passes: gymfleet's clients connect
`CONNECTS_AT_ONCE` (256) at a time per process. A margin of the whole backlog (`somaxconn`, 4,096 on the machine
measured) would pause a 20,000-descriptor process at about 15,400, which the busiest agent of 65,536 rollouts at once
reaches (15,437) without running out; its clients' connects would then overflow the backlog instead."""


def listen_burst(backlog: int) -> int:
    """Connections one accept pass may take: the listen backlog, as the kernel caps it (`somaxconn`), at most
    `BURST_CAP`."""
    try:
        with open("/proc/sys/net/core/somaxconn") as cap:
            return min(backlog, int(cap.read()), BURST_CAP)
    except (OSError, ValueError):
        return min(backlog, BURST_CAP)


class AcceptGate:
    """Whether a server may accept more connections, from its process's open descriptors against `limit`, `burst`
    being how many one accept pass may take past the decision (the listen backlog)."""

    def __init__(self, limit: int, burst: int):
        self.reserve = reserve_for(limit)
        self.high = max(limit // 2, limit - self.reserve - burst)
        """At this many open descriptors accepting stops."""
        self.low = self.high - self.reserve
        """Below this many it resumes."""
        self.watch_from = self.high // 2
        self.files = open_files()
        self._since_count = 0
        self.paused = False

    def accepted(self) -> bool:
        """A connection was accepted (its descriptor is open): whether accepting must stop now."""
        if self.files is None or self.paused:
            return False
        self.files += 1
        self._since_count += 1
        if self.files >= self.watch_from and (self._since_count >= CHECK_EVERY or self.files >= self.high):
            self._since_count = 0
            self.files = open_files()
            if self.files is not None and self.files >= self.high:
                self.paused = True
        return self.paused

    def closed(self) -> None:
        if self.files is not None:
            self.files -= 1

    def may_resume(self) -> bool:
        """While paused: whether the process is below the low-water mark now (counted afresh)."""
        self.files = open_files()
        if self.files is None or self.files < self.low:
            self.paused = False
        return not self.paused


class GatedServer(uvicorn.Server):
    """A `uvicorn.Server` that, run on bound sockets (`run(sockets=[...])`), stops accepting connections near its
    process's open-files limit (module docstring). Every connection it serves, gated or not, sends what one pass of
    the event loop writes to it in one write while the server is busy (`gymfleet.serving.write_batch`), and with an
    `intake`, a new connection's first request is read as the server has room for it."""

    gate: AcceptGate | None = None

    def __init__(self, config: uvicorn.Config, intake: IntakePacer | None = None):
        super().__init__(config)
        self.intake = intake
        """Reads a burst's requests as the server has room for them (the server's `intake`, agents only)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if sockets is not None and soft != resource.RLIM_INFINITY and open_files() is not None:
            self.gate = AcceptGate(soft, listen_burst(self.config.backlog))
            self._listening = list(sockets)
            self._resuming: asyncio.Task | None = None
            sockets = [_duplicate(sock) for sock in sockets]
        self._serve_protocols()
        await super().startup(sockets=sockets)

    def _serve_protocols(self) -> None:
        """Wrap the protocol uvicorn builds for each connection: batched writes, the intake, and with a gate, count
        the connections the server accepts and closes and stop listening when the gate says so."""
        base = self.config.http_protocol_class
        gate, server, intake, batch = self.gate, self, self.intake, WriteBatch()

        class Served(base):  # type: ignore[misc, valid-type]
            _first = True

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                super().connection_made(batched(transport, self.server_state, batch))

            def data_received(self, data: bytes) -> None:
                if intake is None or not self._first:
                    super().data_received(data)
                    return
                self._first = False
                intake.first_data(self.transport, self.flow, super().data_received, data)

            def connection_lost(self, exc: Exception | None) -> None:
                super().connection_lost(exc)
                if gate is None:
                    return
                gate.closed()
                if gate.paused:
                    server._resume_soon()

        def make(**kwargs: Any) -> asyncio.Protocol:
            if gate is not None and gate.accepted():  # under uvloop this runs inside its accept loop: stop
                asyncio.get_running_loop().call_soon(server._pause)  # listening once it is done
            return Served(**kwargs)

        self.config.http_protocol_class = make  # uvicorn builds each connection's protocol with it

    def _pause(self) -> None:
        assert self.gate is not None
        log.warning("%s descriptors open (soft limit %d): not accepting new connections until fewer than %d (they "
                    "wait in the listen backlog)", self.gate.files, resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                    self.gate.low)
        for server in self.servers:
            server.close()
        self._resume_soon(RESUME_CHECK_S)

    def _resume_soon(self, delay_s: float = 0.0) -> None:
        if self._resuming is None or self._resuming.done():
            self._resuming = asyncio.get_running_loop().create_task(self._resume(delay_s))

    async def _resume(self, delay_s: float) -> None:
        assert self.gate is not None
        await asyncio.sleep(delay_s)
        while not self.gate.may_resume():
            if self.should_exit:
                return
            await asyncio.sleep(RESUME_CHECK_S)
        if self.should_exit:
            return
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = self._protocol_factory()
        self.servers = [await loop.create_server(factory, sock=_duplicate(sock), backlog=self.config.backlog)
                        for sock in self._listening]
        log.info("accepting connections again (%s descriptors open)", self.gate.files)

    def _protocol_factory(self) -> Callable[[], asyncio.Protocol]:
        """What uvicorn's `startup` builds each connection's protocol with."""
        config, state = self.config, self.server_state

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(config=config, server_state=state, app_state=self.lifespan.state,
                                              _loop=_loop)

        return create_protocol


def _duplicate(sock: socket.socket) -> socket.socket:
    """A new socket object on a duplicate descriptor of `sock` (closing it leaves `sock` listening)."""
    return socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
