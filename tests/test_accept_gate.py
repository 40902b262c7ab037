"""A server near its open-files limit stops accepting instead of dropping connections (`gymfleet.serving.accept_gate`),
against a real uvicorn server on uvloop in a process with a soft limit of 128 descriptors: 300 POSTs at once, each
held 0.2 s. A plain uvicorn server drains its listen queue by accepting and closing connections (libuv's answer to
EMFILE): POSTs fail as "Server disconnected", not retried since they may have been read. A `GatedServer` leaves them
queued in the kernel's backlog until descriptors are free: every POST is answered, once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from gymfleet import http
from gymfleet.errors import TransportError

SERVER = textwrap.dedent("""
    import asyncio, resource, socket, sys
    import uvicorn
    from fastapi import FastAPI, Request
    from gymfleet.serving.accept_gate import GatedServer

    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    app = FastAPI()
    app.state.runs = 0

    @app.post("/work")
    async def work(request: Request):
        app.state.runs += 1
        await asyncio.sleep(0.2)
        return await request.json()

    @app.get("/runs")
    async def runs():
        return {"runs": app.state.runs}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, loop="uvloop", log_level="error", backlog=512, lifespan="off")
    (GatedServer if sys.argv[1] == "gated" else uvicorn.Server)(config).run(sockets=[sock])
""")


async def _burst(kind: str) -> tuple[int, list[str], int]:
    """POSTs answered, failures (their messages) and the server's count of POSTs it ran."""
    server = subprocess.Popen([sys.executable, "-c", SERVER, kind], stdout=subprocess.PIPE, text=True)
    try:
        port = int(await asyncio.to_thread(server.stdout.readline))
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):  # listening once the port is printed; serving once uvicorn started
            try:
                await http.request("GET", f"{url}/runs", timeout_s=5, retry=http.NO_RETRY)
                break
            except TransportError:
                await asyncio.sleep(0.1)
        answers = await asyncio.gather(*(http.request("POST", f"{url}/work", json={"i": i}, timeout_s=120,
                                                      headers={"Connection": "close"})  # no idle sockets left
                                         for i in range(300)), return_exceptions=True)
        runs = (await http.request("GET", f"{url}/runs", timeout_s=30)).json()["runs"]
    finally:
        server.terminate()
        server.wait(10)
        server.stdout.close()
        await http.close()
    answered = sum(1 for answer in answers if not isinstance(answer, BaseException) and answer.status == 200)
    return answered, [str(answer) for answer in answers if isinstance(answer, BaseException)], runs


@pytest.mark.parametrize("kind", ["plain", "gated"])
async def test_a_server_out_of_descriptors_queues_connections_instead_of_dropping_them(kind):
    answered, failures, runs = await _burst(kind)
    if kind == "plain":  # the class the gate removes: connections accepted and closed unread
        assert failures and all("lost the connection" in f and "not retried" in f for f in failures), failures[:3]
    else:
        assert (answered, failures) == (300, []), failures[:3]
        assert runs == 300, "each POST ran once"
