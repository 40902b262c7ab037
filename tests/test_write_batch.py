"""While a server is busy, what one event-loop pass writes to a connection leaves in one write
(`gymfleet.serving.write_batch`), and every byte still arrives, in order, exactly once.

A stand-in transport records the writes the real one would get; then real servers (`gymfleet.testing.serve`, as a
fleet serves them) answer bursts of concurrent requests of every size and shape through real HTTP."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest
from fastapi import FastAPI, Request
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response, StreamingResponse

from gymfleet.serving import write_batch
from gymfleet.serving.write_batch import BATCH_SIZE, BatchedWrites, WriteBatch, batched
from gymfleet.testing import serve


class _Recorder:
    """What a transport was asked to do, in order."""

    def __init__(self):
        self.calls: list[tuple[str, bytes | None]] = []
        self.closing = False

    def write(self, data):
        assert not self.closing, "written after close"
        self.calls.append(("write", bytes(data)))

    def close(self):
        self.calls.append(("close", None))
        self.closing = True

    def write_eof(self):
        self.calls.append(("write_eof", None))

    def abort(self):
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self):
        return self.closing

    def get_write_buffer_size(self):
        return 7

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 1)}.get(name, default)

    def written(self) -> list[bytes]:
        return [data for call, data in self.calls if call == "write"]


async def _next_pass():
    await asyncio.sleep(0)


async def test_a_quiet_server_writes_at_once():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: False, WriteBatch())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert real.written() == [b"HTTP/1.1 200 OK\r\n\r\n", b"body"]


async def test_a_busy_server_sends_one_pass_of_writes_in_one_write_in_order():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    transport.write(b"head ")
    transport.writelines([b"bo", bytearray(b"dy "), memoryview(b"tail")])
    assert real.calls == []
    assert transport.get_write_buffer_size() == 7 + len(b"head body tail")
    await _next_pass()
    assert real.written() == [b"head body tail"]
    transport.write(b"next")  # a later pass is a batch of its own
    await _next_pass()
    assert real.written() == [b"head body tail", b"next"]


async def test_a_write_while_some_are_held_joins_them_even_once_the_server_is_quiet():
    busy = [True]
    real = _Recorder()
    transport = BatchedWrites(real, lambda: busy[0], WriteBatch())
    transport.write(b"a")
    busy[0] = False
    transport.write(b"b")  # going out at once would overtake "a"
    assert real.calls == []
    await _next_pass()
    assert real.written() == [b"ab"]


async def test_a_buffer_the_caller_reuses_is_sent_as_it_was_written():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    buffer = bytearray(b"first")
    transport.write(buffer)
    buffer[:] = b"later"
    await _next_pass()
    assert real.written() == [b"first"]


@pytest.mark.parametrize("ending", ["close", "write_eof"])
async def test_closing_sends_what_is_held_first_and_only_once(ending):
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    transport.write(b"last words")
    getattr(transport, ending)()
    await _next_pass()
    assert real.calls == [("write", b"last words"), (ending, None)]


async def test_abort_drops_what_is_held():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    transport.write(b"never sent")
    transport.abort()
    await _next_pass()
    assert real.calls == [("abort", None)]


async def test_a_connection_closed_before_the_pass_ends_gets_nothing_more():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    transport.write(b"too late")
    real.closing = True  # the peer went away (uvicorn's connection_lost)
    await _next_pass()
    assert real.written() == []


async def test_everything_else_is_the_real_transports():
    real = _Recorder()
    transport = BatchedWrites(real, lambda: True, WriteBatch())
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)
    assert transport.is_closing() is False


async def test_only_a_server_state_with_a_task_set_gets_batched_writes():
    real = _Recorder()

    class State:
        tasks: set = set()

    assert isinstance(batched(real, State(), WriteBatch()), BatchedWrites)
    assert batched(real, object(), WriteBatch()) is real
    assert batched(real, None, WriteBatch()) is real


async def test_a_full_batch_is_sent_at_once_and_each_connection_still_gets_one_write():
    batch = WriteBatch(size=3)
    reals = [_Recorder() for _ in range(7)]
    transports = [BatchedWrites(real, lambda: True, batch) for real in reals]
    for index, transport in enumerate(transports):
        transport.write(b"head%d " % index)
        transport.write(b"body%d" % index)
    # The 4th and 7th connections to hold found the batch full: the three before each were sent then.
    assert [len(real.written()) for real in reals] == [1, 1, 1, 1, 1, 1, 0]
    await _next_pass()
    assert [real.written() for real in reals] == [[b"head%d body%d" % (index, index)] for index in range(7)]


async def test_one_broken_transport_does_not_keep_the_others_answers_back(caplog):
    class Broken(_Recorder):
        def write(self, data):
            raise RuntimeError("Cannot call write() after write_eof()")

    batch = WriteBatch()
    reals = [_Recorder(), Broken(), _Recorder()]
    for real in reals:
        BatchedWrites(real, lambda: True, batch).write(b"answer")
    await _next_pass()
    assert [real.written() for real in reals] == [[b"answer"], [], [b"answer"]]
    assert "sending a connection's held writes failed" in caplog.text


async def test_a_batch_asks_the_event_loop_once_per_pass(monkeypatch):
    loop = asyncio.get_running_loop()
    scheduled = []
    original = loop.call_soon
    batch = WriteBatch(size=BATCH_SIZE)
    monkeypatch.setattr(loop, "call_soon", lambda callback, *args, **kwargs: (
        getattr(callback, "__self__", None) is batch and scheduled.append(callback),
        original(callback, *args, **kwargs))[1])
    for _ in range(10):
        BatchedWrites(_Recorder(), lambda: True, batch).write(b"x")
    assert len(scheduled) == 1
    await _next_pass()
    BatchedWrites(_Recorder(), lambda: True, batch).write(b"y")
    assert len(scheduled) == 2


_OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.binary(max_size=40)),
    st.tuples(st.just("busy"), st.booleans()),
    st.tuples(st.just("pass"), st.none()),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(_OPS, st.sampled_from(["close", "write_eof", None]))
def test_any_sequence_of_writes_arrives_whole_in_order_and_at_most_once_per_busy_pass(ops, ending):
    async def run():
        busy = [False]
        real = _Recorder()
        transport = BatchedWrites(real, lambda: busy[0], WriteBatch())
        sent = b""
        writes_per_pass, held_in_pass = [], False
        for op, value in ops:
            if op == "write":
                transport.write(value)
                sent += value
                held_in_pass = held_in_pass or busy[0]
            elif op == "busy":
                busy[0] = value
            else:
                before = len(real.written())
                await _next_pass()
                writes_per_pass.append((held_in_pass, len(real.written()) - before))
                held_in_pass = False
        if ending:
            getattr(transport, ending)()
        await _next_pass()
        assert b"".join(real.written()) == sent
        assert all(count <= 1 for held, count in writes_per_pass if held)
        if ending:
            assert real.calls[-1] == (ending, None)

    asyncio.run(run())


# ------------------------------------------------------------------------------------------------ a real server


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        body = await request.body()
        await asyncio.sleep(random.random() / 100)  # answers interleave across connections and passes
        return Response(body, media_type="application/octet-stream")

    @app.api_route("/sized/{size}", methods=["GET", "HEAD"])
    async def sized(size: int) -> Response:
        return Response(_payload(size), media_type="application/octet-stream")

    @app.get("/stream/{parts}")
    async def stream(parts: int) -> StreamingResponse:
        async def chunks():
            for index in range(parts):
                yield f"part {index};".encode()
                if index % 2:
                    await asyncio.sleep(0)

        return StreamingResponse(chunks(), media_type="text/plain")

    return app


def _payload(size: int) -> bytes:
    return bytes(index % 251 for index in range(size))


@pytest.fixture
def counted_sends(monkeypatch):
    """How many held batches the servers of this test sent."""
    sends = [0]
    original = BatchedWrites.send_held

    def counting(self):
        if self._held:
            sends[0] += 1
        original(self)

    monkeypatch.setattr(write_batch.BatchedWrites, "send_held", counting)
    return sends


async def test_a_burst_of_every_size_and_shape_arrives_byte_exact(counted_sends):
    rng = random.Random(7)
    sizes = [0, 1, 100, 65_535, 65_536, 65_537, 1_000_000] + [rng.randrange(0, 300_000) for _ in range(60)]
    with serve(_app()) as url:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async def echo(size):
                body = rng.randbytes(size)
                async with session.post(f"{url}/echo", data=body) as answer:
                    assert answer.status == 200
                    assert await answer.read() == body

            async def sized(size):
                async with session.get(f"{url}/sized/{size}") as answer:
                    assert await answer.read() == _payload(size)
                async with session.head(f"{url}/sized/{size}") as answer:
                    assert answer.status == 200
                    assert answer.headers["content-length"] == str(size)
                    assert await answer.read() == b""

            async def stream(parts):
                async with session.get(f"{url}/stream/{parts}") as answer:
                    assert await answer.text() == "".join(f"part {index};" for index in range(parts))

            await asyncio.gather(*[echo(size) for size in sizes], *[sized(size) for size in sizes[:20]],
                                 *[stream(parts) for parts in range(0, 40, 3)])
    assert counted_sends[0] > 0, "a burst of concurrent requests was never batched"


async def test_one_request_at_a_time_is_written_at_once(counted_sends):
    with serve(_app()) as url:
        async with aiohttp.ClientSession() as session:
            for size in (0, 10, 70_000):
                async with session.get(f"{url}/sized/{size}") as answer:
                    assert await answer.read() == _payload(size)
            async with session.post(f"{url}/echo", data=b"x" * 5000) as answer:
                assert await answer.read() == b"x" * 5000
    assert counted_sends[0] == 0


async def test_pipelined_requests_on_one_connection_are_answered_in_order():
    with serve(_app()) as url:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        sizes = [5, 0, 70_000, 3]
        writer.write(b"".join(f"GET /sized/{size} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for size in sizes))
        await writer.drain()
        for size in sizes:
            status = await reader.readline()
            assert status.startswith(b"HTTP/1.1 200"), status
            length = None
            while (line := await reader.readline()) != b"\r\n":
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length == size
            assert await reader.readexactly(size) == _payload(size)
        writer.close()
        await writer.wait_closed()
