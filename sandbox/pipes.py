"""Non-blocking pipes driven by the event loop (`add_reader`/`add_writer`), the same under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import os


class ProtocolError(Exception):
    """The launcher's output channel carried something that is not a result (the program tampered with it)."""


class PipeReader:
    """Reads a non-blocking pipe into a buffer as data arrives.

    Past `max_buffer` bytes it either keeps the head and drops the rest (`keep_head`; `truncated` says so), or marks
    the channel as overflowed, which the next read raises as `ProtocolError`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, *, max_buffer: int, keep_head: bool = False):
        self.loop, self.fd = loop, fd
        self.buffer = bytearray()
        self.max_buffer = max_buffer
        self.keep_head = keep_head
        self.eof = self.closed = self.overflow = self.truncated = False
        self._waiter: asyncio.Future | None = None
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            data = os.read(self.fd, 1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.eof = True
            self.loop.remove_reader(self.fd)
        elif len(self.buffer) + len(data) <= self.max_buffer:
            self.buffer += data
        elif self.keep_head:
            self.buffer += data[: self.max_buffer - len(self.buffer)]
            self.truncated = True
        else:
            self.overflow = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        if self.overflow:
            raise ProtocolError("the launcher channel overflowed")
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def readline(self, max_bytes: int) -> bytes | None:
        while True:
            end = self.buffer.find(b"\n", 0, max_bytes + 1)
            if end >= 0:
                line = bytes(self.buffer[: end + 1])
                del self.buffer[: end + 1]
                return line
            if len(self.buffer) > max_bytes:
                raise ProtocolError(f"no line within {max_bytes} bytes: {bytes(self.buffer[:80])!r}")
            if self.eof:
                return None
            await self._wait()

    async def read(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            if self.eof:
                return None
            await self._wait()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def wait_eof(self, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while not self.eof and not self.closed:
                    await self._wait()
        except (TimeoutError, ProtocolError):
            pass

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if not self.eof:
                self.loop.remove_reader(self.fd)
            os.close(self.fd)


class PipeWriter:
    """Writes to a non-blocking pipe, queueing what the pipe cannot take yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self.loop, self.fd = loop, fd
        self.pending = bytearray()
        self.closed = False
        os.set_blocking(fd, False)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.pending:
            self.pending += data
            return
        written = self._try_write(data)
        if written is not None and written < len(data):
            self.pending += data[written:]
            self.loop.add_writer(self.fd, self._on_writable)

    def _try_write(self, data: bytes | bytearray) -> int | None:
        try:
            return os.write(self.fd, data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # the sandbox is gone; its result (or absence) tells the story
            self.close()
            return None

    def _on_writable(self) -> None:
        written = self._try_write(self.pending)
        if written is None:
            return
        del self.pending[:written]
        if not self.pending:
            self.loop.remove_writer(self.fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.pending:
                self.loop.remove_writer(self.fd)
                self.pending.clear()
            os.close(self.fd)
