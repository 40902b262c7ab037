"""Who may talk to a server, and how much: `RequestGuardMiddleware` (the fleet token, what a browser could send, body
size and deadline).

Every request but `GET /` (liveness, which says `{"status": "ok"}` and nothing else) must carry the fleet's token
(`gymfleet.auth`); without it the answer is a 401 whose one line says where the token is. The check runs before the
body is read, so an outsider cannot make a server read, parse or act on anything.

`RequestGuardMiddleware` refuses what a web page open in the user's browser could send, and bodies too large to read:
- a server bound to loopback answers only a `Host` that names loopback (`localhost`, `127.x.x.x`, `[::1]`): a
  DNS-rebinding page (`Host: evil.example`) is a 403. A call from inside the process through Starlette's
  `TestClient` (`Host: testserver`, as NeMo-Gym folders' own tests call `setup_webserver()`'s app) is no page's: its
  client is `IN_PROCESS_CLIENT`, which no network peer can present (a socket's peer is an address);
- a request with an `Origin` other than the server's own (a cross-origin request from a browser) is a 403;
- a body whose `Content-Type` is not JSON (`text/plain`, a form: what a page may post without a CORS preflight) is
  a 415; a body without one is read as JSON, as before;
- a body over `max_body_bytes` is a 413: at once when its `Content-Length` says so, else as soon as that many
  bytes have arrived (`RequestBodyTooLarge`), so a 100 MiB body is never held in memory;
- a body not wholly received within `body_timeout_s` of the request's headers raises `RequestBodyTimeout` (a 408
  that closes the connection): uvicorn has no body timeout of its own, so a client that announces a body and sends
  nothing would otherwise hold its connection, and the handler waiting for the body, forever.

One layer does all of it, the fleet-token check (when given a `token`) included: each ASGI layer costs every
request a call and a wrapper around `receive`, and the three it replaces (token, guard, body deadline) were a fifth of
what mcqa's `/verify` cost beyond a bare endpoint. Its checks read the few headers they need in one pass, keep their
verdict on each `Host` value, and arm the body deadline's timer only when the body is not already there
(`gymfleet.serving.deadline.finish_by`).
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from gymfleet import auth
from gymfleet.serving.deadline import finish_by

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/"})
"""Paths answered without the token (GET/HEAD only): liveness."""


def where_the_token_is(head: tuple[str, int] | None) -> str:
    """One line telling a refused client where its fleet's token is."""
    file = auth.token_path(*head) if head else auth.token_dir() / "head-<host>-<port>.token"
    return (
        f"this gymfleet server requires its fleet's token: send it as the {auth.TOKEN_HEADER} header (or "
        f"Authorization: Bearer); ng_run wrote it to {file} on the head server's machine (gymfleet clients read it "
        f"from there, or from ${auth.USER_TOKEN_ENV})"
    )


def _admitted(scope, token: str) -> bool:
    """Whether a request may pass the fleet-token check (`GET /` always may); marks those that carried it."""
    if scope["path"] in OPEN_PATHS and scope["method"] in ("GET", "HEAD"):
        return True
    if auth.matches(auth.presented(scope["headers"]), token):
        scope.setdefault("state", {})["fleet_authenticated"] = True
        return True
    return False


async def _refuse_unauthorized(scope, receive, send, refusal: str) -> None:
    log.info("%s %s: refused (no valid fleet token)", scope["method"], scope["path"])
    response = JSONResponse({"detail": refusal, "error_type": "unauthorized"}, status_code=401,
                            headers={"WWW-Authenticate": "Bearer"})
    await response(scope, receive, send)


class RequestBodyTooLarge(Exception):
    """The request body is larger than the server's `max_request_body_mb` (answered 413)."""


class RequestBodyTimeout(Exception):
    """The request body was not wholly received within the server's `request_body_timeout_s` (answered 408)."""


LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")
IN_PROCESS_CLIENT = "testclient"
"""`scope["client"]` host of a request made in process by Starlette's `TestClient` (never a socket's peer address)."""


