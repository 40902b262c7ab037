"""Signed session cookies with NeMo-Gym's naming and semantics, as a pure ASGI middleware.

Each server's cookie is named `<ClassName>___<instance name>` (NeMo-Gym's convention), so one cookie dict can carry
the agent's, the resources server's and the model server's cookies at once. Unlike NeMo-Gym it is not signed with
its own public name (which would let anyone forge a cookie holding another rollout's session id): the key is
derived from the fleet's random token (`gymfleet.auth`) and the cookie name (`session_key`), so it is the same in
every replica and restart of an instance (whose old cookies are then recognised, below) and differs between fleets;
outside a fleet (a bare app in a test) it is random per Python process. A forged cookie, or one from another fleet,
fails its signature and gets a fresh session, never another's. The value is Starlette's format
(itsdangerous-signed base64 JSON `{"session_id": "<uuid4>"}`). Every response re-sends the cookie; a request
without a valid cookie gets a fresh session id. Handlers read the id with `session_id()` (a context variable) or
`request.session["session_id"]`. A cookie this process signed, or verified once, is remembered (up to
`KNOWN_COOKIES`): its session's later requests skip the HMAC and the decoding, and its age and process are still
checked on each of them.

A session lives in the memory of the process that started it. A cookie signed before this process started (its
itsdangerous timestamp, whole seconds, is older than this process) was issued by an earlier process of the same server,
one that has since exited: `ng_run` restarted it after a crash (at least a second later), or a Ray replica came back on
the same address (a clock set back after start-up lowers that mark, so this process's own cookies are never taken for
an earlier one's). Such a cookie is replaced by a fresh session, and `request.scope["session_lost"]` holds the old
session id. A server whose state lives in those sessions passes `refuse`: for the requests that need their session, it
answers HTTP 410 `{"error_type": "session_lost", "detail": ...}` instead of serving them on nothing (a tool call or
`/verify` that would otherwise act on an empty session and score a reward of 0 that is really the restart's). Agents
end such a rollout with a typed failure (`_ng_failure_class: session_lost`) that a resume runs again.
"""

from __future__ import annotations

import base64
import contextvars
import hashlib
import hmac
import json
import logging
import os
import time
from collections.abc import Callable

import itsdangerous
from itsdangerous.encoding import base64_encode, int_to_bytes, want_bytes
from itsdangerous.exc import BadSignature
from starlette.responses import JSONResponse

from gymfleet import auth

log = logging.getLogger(__name__)

SESSION_ID_KEY = "session_id"
MAX_AGE_S = 14 * 24 * 3600
SESSION_LOST = "session_lost"
"""The `error_type` (and `_ng_failure_class`) of a request whose session died with an earlier server process."""
SESSION_LOST_STATUS = 410
KNOWN_COOKIES = 16384
"""Cookies each server remembers as signed or verified by itself (about 300 bytes each), so that the requests of that
many sessions in flight skip re-verifying theirs."""

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("gymfleet_session_id", default=None)


def session_id() -> str:
    """The session id of the request being handled.

    Raises:
        RuntimeError: called outside a request of a server with session cookies.
    """
    value = _current.get()
    if value is None:
        raise RuntimeError("session_id() called outside a request handled by SessionCookieMiddleware")
    return value


def cookie_name(class_name: str, instance_name: str) -> str:
    """NeMo-Gym's cookie name for a server."""
    return f"{class_name}___{instance_name}"


_PROCESS_KEY = os.urandom(32)
"""The session keys' root outside a fleet: random, per Python process (forked workers inherit it)."""


def session_key(name: str) -> str:
    """The key that signs the session cookies named `name`: derived from the fleet's token when this process serves
    in a fleet (the same for every replica and restart of the instance), else from `_PROCESS_KEY`."""
    token = auth.fleet_token()
    root = token.encode() if token else _PROCESS_KEY
    return hmac.new(root, b"gymfleet session cookie\0" + name.encode(), hashlib.sha256).hexdigest()


