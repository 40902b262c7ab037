"""Hostile request bodies cannot stall a server: errors are capped, stalled bodies time out, disconnects are quiet.

Issue 10, items 4 and 7: a small body of many wrong-typed items is a small 422 that counts the errors; a body that
stops arriving is a 408 after `request_body_timeout_s` and the connection closes; a client that hangs up mid-body
is one short log line, never an ERROR with a traceback.
"""

from __future__ import annotations

import logging
import socket
import time

import httpx
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from gymfleet.serving.resources import AggregateMetricsRequest, ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.testing import serve

ITEMS = 250_000
SMALL_ANSWER = 64 * 1024


class Numbers(BaseModel):
    values: list[int]


class HostileServer(ResourcesServer):
    """A bare environment with one list-taking tool."""

    async def total(self, body: Numbers) -> dict:
        return {"total": sum(body.values)}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=1.0)


@pytest.fixture(scope="module")
def url():
    server = HostileServer({"name": "hostile", "domain": "other", "request_body_timeout_s": 0.5})
    with serve(server.create_app()) as base:
        yield base


def _error_count(model: type[BaseModel], data: dict) -> int:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return exc.error_count()
    raise AssertionError("the body was meant to be invalid")


@pytest.mark.parametrize(
    ("route", "model", "data"),
    [
        ("/verify", VerifyRequest, {"responses_create_params": {"input": [1] * ITEMS}, "response": {"output": []}}),
        ("/aggregate_metrics", AggregateMetricsRequest, {"verify_responses": [1] * ITEMS}),
    ],
    ids=["verify", "aggregate_metrics"],
)
def test_many_wrong_typed_items_are_a_small_422_that_counts_them(url, route, model, data):
    answer = httpx.post(url + route, content=orjson.dumps(data), timeout=120)
    assert answer.status_code == 422
    assert len(answer.content) < SMALL_ANSWER, f"{len(answer.content)} bytes of 422"
    detail = answer.json()["detail"]
    total = _error_count(model, data)
    if total <= 20:  # lists that fail fast (wire.py's input/output items) stop at the first bad item
        assert len(detail) == total and all(error["loc"][0] == "body" for error in detail), detail
        return
    listed, summary = detail[:-1], detail[-1]
    assert 0 < len(listed) <= 20
    assert all(error["loc"][0] == "body" for error in listed), listed[:2]
    assert summary["type"] == "too_many_errors"
    assert f"{total} " in summary["msg"] and f"{total - len(listed)} more" in summary["msg"], summary


def verify_body(metadata: dict) -> dict:
    """A /verify body whose `metadata` (a mapping, validated key by key: no fail-fast) holds the errors."""
    return {"responses_create_params": {"input": "hi", "metadata": metadata}, "response": {"output": []}}


def test_the_first_errors_listed_are_the_real_ones(url):
    data = verify_body({"a": "ok", "b": 2, "c": "ok", **{f"k{i}": i for i in range(100)}})
    detail = httpx.post(url + "/verify", json=data, timeout=30).json()["detail"]
    assert detail[0]["loc"] == ["body", "responses_create_params", "metadata", "b"]
    assert detail[1]["loc"] == ["body", "responses_create_params", "metadata", "k0"]
    assert "string" in detail[0]["msg"]
    assert f"{_error_count(VerifyRequest, data)} " in detail[-1]["msg"]


def test_a_few_errors_are_all_listed_without_a_summary(url):
    detail = httpx.post(url + "/verify", json=verify_body({"x": 1, "y": 2, "z": 3}), timeout=30).json()["detail"]
    assert [error["loc"][-1] for error in detail] == ["x", "y", "z"]


def test_lists_of_wrong_items_stop_at_the_first(url):
    """Item lists fail fast (the work, not only the answer, is bounded): one error for 250k wrong items."""
    detail = httpx.post(url + "/aggregate_metrics", content=orjson.dumps({"verify_responses": [1] * ITEMS}),
                        timeout=30).json()["detail"]
    assert [error["loc"] for error in detail] == [["body", "verify_responses", 0]]


