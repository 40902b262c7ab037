"""Who may talk to a server, and how much: the fleet token (`FleetAuthMiddleware`) and `RequestGuardMiddleware`.

Every request but `GET /` (liveness, which says `{"status": "ok"}` and nothing else) must carry the fleet's token
(`gymfleet.auth`); without it the answer is a 401 whose one line says where the token is. The check runs before the
body is read, so an outsider cannot make a server read, parse or act on anything.

`RequestGuardMiddleware` refuses what a web page open in the user's browser could send, and bodies too large to read:
- a server bound to loopback answers only a `Host` that names loopback (`localhost`, `127.x.x.x`, `[::1]`): a
  DNS-rebinding page (`Host: evil.example`) is a 403;
- a request with an `Origin` other than the server's own (a cross-origin request from a browser) is a 403;
- a body whose `Content-Type` is not JSON (`text/plain`, a form: what a page may post without a CORS preflight) is
  a 415; a body without one is read as JSON, as before;
- a body over `max_body_bytes` is a 413: at once when its `Content-Length` says so, else as soon as that many
  bytes have arrived (`RequestBodyTooLarge`), so a 100 MiB body is never held in memory.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from gymfleet import auth

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


class FleetAuthMiddleware:
    """Pure ASGI middleware: 401 for any request without the fleet token, except `GET /`."""

    def __init__(self, app, token: str, head: tuple[str, int] | None = None):
        self.app = app
        self.token = token
        self.refusal = where_the_token_is(head)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (scope["path"] in OPEN_PATHS and scope["method"] in ("GET", "HEAD")):
            await self.app(scope, receive, send)
            return
        if auth.matches(auth.presented(scope["headers"]), self.token):
            scope.setdefault("state", {})["fleet_authenticated"] = True
            await self.app(scope, receive, send)
            return
        log.info("%s %s: refused (no valid fleet token)", scope["method"], scope["path"])
        response = JSONResponse({"detail": self.refusal, "error_type": "unauthorized"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


class RequestBodyTooLarge(Exception):
    """The request body is larger than the server's `max_request_body_mb` (answered 413)."""


LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def _host_name(host: str) -> str:
    """`host` of a `Host` header value (`name`, `name:port`, `[v6]:port`), lower-case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_loopback_name(host: str) -> bool:
    name = _host_name(host)
    return name in LOOPBACK_HOSTS or (name.startswith("127.") and name.replace(".", "").isdigit())


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


class RequestGuardMiddleware:
    """Pure ASGI middleware: Host (for a loopback-bound server), Origin, Content-Type and body size (see the module
    docstring)."""

    def __init__(self, app, *, loopback_only: bool, max_body_bytes: int | None):
        self.app = app
        self.loopback_only = loopback_only
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, error_type, detail = refusal
            log.info("%s %s: refused (%s): %s", scope["method"], scope["path"], error_type, detail)
            response = JSONResponse({"detail": detail, "error_type": error_type}, status_code=status,
                                    headers={"Connection": "close"} if status == 413 else None)
            await response(scope, receive, send)
            return
        if self.max_body_bytes is None:
            await self.app(scope, receive, send)
            return
        limit, received = self.max_body_bytes, 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise RequestBodyTooLarge(f"the request body is larger than {limit} bytes (max_request_body_mb)")
            return message

        await self.app(scope, bounded_receive, send)

    def _refusal(self, scope, headers: dict[bytes, str]) -> tuple[int, str, str] | None:
        host = headers.get(b"host", "")
        if self.loopback_only and not _is_loopback_name(host):
            return 403, "forbidden_host", (f"Host {host!r} is not this loopback-bound server's name (a DNS-rebinding "
                                           "page?); call it as 127.0.0.1 or localhost")
        origin = headers.get(b"origin")
        if origin is not None and urlsplit(origin).netloc.lower() != host.lower():
            return 403, "forbidden_origin", (f"cross-origin request from {origin!r} refused: gymfleet servers take no "
                                             "requests from web pages")
        content_type = headers.get(b"content-type")
        if content_type is not None and scope["method"] not in ("GET", "HEAD") and not _is_json(content_type):
            return 415, "unsupported_media_type", f"send JSON (Content-Type: application/json), not {content_type!r}"
        length = headers.get(b"content-length")
        if self.max_body_bytes is not None and length is not None and length.isdigit() and \
                int(length) > self.max_body_bytes:
            return 413, "request_too_large", (f"the request body ({int(length)} bytes) is larger than this server "
                                              f"takes ({self.max_body_bytes} bytes: max_request_body_mb)")
        return None
