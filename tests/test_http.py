"""gymfleet.http against real servers: retries with backoff, deadlines, cookies, typed failures."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Request, Response

from gymfleet import http
from gymfleet.errors import ServerRefError, TransportError
from gymfleet.testing import free_port, serve

FAST_RETRY = http.RetryPolicy(max_attempts=4, backoff_s=0.01, max_backoff_s=0.05)


def _flaky_app() -> FastAPI:
    app = FastAPI()
    app.state.calls = {}

    @app.post("/flaky/{key}/{failures}/{status}")
    async def flaky(key: str, failures: int, status: int, request: Request):
        count = app.state.calls[key] = app.state.calls.get(key, 0) + 1
        if count <= failures:
            return Response(status_code=status, content=b'{"error": "busy"}', headers={"Retry-After": "0"})
        return {"attempt": count, "body": await request.json(), "cookie": request.headers.get("cookie")}

    @app.get("/typed/{status}")
    async def typed(status: int):
        return Response(status_code=status, content=b'{"detail": "judge: timed out", "error_type": "timeout"}')

    @app.get("/slow")
    async def slow():
        await asyncio.sleep(5)
        return {}

    @app.get("/cookie")
    async def cookie(response: Response):
        response.set_cookie("a___b", "signed.value")
        return {}

    return app


@pytest.fixture(scope="module")
def url():
    with serve(_flaky_app()) as base:
        yield base


@pytest.mark.parametrize("status", [429, 502, 503, 504])
async def test_retryable_status_is_retried_until_success(url, status):
    response = await http.request("POST", f"{url}/flaky/s{status}/2/{status}", json={"x": 1}, retry=FAST_RETRY)
    assert response.status == 200
    assert response.json()["attempt"] == 3
    assert response.json()["body"] == {"x": 1}


async def test_retries_are_bounded(url):
    response = await http.request("POST", f"{url}/flaky/bounded/100/503", json={}, retry=FAST_RETRY)
    assert response.status == 503
    with pytest.raises(TransportError) as info:
        response.raise_for_status()
    assert info.value.status == 503 and info.value.failure_class == "http_5xx"


@pytest.mark.parametrize("status", [400, 502])
async def test_a_servers_error_type_is_the_failure_class(url, status):
    response = await http.request("GET", f"{url}/typed/{status}", retry=http.NO_RETRY)
    assert response.failure_class == "timeout"
    with pytest.raises(TransportError) as info:
        response.raise_for_status()
    assert info.value.status == status and info.value.failure_class == "timeout"


async def test_client_errors_are_not_retried(url):
    response = await http.request("POST", f"{url}/flaky/four/1/400", json={}, retry=FAST_RETRY)
    assert response.status == 400
    second = await http.request("POST", f"{url}/flaky/four/1/400", json={}, retry=FAST_RETRY)
    assert second.json()["attempt"] == 2


async def test_deadline_raises_typed_timeout(url):
    with pytest.raises(TransportError) as info:
        await http.request("GET", f"{url}/slow", timeout_s=0.3)
    assert info.value.failure_class == "timeout"
    assert info.value.status is None


async def test_connection_refused_is_retried_then_typed():
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TransportError) as info:
        await http.request("POST", dead + "/x", json={}, retry=FAST_RETRY)
    assert info.value.failure_class == "connection_error"
    assert dead in str(info.value)


async def test_cookies_are_explicit(url):
    got = await http.request("GET", f"{url}/cookie")
    assert got.cookies == {"a___b": "signed.value"}
    sent = await http.request("POST", f"{url}/flaky/cookies/0/200", json={}, cookies=got.cookies)
    assert sent.json()["cookie"] == "a___b=signed.value"
    plain = await http.request("POST", f"{url}/flaky/cookies/0/200", json={})
    assert plain.json()["cookie"] is None, "no cookie jar: nothing is remembered between calls"


async def test_server_client_resolves_names_and_suggests(url):
    port = int(url.rsplit(":", 1)[1])
    client = http.ServerClient({"mcqa": {"resources_servers": {"mcqa": {"host": "127.0.0.1", "port": port}}}})
    response = await client.post("mcqa", "/flaky/named/0/200", json={"ok": True})
    assert response.json()["body"] == {"ok": True}
    with pytest.raises(ServerRefError, match="Did you mean 'mcqa'"):
        client.url_of("mcqaa")


async def test_many_concurrent_requests_complete(url):
    responses = await asyncio.gather(
        *(http.request("POST", f"{url}/flaky/many{i}/0/200", json={"i": i}) for i in range(500))
    )
    assert sorted(r.json()["body"]["i"] for r in responses) == list(range(500))
