"""The client pool (`gymfleet.connections.PacedConnector`) at scale: a pooled connection its server has already closed
is never used, and idle pooled connections count against the pool's limit (so against the open-files budget).

Both failed 65,536 rollouts in flight from one process (`bench/rollouts_at_scale.py`): its event loop lagged tens of
seconds, so a server's FIN on an idle connection sat unread while the pool handed the connection out (the POST then
failed unread: "Server disconnected" / "Can not write request body", which a POST must not retry); and the idle
connections kept on top of the in-flight ones ran the process out of file descriptors (EMFILE on connect).
"""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest
from fastapi import FastAPI, Request

import gymfleet.testing
from gymfleet import connections, http
from gymfleet.testing import serve, wait_until

SERVER_IDLE_S = 1.0
"""The test servers' keep-alive: they close an idle connection after this long (long enough that two requests in a
row of a loaded machine's test still share one)."""


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        return {"port": request.client.port, "body": await request.json()}

    return app


@pytest.fixture(scope="module")
def closing_url():
    """A server that closes idle connections after `SERVER_IDLE_S`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gymfleet.testing, "SERVER_KEEP_ALIVE_S", SERVER_IDLE_S)
        with serve(_app()) as url:
            yield url


@pytest.fixture(scope="module")
def urls():
    """Two servers that keep idle connections open (gymfleet's servers' keep-alive)."""
    with serve(_app()) as first, serve(_app()) as second:
        yield first, second


async def _post(url: str, value: int) -> int:
    """POST once (never retried, as a rollout's `/run`); the client port the server saw."""
    response = await http.request("POST", f"{url}/echo", json={"v": value}, retry=http.NO_RETRY)
    assert response.json()["body"] == {"v": value}
    return response.json()["port"]


@pytest.mark.parametrize("lag_s", [0.0, 0.3, 1.0])
async def test_a_pooled_connection_its_server_closed_during_a_lag_is_not_used(closing_url, lag_s):
    """The event loop is blocked (`lag_s`) while the server closes the idle connection; the very next request, in
    the same loop pass (the FIN not yet read), must go out on a fresh connection, not fail unread. Without the lag
    (0.0) the pooled connection is reused."""
    url = closing_url
    first = await _post(url, 1)
    dropped = connections.stale_dropped
    if lag_s:  # a loop too busy to read the server's FIN: blocked for the lag, and until the FIN has arrived
        time.sleep(lag_s)
        wait_until(lambda: _peer_closed(first, int(url.rsplit(":", 1)[1])), "the server closed the idle connection")
    second = await _post(url, 2)
    assert (second == first) == (lag_s == 0.0)
    assert connections.stale_dropped - dropped == (0 if lag_s == 0.0 else 1)


def _peer_closed(client_port: int, server_port: int) -> bool:
    """Whether the server has closed this process's connection from `client_port` (its FIN arrived, unread)."""
    return any(conn.laddr.port == client_port and conn.raddr and conn.raddr.port == server_port
               and conn.status == psutil.CONN_CLOSE_WAIT for conn in psutil.Process().net_connections("tcp"))


def _open_sockets_to(ports: set[int]) -> int:
    return sum(1 for conn in psutil.Process().net_connections("tcp")
               if conn.raddr and conn.raddr.port in ports)  # any state: each holds a descriptor


@pytest.mark.parametrize("limit", [1, 2, 5])
async def test_idle_pooled_connections_count_against_the_pool_limit(urls, monkeypatch, limit):
    """Bursts to one server, then another, alternating: the pool never holds more sockets (in use and idle) than
    its limit, whatever the mix of hosts (idle ones to the other host are closed to make room)."""
    monkeypatch.setattr(http, "_limits", http.ClientLimits(limit=limit, limit_per_host=limit, keepalive_timeout_s=30))
    await http.close()  # a fresh pool with this limit
    ports = {int(url.rsplit(":", 1)[1]) for url in urls}
    peak = 0
    for round_ in range(4):
        url = urls[round_ % 2]
        ports_seen = await asyncio.gather(*(_post(url, i) for i in range(limit * 2)))
        assert len(ports_seen) == limit * 2
        peak = max(peak, _open_sockets_to(ports))
    await http.close()
    assert 0 < peak <= limit