def _host_name(host: str) -> str:
    """`host` of a `Host` header value (`name`, `name:port`, `[v6]:port`), lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback_name(host: str) -> bool:
    name = _host_name(host)
    return name in LOOPBACK_HOSTS or (name.startswith("127.") and name.replace(".", "").isdigit())


KNOWN_HOSTS = 256
"""`Host` values each guard remembers its verdict on (a client sends the same one on every request)."""


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class RequestGuardMiddleware:
    """Pure ASGI middleware: Host (for a loopback-bound server), Origin, Content-Type, body size and deadline, and
    the fleet token when given one (see the module docstring)."""

    def __init__(self, app, *, loopback_only: bool, max_body_bytes: int | None, token: str | None = None,
                 head: tuple[str, int] | None = None, body_timeout_s: float | None = None):
        self.app = app
        self.loopback_only = loopback_only
        self.max_body_bytes = max_body_bytes
        self.token = token or None
        self.unauthorized = where_the_token_is(head) if self.token else ""
        self.body_timeout_s = body_timeout_s
        self._loopback: dict[bytes, bool] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, error_type, detail = refusal
            log.info("%s %s: refused (%s): %s", scope["method"], scope["path"], error_type, detail)
            response = JSONResponse({"detail": detail, "error_type": error_type}, status_code=status,
                                    headers={"Connection": "close"} if status == 413 else None)
            await response(scope, receive, send)
            return
        if self.token is not None and not _admitted(scope, self.token):
            await _refuse_unauthorized(scope, receive, send, self.unauthorized)
            return
        if self.max_body_bytes is None and self.body_timeout_s is None:
            await self.app(scope, receive, send)
            return
        await self.app(scope, self._guarded_receive(receive), send)

    def _guarded_receive(self, receive):
        """`receive` with the body's size limit and deadline; once the body is whole, passed through untouched
        (waiting for a disconnect while a response streams is not bounded)."""
        limit, timeout_s = self.max_body_bytes, self.body_timeout_s
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        received = 0
        body_done = False

        async def guarded_receive():
            nonlocal received, body_done
            if body_done:
                return await receive()
            if deadline is None:
                message = await receive()
            else:
                try:
                    message = await finish_by(deadline, receive())
                except TimeoutError:
                    raise RequestBodyTimeout(
                        f"the request body did not arrive within {timeout_s:g}s (request_body_timeout_s); "
                        "send the whole body promptly, or raise request_body_timeout_s for very large bodies"
                    ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if limit is not None and received > limit:
                    raise RequestBodyTooLarge(f"the request body is larger than {limit} bytes (max_request_body_mb)")
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        return guarded_receive

    def _is_loopback(self, host: bytes) -> bool:
        verdict = self._loopback.get(host)
        if verdict is None:
            if len(self._loopback) >= KNOWN_HOSTS:
                self._loopback.clear()
            verdict = self._loopback[host] = _is_loopback_name(host.decode("latin-1"))
        return verdict

    def _refusal(self, scope) -> tuple[int, str, str] | None:
        host = origin = content_type = length = None
        for name, value in scope["headers"]:  # one pass; ASGI servers give header names in lower case
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"content-type":
                content_type = value
            elif name == b"content-length":
                length = value
        host = host or b""
        in_process = (scope.get("client") or ("",))[0] == IN_PROCESS_CLIENT
        if self.loopback_only and not in_process and not self._is_loopback(host):
            return 403, "forbidden_host", (f"Host {host.decode('latin-1')!r} is not this loopback-bound server's name "
                                           "(a DNS-rebinding page?); call it as 127.0.0.1 or localhost")
        if origin is not None:
            origin_text, host_text = origin.decode("latin-1"), host.decode("latin-1")
            if urlsplit(origin_text).netloc.lower() != host_text.lower():
                return 403, "forbidden_origin", (f"cross-origin request from {origin_text!r} refused: gymfleet "
                                                 "servers take no requests from web pages")
        if content_type is not None and scope["method"] not in ("GET", "HEAD") and \
                not _is_json(content_type.decode("latin-1")):
            return 415, "unsupported_media_type", (f"send JSON (Content-Type: application/json), not "
                                                   f"{content_type.decode('latin-1')!r}")
        if self.max_body_bytes is not None and length is not None and length.isdigit() and \
                int(length) > self.max_body_bytes:
            return 413, "request_too_large", (f"the request body ({int(length)} bytes) is larger than this server "
                                              f"takes ({self.max_body_bytes} bytes: max_request_body_mb)")
        return None