def test_tool_with_many_bad_arguments_answers_a_short_error(url):
    answer = httpx.post(url + "/total", json={"values": ["x"] * ITEMS}, timeout=120)
    assert answer.status_code == 200
    assert len(answer.content) < SMALL_ANSWER, f"{len(answer.content)} bytes of tool error"
    error = answer.json()["error"]
    assert "values.0" in error and f"{ITEMS} errors" in error, error[:300]


def _read_all(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def test_a_body_that_stops_arriving_is_a_408_and_the_connection_closes(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(30)  # only so a broken server fails the test instead of hanging it
        sock.sendall(
            b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b'Transfer-Encoding: chunked\r\n\r\nFFFFFFF\r\n{"responses'
        )
        assert httpx.get(url + "/", timeout=10).status_code == 200, "others are served meanwhile"
        answer = _read_all(sock)  # returns only once the server closes the connection
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"connection: close" in head.lower()
    assert orjson.loads(body)["error_type"] == "request_body_timeout"
    assert b"request_body_timeout_s" in body
    assert httpx.get(url + "/", timeout=10).status_code == 200, "the server survived"


def test_a_slow_but_whole_body_within_the_deadline_is_served(url):
    host, port = url.removeprefix("http://").split(":")
    body = b'{"verify_responses": [{"reward": 1.0}]}'
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(30)
        sock.sendall(
            b"POST /aggregate_metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:10]
        )
        time.sleep(0.1)
        sock.sendall(body[10:])
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@pytest.fixture
def server_logs(caplog):
    """Records of gymfleet's loggers and uvicorn's (which does not propagate to the root logger)."""
    caplog.set_level(logging.DEBUG)
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        uvicorn_logger.removeHandler(caplog.handler)


def test_a_client_that_hangs_up_mid_body_is_one_quiet_log_line(url, server_logs):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n"
            b'{"responses_create_params": '
        )
        time.sleep(0.1)
    deadline = time.monotonic() + 20
    while not [r for r in server_logs.records if "disconnect" in r.getMessage().lower()]:
        assert time.monotonic() < deadline, [r.getMessage()[:200] for r in server_logs.records]
        time.sleep(0.05)
    time.sleep(0.2)  # anything logged after the disconnect line (a traceback from uvicorn) shows up too
    records = [r for r in server_logs.records if r.name.startswith(("gymfleet", "uvicorn"))]
    loud = [f"{r.levelname} {r.name}: {r.getMessage()[:200]}" for r in records if r.levelno >= logging.WARNING]
    assert not loud
    assert not [r for r in records if r.exc_info], "no traceback"
    assert len([r for r in records if "disconnect" in r.getMessage().lower()]) == 1
    assert httpx.get(url + "/", timeout=10).status_code == 200


@pytest.mark.parametrize("depth", [300, 1000])
def test_a_body_nested_deeper_than_can_be_echoed_is_a_422(url, depth):
    """orjson reads 1024 levels but writes 253: a deep extra field must not become a 500 when the row is echoed."""
    deep = "[" * depth + "]" * depth
    body = '{"responses_create_params": {"input": "hi"}, "response": {"output": []}, "extra": ' + deep + "}"
    answer = httpx.post(url + "/verify", content=body, timeout=30)
    assert answer.status_code == 422, answer.text[:300]
    assert answer.json()["detail"][0]["type"] == "json_too_deep"


def test_a_body_with_many_brackets_but_shallow_is_served(url):
    body = {"responses_create_params": {"input": "hi"}, "response": {"output": []}, "extra": [[1]] * 500}
    answer = httpx.post(url + "/verify", json=body, timeout=30)
    assert answer.status_code == 200 and answer.json()["extra"] == [[1]] * 500