def new_session_id() -> str:
    """A random (version 4) UUID as text, as `str(uuid.uuid4())` writes it, at a fifth of its cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # the RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _fresh_payload(session_id: str) -> bytes:
    """`json.dumps({"session_id": session_id})` for an id of `new_session_id` (hex digits and dashes: no escapes)."""
    return b'{"session_id": "' + session_id.encode() + b'"}'


class _Signer(itsdangerous.TimestampSigner):
    """itsdangerous' signer with the derived key computed once instead of on every sign/unsign, and its HMAC-SHA1 a
    copy of one keyed HMAC (the same bytes as itsdangerous' `hmac.new` per signature, without keying it each time)."""

    def __init__(self, secret: str):
        super().__init__(secret)
        self._key = super().derive_key()
        self._mac = hmac.new(self._key, digestmod=hashlib.sha1)

    def derive_key(self, secret_key: str | bytes | None = None) -> bytes:
        return self._key if secret_key is None else super().derive_key(secret_key)

    def get_signature(self, value: str | bytes) -> bytes:
        mac = self._mac.copy()  # the keyed state, computed once
        mac.update(want_bytes(value))
        return base64_encode(mac.digest())

    def sign_at(self, value: bytes, timestamp: int) -> bytes:
        """`sign(value)` as signed at `timestamp` (whole seconds): the bytes itsdangerous' `sign` writes then."""
        value = value + b"." + base64_encode(int_to_bytes(timestamp))
        return value + b"." + self.get_signature(value)


class SessionCookieMiddleware:
    """Attach `scope["session"] = {"session_id": ...}` from a signed cookie, and re-send the cookie."""

    def __init__(self, app, name: str, secret: str | None = None,
                 refuse: Callable[[dict], str | None] | None = None):
        """`refuse(scope)`: for a request that came with a lost session (`scope["session_lost"]`), the reason it
        cannot be served without it (answered as a 410 `session_lost`), or None to serve it on the fresh session."""
        self.app = app
        self.name = name
        self.signer = _Signer(secret or session_key(name))
        self.refuse = refuse
        self.started = int(time.time())
        """Whole seconds, as the cookies' timestamps: a cookie signed in an earlier second is an earlier process's."""
        self._morsel_suffix = f"; path=/; Max-Age={MAX_AGE_S}; httponly; samesite=lax".encode()
        self._prefix = name.encode() + b"="
        self._known: dict[bytes, tuple[dict, int]] = {}

    def _signing_at(self, now: int) -> None:
        """Keep every cookie this process signs at or after `started`, even if the clock was set back since."""
        if now < self.started:
            log.warning("the clock went back %ds since %s started; session cookies signed from now on count as this "
                        "process's", self.started - now, self.name)
            self.started = now

    def _read(self, headers) -> tuple[dict, bytes | None]:
        prefix = self._prefix
        for key, value in headers:
            if key != b"cookie":
                continue
            for part in value.split(b";"):
                part = part.strip()
                if part.startswith(prefix):
                    return self._session_of(part[len(prefix) :])
        return {}, None

    def _session_of(self, raw: bytes) -> tuple[dict, bytes | None]:
        """`(session, raw)` of a cookie value: a session this process can serve, `{SESSION_LOST: id}` for an earlier
        process's, `{}` for a forged, stale or malformed one (`raw` only for a session served as it came)."""
        known = self._known.get(raw)
        if known is None:
            try:
                value, signed_at = self.signer.unsign(raw, max_age=MAX_AGE_S, return_timestamp=True)
                data = json.loads(base64.b64decode(value))
            except (BadSignature, ValueError):
                return {}, None
            if not (isinstance(data, dict) and isinstance(data.get(SESSION_ID_KEY), str)):
                return {}, None
            known = self._remember(raw, data, int(signed_at.timestamp()))
        data, signed_at = known
        if not 0 <= int(time.time()) - signed_at <= MAX_AGE_S:  # itsdangerous' age check, on every request
            return {}, None
        if signed_at < self.started:
            return {SESSION_LOST: data[SESSION_ID_KEY]}, None
        return dict(data), raw

    def _remember(self, raw: bytes, data: dict, signed_at: int) -> tuple[dict, int]:
        """Keep a cookie this process signed or verified, so that its session's next requests skip the HMAC and
        the decoding: the same bytes always verify alike (age and process are still checked on every request)."""
        if len(self._known) >= KNOWN_COOKIES:
            self._known.clear()  # cheaper than LRU bookkeeping on every request; a miss only verifies afresh
        self._known[raw] = known = (data, signed_at)
        return known

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session, raw = self._read(scope["headers"])
        if SESSION_LOST in session:
            scope[SESSION_LOST] = session[SESSION_LOST]
            reason = self.refuse(scope) if self.refuse is not None else None
            if reason is not None:
                answer = JSONResponse({"detail": reason, "error_type": SESSION_LOST}, status_code=SESSION_LOST_STATUS)
                await answer(scope, receive, send)
                return
        fresh = SESSION_ID_KEY not in session
        if fresh:
            session = {SESSION_ID_KEY: new_session_id()}
            raw = None
        scope["session"] = session
        token = _current.set(session[SESSION_ID_KEY])
        original = dict(session)

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                value = raw
                if value is None or scope["session"] != original:
                    now = int(time.time())
                    self._signing_at(now)
                    data = scope["session"]
                    payload = (_fresh_payload(data[SESSION_ID_KEY]) if fresh and data == original
                               else json.dumps(data).encode())
                    value = self.signer.sign_at(base64.b64encode(payload), now)
                    self._remember(value, dict(data), now)
                cookie = self._prefix + value + self._morsel_suffix
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"set-cookie", cookie)]
            await send(message)

        try:
            await self.app(scope, receive, send_with_cookie)
        finally:
            _current.reset(token)
