"""What a NeMo-Gym folder written for 0.7.0's aiohttp client sees from `ServerClient` (real HTTP): every answer
handed back whatever its status (never resent), each way a call can fail without an answer catchable as the aiohttp
exception 0.7.0 raised for it and as a gymfleet `TransportError`, and `nemo_gym.server_utils`' global aiohttp client
names with 0.7.0's one-at-a-time rule."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import nemo_gym.server_utils as server_utils
from gymfleet.errors import TransportError
from gymfleet.testing import serve
from nemo_gym.server_utils import ServerClient

CALLS: list[int] = []


async def answer(request: Request) -> Response:
    status = int(request.path_params["status"])
    CALLS.append(status)
    return JSONResponse({"status": status}, status_code=status)


async def broken(request: Request) -> Response:
    """Headers promise 1000 bytes, the body stops after 10: the connection breaks mid-answer."""
    return Response(b'{"output":', headers={"content-length": "1000"}, media_type="application/json")


APP = Starlette(routes=[Route("/status/{status}", answer, methods=["POST"]),
                        Route("/broken", broken, methods=["POST"])])


@pytest.fixture(scope="module")
def url():
    with serve(APP) as base:
        yield base


def client_for(**urls: str) -> ServerClient:
    client = ServerClient.model_construct(global_config_dict={})
    client._server_base_urls.update(urls)
    return client


@pytest.mark.parametrize("status", [200, 400, 408, 429, 500, 502, 503, 504])
async def test_every_answer_is_handed_back_once_whatever_its_status(url, status):
    """0.7.0's client resends nothing that was answered: the folder reads the status and retries within its own
    deadline (genrm_compare's judge loop), so the server sees exactly one request."""
    CALLS.clear()
    response = await client_for(judge=url).post(server_name="judge", url_path=f"/status/{status}", json={})
    assert response.status == status and CALLS == [status]
    assert (await response.json()) == {"status": status}


async def test_a_body_that_broke_off_is_aiohttps_client_payload_error(url):
    with pytest.raises(aiohttp.ClientPayloadError) as caught:
        await client_for(judge=url).post(server_name="judge", url_path="/broken", json={})
    assert isinstance(caught.value, TransportError) and caught.value.failure_class == "connection_error"
    assert "ClientPayloadError" in str(caught.value)


async def test_a_closed_port_is_aiohttps_client_connection_error():
    with socket.socket() as reserved:  # bound, never listening: nothing answers there
        reserved.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{reserved.getsockname()[1]}"
        with pytest.raises(aiohttp.ClientConnectionError) as caught:
            await client_for(judge=closed).post(server_name="judge", url_path="/v1/responses", json={})
    assert isinstance(caught.value, TransportError) and caught.value.failure_class == "connection_error"


async def test_the_global_aiohttp_client_is_one_at_a_time_as_under_0_7_0(monkeypatch):
    monkeypatch.setattr(server_utils, "_GLOBAL_AIOHTTP_CLIENT", None)  # what genrm_compare's fixture does first
    session = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    try:
        assert isinstance(session, aiohttp.ClientSession) and server_utils.is_global_aiohttp_client_setup()
        assert server_utils.get_global_aiohttp_client() is session
        with pytest.raises(AssertionError, match="already a global aiohttp client"):
            server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    finally:
        await session.close()
    assert not server_utils.is_global_aiohttp_client_setup(), "a closed session counts as none"
    again = server_utils.set_global_aiohttp_client(server_utils.GlobalAIOHTTPAsyncClientConfig())
    await again.close()
    with pytest.raises(ValueError):
        server_utils.GlobalAIOHTTPAsyncClientConfig(global_aiohttp_tcp_keepalive_probes=0)
