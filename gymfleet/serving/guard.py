"""Who may talk to a server: the fleet token on every route (`FleetAuthMiddleware`).

Every request but `GET /` (liveness, which says `{"status": "ok"}` and nothing else) must carry the fleet's token
(`gymfleet.auth`); without it the answer is a 401 whose one line says where the token is. The check runs before the
body is read, so an outsider cannot make a server read, parse or act on anything.
"""

from __future__ import annotations

import logging

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
