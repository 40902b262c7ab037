"""gymfleet.http against real servers: retries with backoff, deadlines, cookies, typed failures, and which failures
may be retried (a call that may have reached its server runs at most once unless it is idempotent), for the client
and for the callers that rely on it (simple_agent, judges, the sandbox client)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import yaml
from fastapi import FastAPI, Request, Response
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.simple_agent.app import MODEL_RETRY, SimpleAgent
from gymfleet import connections, http, http_types
from gymfleet.errors import JudgeError, SandboxError, ServerRefError, TransportError
from gymfleet.grading.judge import JudgeClient
from gymfleet.grading.sandbox_client import SandboxClient
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.testing import free_port, serve, wait_until_async
from gymfleet.testing.fleets import server_block

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

    @app.get("/port")
    async def port(request: Request):
        return {"port": request.client.port}

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


async def test_a_large_body_is_streamed_and_survives_a_retry(url):
    """A 3 MB body goes out as a stream (raw bytes that large make aiohttp warn, an error under -W error), and a
    retried attempt sends it whole again."""
    row = {"text": "x" * (3 << 20)}
    response = await http.request("POST", f"{url}/flaky/large/1/503", json=row, retry=FAST_RETRY)
    assert response.status == 200
    assert response.json()["attempt"] == 2 and response.json()["body"] == row


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


async def test_a_repeated_set_cookie_reads_alike_and_each_answer_owns_its_dict(url):
    # A server sends a session's cookie again with every answer; the parse of a header is cached, never the dict
    first = await http.request("GET", f"{url}/cookie")
    second = await http.request("GET", f"{url}/cookie")
    assert first.cookies == second.cookies == {"a___b": "signed.value"}
    first.cookies["a___b"] = "changed by a caller"
    assert second.cookies == {"a___b": "signed.value"}
    assert (await http.request("GET", f"{url}/cookie")).cookies == {"a___b": "signed.value"}
    headers = ['s___one="quoted \\"value\\""; Path=/; HttpOnly', "s___two=plain; Max-Age=60", "not a cookie"]
    merged = http_types.HttpResponse(200, b"", url, _set_cookie=headers).cookies
    again = http_types.HttpResponse(200, b"", url, _set_cookie=headers).cookies
    assert merged == again == {"s___one": 'quoted "value"', "s___two": "plain"}


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


async def test_waiting_for_a_free_pooled_connection_is_not_a_connect_timeout(url, monkeypatch):
    """A request queued behind a full pool waits within its own deadline: only the TCP connect is bounded by
    `CONNECT_TIMEOUT_S`. (With the connect deadline covering the wait, a burst bigger than the pool failed as
    `connection_error` once it had waited that long.) The connect deadline is half the wait, so that a loaded machine's
    scheduling does not fail the first request's own connect."""
    monkeypatch.setattr(http, "CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(http, "_limits", http.ClientLimits(limit=1, limit_per_host=1))
    started = asyncio.get_running_loop().time()
    slow, queued = await asyncio.gather(
        http.request("GET", f"{url}/slow", timeout_s=1.0, retry=http.NO_RETRY),
        http.request("POST", f"{url}/flaky/queued/0/200", json={"q": 1}, timeout_s=30.0, retry=http.NO_RETRY),
        return_exceptions=True,
    )
    assert isinstance(slow, TransportError) and slow.failure_class == "timeout"
    assert not isinstance(queued, BaseException), queued
    assert queued.json()["body"] == {"q": 1}
    assert asyncio.get_running_loop().time() - started >= 0.9, "the second request waited for the only connection"


def test_client_pools_let_go_of_idle_connections_before_any_server_closes_them():
    """A server closing an idle keep-alive connection while a client picks it from its pool makes the client's
    request fail unread (a reset, "Can not write request body"), which a POST must not retry. So gymfleet's pool
    keeps an idle connection for less than uvicorn's default keep-alive (vLLM's, and most Python servers'), and
    every server gymfleet starts keeps one longer than gymfleet's pool and aiohttp's default (NeMo-RL's client)."""
    import uvicorn

    from gymfleet.fleet.launch import _uvicorn_config

    app = FastAPI()
    client_idle_s = http.ClientLimits().keepalive_timeout_s
    assert client_idle_s < uvicorn.Config(app).timeout_keep_alive
    aiohttp_default_s = 15.0  # aiohttp's documented default keepalive_timeout
    for server_idle_s in (_uvicorn_config(app, access_log=False).timeout_keep_alive, http_types.SERVER_KEEP_ALIVE_S):
        assert server_idle_s > max(client_idle_s, aiohttp_default_s)
        # a client's loop that lags reads an answer (and starts its own idle clock) that much after the server wrote
        # it (and started the server's): the server must still hold the connection when the client reuses it
        assert server_idle_s >= 2 * (http_types.CLIENT_LOOP_LAG_S + max(client_idle_s, aiohttp_default_s))


async def test_an_idle_pooled_connection_is_reused_within_the_keep_alive_and_dropped_past_it(url, monkeypatch):
    # 1 s: two requests in a row of a loaded machine's test may well be 0.3 s apart, and must still share one
    monkeypatch.setattr(http, "_limits", http.ClientLimits(keepalive_timeout_s=1.0))

    async def port() -> int:
        return (await http.request("GET", f"{url}/port", retry=http.NO_RETRY)).json()["port"]

    first = await port()
    assert await port() == first, "a connection idle for less than the keep-alive is reused"
    await asyncio.sleep(1.2)  # idle past it (the pool drops a connection idle too long when it would hand it out)
    assert await port() != first, "a connection idle past the client's keep-alive is closed, not reused"


async def test_a_burst_opens_connections_a_bounded_number_at_a_time(url, monkeypatch):
    """However many requests start at once, at most `CONNECTS_AT_ONCE` connects are in progress; every request
    is served."""
    monkeypatch.setattr(connections, "CONNECTS_AT_ONCE", 3)
    opening, peak = 0, 0
    create = aiohttp.TCPConnector._create_connection

    async def counted(self, *args, **kwargs):
        nonlocal opening, peak
        opening += 1
        peak = max(peak, opening)
        try:
            await asyncio.sleep(0.01)  # a connect that takes a moment, so unpaced ones would overlap
            return await create(self, *args, **kwargs)
        finally:
            opening -= 1

    monkeypatch.setattr(aiohttp.TCPConnector, "_create_connection", counted)
    responses = await asyncio.gather(
        *(http.request("POST", f"{url}/flaky/burst{i}/0/200", json={"i": i}) for i in range(60))
    )
    assert sorted(r.json()["body"]["i"] for r in responses) == list(range(60))
    assert peak == 3


async def test_a_burst_slow_to_build_does_not_outrun_its_connect_deadlines(url, monkeypatch, caplog):
    """Requests started together are built `CONNECTS_AT_ONCE` at a time: building thousands in one event-loop pass
    (slow on a loaded machine) kept the loop from seeing the first connects done before their deadline, which failed
    them as `connection_error` although the server had accepted them."""
    real = http.orjson

    class SlowDumps:  # each body takes 10 ms to build: 200 of them in one pass (2 s) outlast the 1 s connect deadline,
        loads = staticmethod(real.loads)  # a turn's 4 (40 ms) leave it room for a loaded machine's scheduling

        @staticmethod
        def dumps(obj):
            time.sleep(0.01)
            return real.dumps(obj)

    monkeypatch.setattr(connections, "CONNECTS_AT_ONCE", 4)
    monkeypatch.setattr(http, "CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(http, "orjson", SlowDumps)
    caplog.set_level(logging.WARNING, logger=http.__name__)
    responses = await asyncio.gather(
        *(http.request("POST", f"{url}/flaky/slowbuild{i}/0/200", json={"i": i}, retry=http.NO_RETRY)
          for i in range(200)))
    assert sorted(r.json()["body"]["i"] for r in responses) == list(range(200))
    assert not [r.message for r in caplog.records if "cannot reach" in r.message]


_OPEN_FILES_PROBE = """
import logging, resource, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 4096))
from gymfleet import connections, http, http_types
for limit, count in [(100_000, 3000), (1000, 10_000), (100_000, 20_000), (100_000, 20_000)]:
    http.configure(http.ClientLimits(limit=limit, limit_per_host=limit))
    print("case", count, "pool", http.plan_in_flight(count, "rollouts"), flush=True)
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_requests_in_flight_beyond_the_open_files_limit_are_said_once_and_wait():
    """`plan_in_flight` lifts the soft open-files limit to the hard one; when the requests still do not fit (or the
    pool's own limit is lower) it says once how many wait, why and what to raise; when they fit it says nothing.
    (In a child process: a lowered hard limit cannot be raised again.)"""
    done = subprocess.run([sys.executable, "-c", _OPEN_FILES_PROBE], capture_output=True, text=True, timeout=120,
                          check=True)
    budget = 4096 - connections.OPEN_FILES_RESERVE
    assert done.stdout.splitlines() == [
        f"case 3000 pool {budget}",
        "10,000 rollouts in flight at once need 10,000 sockets, but the connection pool holds at most 1,000 "
        "(`global_aiohttp_connector_limit`); raise it to send them all at once. The other 9,000 wait in the pool for "
        "a free connection (they start later; none fails for it).",
        "case 10000 pool 1000",
        "20,000 rollouts in flight at once need 20,000 sockets, but this process may open 4,096 files (RLIMIT_NOFILE "
        f"soft 4,096, hard 4,096), so its pool holds at most {budget:,} connections. To send all 20,000 at once, "
        "raise the hard limit to at least 20,512 (`ulimit -Hn 20512` as root, systemd `LimitNOFILE=`, `docker run "
        f"--ulimit nofile=...`, Slurm/K8s limits). The other {20_000 - budget:,} wait in the pool for a free "
        "connection (they start later; none fails for it).",
        f"case 20000 pool {budget}",
        f"case 20000 pool {budget}",
        "soft 4096",
    ]


# ------------------------------------------------------------ failures after the request may have reached the server


@contextlib.asynccontextmanager
async def _received_then_lost(how: str) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A raw HTTP listener on an ephemeral port that reads each request whole (head and `Content-Length` body),
    records it, then never answers: `close` drops the connection, `reset` aborts it (RST), `hang` keeps it open
    until the client gives up. Yields its base URL and the requests it received."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            received.append(head + await reader.readexactly(length))
            if how == "hang":
                await reader.read()  # returns once the client closes its end
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        if how == "reset":
            writer.transport.abort()
        else:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", received
    finally:
        server.close()
        await server.wait_closed()


def _forgone_retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gymfleet.http" and "not retried" in r.getMessage()]


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_post_that_may_have_run_is_sent_once_and_ends_typed(how, caplog):
    async with _received_then_lost(how) as (url, received):
        with pytest.raises(TransportError) as info:
            await http.request("POST", url + "/run", json={"row": 1}, retry=FAST_RETRY)
    assert len(received) == 1 and received[0].endswith(b'{"row":1}')
    assert info.value.failure_class == "connection_error" and info.value.status is None
    assert "not retried: the server may have run it" in str(info.value)
    assert len(_forgone_retry_warnings(caplog)) == 1


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize(("method", "marked"), [("POST", {"idempotent": True}), ("GET", {}), ("DELETE", {})])
async def test_an_idempotent_call_that_lost_its_connection_is_retried(how, method, marked, caplog):
    policy = dataclasses.replace(FAST_RETRY, **marked)
    body = {"row": 1} if method == "POST" else None
    async with _received_then_lost(how) as (url, received):
        with pytest.raises(TransportError) as info:
            await http.request(method, url + "/verify", json=body, retry=policy)
    retries = [r for r in caplog.records if r.name == "gymfleet.http" and "retry" in r.getMessage()]
    assert len(retries) == policy.max_attempts - 1
    assert len(received) >= policy.max_attempts  # aiohttp itself resends an idempotent method once per attempt
    assert info.value.failure_class == "connection_error" and "not retried" not in str(info.value)
    assert not _forgone_retry_warnings(caplog)


async def test_a_refused_connection_is_retried_the_configured_number_of_times(caplog):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TransportError) as info:
        await http.request("POST", dead + "/run", json={}, retry=FAST_RETRY)  # not idempotent: nothing was sent
    assert info.value.failure_class == "connection_error" and "cannot reach" in str(info.value)
    retries = [r for r in caplog.records if r.name == "gymfleet.http" and "retry" in r.getMessage()]
    assert len(retries) == FAST_RETRY.max_attempts - 1


async def test_a_call_that_cannot_connect_rides_over_a_restart_within_connect_retry_s(caplog):
    """A server that comes back (its supervisor restarted it) a second after the first attempt: a POST with
    `connect_retry_s` reaches it once it listens (nothing was sent before); without, it fails after `max_attempts`."""
    port = free_port()
    received: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async def come_back_later() -> asyncio.Server:
        await asyncio.sleep(1.0)
        return await asyncio.start_server(answer, "127.0.0.1", port)

    url = f"http://127.0.0.1:{port}/run"
    with pytest.raises(TransportError, match="cannot reach"):
        await http.request("POST", url, json={}, retry=FAST_RETRY)
    later = asyncio.ensure_future(come_back_later())
    riding = dataclasses.replace(FAST_RETRY, connect_retry_s=30.0)
    response = await http.request("POST", url, json={}, retry=riding, timeout_s=10)
    server = await later
    server.close()
    assert response.status == 200 and len(received) == 1, "sent once, to the server that came back"
    assert any("a server being restarted" in r.getMessage() for r in caplog.records), "the wait is said once"


@pytest.mark.parametrize(("idempotent", "attempts"), [(False, 1), (True, 2)])
async def test_a_deadline_is_retried_only_for_idempotent_calls_that_ask(idempotent, attempts):
    policy = http.RetryPolicy(max_attempts=2, backoff_s=0.01, retry_timeouts=True, idempotent=idempotent)
    async with _received_then_lost("hang") as (url, received):
        with pytest.raises(TransportError) as info:
            await http.request("POST", url + "/v1/responses", json={}, timeout_s=0.3, retry=policy)
        # A loaded machine may read the last attempt's bytes after the client gave up on it: count them first.
        await wait_until_async(lambda: len(received) >= attempts, f"the listener to read {attempts} request(s)",
                               timeout_s=10)
    assert info.value.failure_class == "timeout"
    assert len(received) == attempts


def _judge(url: str) -> JudgeClient:
    port = int(url.rsplit(":", 1)[1])
    config = {"judge": {"responses_api_models": {"scripted_model": {"host": "127.0.0.1", "port": port}}}}
    return JudgeClient("judge", http.ServerClient(config), timeout_s=0.3, max_attempts=3, backoff_s=0.01)


@pytest.mark.parametrize("how", ["close", "hang"])
async def test_a_judge_call_that_may_have_run_is_not_repeated(how):
    async with _received_then_lost(how) as (url, received):
        with pytest.raises(JudgeError, match="not retried" if how == "close" else "within 0.3s"):
            await _judge(url).ask("Are these equivalent?")
    assert len(received) == 1


async def test_a_sandbox_run_that_may_have_run_is_not_repeated():
    async with _received_then_lost("close") as (url, received):
        with pytest.raises(SandboxError, match="not retried"):
            await SandboxClient(url=url).run("print(1)")
    assert len(received) == 1


class _Env(ResourcesServer):
    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=1.0)


@contextlib.contextmanager
def _agent(model_url: str, **fields):
    """simple_agent (its config: `fields`) in front of a trivial environment and the model server at `model_url`."""
    with serve(_Env({"name": "env"}).create_app()) as env_url:
        fleet = {"env": server_block("resources_servers", "env", env_url),
                 "llm": server_block("responses_api_models", "scripted_model", model_url)}
        agent = SimpleAgent({"name": "agent", "resources_server": "env", "model_server": "llm",
                             "model_timeout_s": 10, **fields}, fleet)
        with serve(agent.create_app()) as agent_url:
            yield agent_url


ROW = {"responses_create_params": {"input": "What is 2+2?"}}


async def test_the_agent_does_not_repeat_a_model_call_that_may_have_run():
    async with _received_then_lost("close") as (model_url, received):
        with _agent(model_url) as agent_url:
            answer = await http.request("POST", agent_url + "/run", json=ROW, retry=http.NO_RETRY)
    assert answer.status == 502 and answer.failure_class == "connection_error"
    assert "not retried" in answer.text
    assert len(received) == 1 < MODEL_RETRY.max_attempts


async def test_the_agent_retries_a_model_server_it_cannot_reach(caplog):
    # Nothing will ever listen there: ride over a restart for 1 s, not 10 (`restart_ride_s`).
    with _agent(f"http://127.0.0.1:{free_port()}", restart_ride_s=1) as agent_url:
        answer = await http.request("POST", agent_url + "/run", json=ROW, retry=http.NO_RETRY)
    assert answer.status == 502 and answer.failure_class == "connection_error"
    retries = [r for r in caplog.records if r.name == "gymfleet.http" and r.levelno == logging.WARNING
               and "/v1/responses failed" in r.getMessage()]
    assert len(retries) == MODEL_RETRY.max_attempts - 1


_SCALARS = st.one_of(st.text(max_size=20), st.sampled_from(["yes", "on", "off", "null", "~", "1e3", "0x1F", "07",
                                                              " lead", "trail ", "a: b", "- x", "(?i)\\bparis\\b",
                                                              "${policy.host}", "é ✓ 東京", "\t", "'", '"']),
                     st.integers(), st.floats(allow_nan=False), st.booleans(), st.none())
_CONFIGS = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _CONFIGS, max_size=6))
def test_the_published_config_reads_as_safe_load_reads_it(config):
    # the head server publishes yaml.safe_dump(...); clients read it with libyaml's parser (http.published_config)
    text = yaml.safe_dump(config, sort_keys=False)
    assert http.published_config(text) == yaml.safe_load(text) == config
