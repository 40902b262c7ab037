"""What a web page in the user's browser, or a flood, could send a server is refused before it is read
(`gymfleet.serving.guard.RequestGuardMiddleware`): DNS-rebinding `Host` names, cross-origin requests, non-JSON
bodies, and bodies over `max_request_body_mb` (413, even when no `Content-Length` announces the size)."""

from __future__ import annotations

import httpx
import pytest

from gymfleet.testing import make_response, serve
from resources_servers.mcqa.app import MCQAServer

ROW = {"responses_create_params": {"input": "Q?"}, "question": "Q?", "options": [{"A": "x"}, {"B": "y"}],
       "expected_answer": "A", "response": make_response("\\boxed{A}")}


@pytest.fixture(scope="module")
def url():
    with serve(MCQAServer({"name": "mcqa", "domain": "knowledge", "max_request_body_mb": 1}).create_app()) as base:
        yield base


def _port(url: str) -> str:
    return url.rsplit(":", 1)[1]


REBINDING = ["evil.example", "evil.example:{port}", "testserver", "testclient", "127.0.0.1.evil.example:{port}",
             "localhost.evil:{port}",
             "10.0.0.1:{port}", "0.0.0.0:{port}", "[::2]:{port}", ""]
LOOPBACK = ["127.0.0.1:{port}", "localhost:{port}", "127.1.2.3:{port}", "LOCALHOST", "[::1]:{port}"]


@pytest.mark.parametrize("host", REBINDING)
def test_a_loopback_server_refuses_a_host_that_is_not_loopback(url, host):
    answer = httpx.post(url + "/verify", json=ROW, headers={"Host": host.format(port=_port(url))})
    assert answer.status_code == 403 and answer.json()["error_type"] == "forbidden_host", answer.text


@pytest.mark.parametrize("forwarded", ["X-Forwarded-For", "X-Real-IP", "Forwarded"])
def test_a_forwarding_header_cannot_make_a_network_peer_pass_for_the_in_process_client(url, forwarded):
    """Servers trust no proxy header: a page that claims to be forwarded from `testclient` is still a network peer."""
    value = "for=testclient" if forwarded == "Forwarded" else "testclient"
    answer = httpx.post(url + "/verify", json=ROW, headers={"Host": "evil.example", forwarded: value})
    assert answer.status_code == 403 and answer.json()["error_type"] == "forbidden_host", answer.text


def test_an_in_process_test_client_is_served_whatever_its_host_and_a_network_peer_never_is():
    """Starlette's TestClient (what NeMo-Gym folders' tests call their app with) is in the process; the same Host
    over a socket stays a 403 (`test_a_loopback_server_refuses_a_host_that_is_not_loopback`)."""
    from starlette.testclient import TestClient

    app = MCQAServer({"name": "mcqa", "domain": "knowledge", "max_request_body_mb": 1}).create_app()
    with TestClient(app) as client:
        assert client.post("/verify", json=ROW).status_code == 200
        assert client.post("/verify", json=ROW, headers={"Origin": "https://evil.example"}).status_code == 403


@pytest.mark.parametrize("host", LOOPBACK)
def test_loopback_names_are_served(url, host):
    answer = httpx.post(url + "/verify", json=ROW, headers={"Host": host.format(port=_port(url))})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost:1", "null", "http://127.0.0.1"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/json"])
def test_a_cross_origin_request_is_refused(url, origin, content_type):
    answer = httpx.post(url + "/verify", content=httpx.Request("POST", url, json=ROW).content,
                        headers={"Origin": origin, "Content-Type": content_type})
    assert answer.status_code == 403 and answer.json()["error_type"] == "forbidden_origin", answer.text


def test_a_same_origin_request_is_served(url):
    answer = httpx.post(url + "/verify", json=ROW, headers={"Origin": url})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/xml"])
def test_a_json_route_refuses_a_body_that_is_not_json(url, content_type):
    body = httpx.Request("POST", url, json=ROW).content
    answer = httpx.post(url + "/verify", content=body, headers={"Content-Type": content_type})
    assert answer.status_code == 415 and answer.json()["error_type"] == "unsupported_media_type", answer.text
    assert httpx.post(url + "/verify", content=body,
                      headers={"Content-Type": "application/json; charset=utf-8"}).status_code == 200


def test_a_body_over_the_limit_is_a_413_before_it_is_read(url):
    big = b'{"x": "' + b"a" * (2 << 20) + b'"}'
    announced = httpx.post(url + "/verify", content=big, headers={"Content-Type": "application/json"})
    assert announced.status_code == 413 and announced.json()["error_type"] == "request_too_large"

    def chunks():  # no Content-Length: the limit counts what arrives
        for _ in range(64):
            yield b"a" * 65536

    streamed = httpx.post(url + "/verify", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and streamed.json()["error_type"] == "request_too_large", streamed.text
    assert httpx.post(url + "/verify", json=ROW).status_code == 200, "the server still serves"
