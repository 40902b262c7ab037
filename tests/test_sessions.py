"""The session cookie middleware in process (ASGI calls, no server): the cookies it signs are itsdangerous' own, and
those it remembers (signed or verified once) are still checked for age and process on every request."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid

import itsdangerous
import pytest

from gymfleet.serving import sessions
from gymfleet.serving.sessions import MAX_AGE_S, SESSION_LOST, SessionCookieMiddleware, session_id, session_key

NAME = "DemoServer___demo"


def _call(middleware: SessionCookieMiddleware, cookie: bytes | None = None) -> tuple[dict, bytes]:
    """One request through `middleware`: (the scope the app saw, the value of the cookie it was answered)."""
    seen: dict = {}

    async def app(scope, receive, send):
        seen.update(scope, session_id=session_id())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    answered = []

    async def send(message):
        if message["type"] == "http.response.start":
            answered.extend(value for key, value in message["headers"] if key == b"set-cookie")

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    middleware.app = app
    headers = [(b"cookie", b"other=1; " + NAME.encode() + b"=" + cookie)] if cookie else []
    asyncio.run(middleware({"type": "http", "method": "POST", "path": "/x", "headers": headers}, receive, send))
    return seen, answered[0].split(b";")[0].split(b"=", 1)[1]


def test_cookies_are_signed_as_itsdangerous_signs_them(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_800_000_123.7)
    middleware = SessionCookieMiddleware(None, NAME)
    _, cookie = _call(middleware)
    payload = cookie.rsplit(b".", 2)[0]
    assert cookie == itsdangerous.TimestampSigner(session_key(NAME)).sign(payload)
    value, signed_at = itsdangerous.TimestampSigner(session_key(NAME)).unsign(cookie, return_timestamp=True)
    assert value == payload and signed_at.timestamp() == 1_800_000_123


def test_a_session_keeps_its_id_and_its_cookie_is_verified_once(monkeypatch):
    middleware = SessionCookieMiddleware(None, NAME)
    first, cookie = _call(middleware)
    verified = []
    unsign = middleware.signer.unsign
    monkeypatch.setattr(middleware.signer, "unsign", lambda *a, **k: verified.append(1) or unsign(*a, **k))
    for _ in range(3):
        again, answered = _call(middleware, cookie)
        assert again["session_id"] == first["session_id"] and answered == cookie
    assert verified == []  # signed here: remembered
    other = SessionCookieMiddleware(None, NAME)  # the same instance in another worker: verifies it, then remembers
    other.started = middleware.started
    for _ in range(3):
        assert _call(other, cookie)[0]["session_id"] == first["session_id"]
    monkeypatch.setattr(other.signer, "unsign", lambda *a, **k: verified.append(1) or unsign(*a, **k))
    assert _call(other, cookie)[0]["session_id"] == first["session_id"] and verified == []


@pytest.mark.parametrize("forge", [
    lambda c: c[:-2] + (b"xx" if c[-2:] != b"xx" else b"yy"),  # signature
    lambda c: c.replace(c.split(b".")[0], c.split(b".")[0][:-1] + b"A", 1),  # payload
    lambda c: c + b".x",  # shape
    lambda c: b"",
])
def test_a_forged_variant_of_a_remembered_cookie_gets_a_fresh_session(forge):
    middleware = SessionCookieMiddleware(None, NAME)
    first, cookie = _call(middleware)
    forged = forge(cookie)
    assert forged != cookie
    scope, answered = _call(middleware, forged)
    assert scope["session_id"] != first["session_id"] and answered != forged


def test_a_remembered_cookie_still_ages_and_still_belongs_to_its_process(monkeypatch):
    middleware = SessionCookieMiddleware(None, NAME)
    first, cookie = _call(middleware)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + MAX_AGE_S + 5)
    assert _call(middleware, cookie)[0]["session_id"] != first["session_id"]  # expired
    monkeypatch.setattr(time, "time", real)
    middleware.started += 2  # as a later process of the same server would see it
    scope, _ = _call(middleware, cookie)
    assert scope[SESSION_LOST] == first["session_id"] and scope["session_id"] != first["session_id"]


def test_the_remembered_cookies_are_bounded(monkeypatch):
    monkeypatch.setattr(sessions, "KNOWN_COOKIES", 8)
    middleware = SessionCookieMiddleware(None, NAME)
    cookies = [_call(middleware) for _ in range(20)]
    assert len(middleware._known) <= 8
    for scope, cookie in cookies:  # forgotten ones verify afresh, to the same session
        assert _call(middleware, cookie)[0]["session_id"] == scope["session_id"]


def test_session_ids_are_version_4_uuids_and_their_payload_is_json_dumps():
    ids = {sessions.new_session_id() for _ in range(500)}
    assert len(ids) == 500
    for value in ids:
        parsed = uuid.UUID(value)
        assert str(parsed) == value and parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert sessions._fresh_payload(value) == json.dumps({"session_id": value}).encode()


def test_a_session_the_app_changed_is_signed_with_its_new_contents():
    middleware = SessionCookieMiddleware(None, NAME)

    async def app(scope, receive, send):
        scope["session"]["step"] = 3
        await send({"type": "http.response.start", "status": 200, "headers": []})

    answered = []

    async def send(message):
        answered.extend(value for key, value in message["headers"] if key == b"set-cookie")

    middleware.app = app
    asyncio.run(middleware({"type": "http", "headers": []}, None, send))
    cookie = answered[0].split(b";")[0].split(b"=", 1)[1]
    payload = itsdangerous.TimestampSigner(session_key(NAME)).unsign(cookie)
    assert json.loads(base64.b64decode(payload))["step"] == 3
