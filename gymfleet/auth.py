"""The fleet credential: one random token per fleet, required on every route of every server, sent by every client.

`ng_run` / `RunHelper` (`gymfleet.fleet.supervisor.Fleet`) makes the token. It reaches the fleet's servers as
secrets do (never argv, never a file others can read, never their initial environment, which `/proc/<pid>/environ`
shows for good: an inherited memory file for a fresh interpreter, the zygote's private socket for a forked one;
`gymfleet.fleet.launch`), and each server holds it in memory (`hold`). Its clients find it through:

1. this process, if it started the fleet (`remember`: NeMo-RL's in-process `RunHelper` + `RolloutCollectionHelper`);
2. the token a fleet server holds (`hold`; `FLEET_TOKEN_ENV` for a server started by hand): their calls to each other;
3. `USER_TOKEN_ENV` (`GYMFLEET_TOKEN`), set by the user (a client on another machine);
4. the token file of the head server's address, `token_dir()/head-<host>-<port>.token` (mode 0600 in a 0700 folder
   under `$XDG_RUNTIME_DIR`, else `~/.cache/gymfleet`), which `ng_run` writes and removes on shutdown: so
   `ng_collect_rollouts`, `ng_status` and `ng_reverify` on the same machine find it with nothing to pass.

A client sends the token only to the servers of the fleet it belongs to (`grant`: `gymfleet.http.ServerClient` grants
each fleet server's address, never an upstream LLM's), in the `TOKEN_HEADER` header (`Authorization: Bearer <token>`
is accepted too, for OpenAI clients pointed at a model server). The server-side check is
`gymfleet.serving.guard.RequestGuardMiddleware`. A server holding no token and with none in its environment (a bare app
in a test, a `python -m sandbox` run by hand without `FLEET_TOKEN_ENV`) checks none.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import socket
import tempfile
from pathlib import Path
from secrets import token_urlsafe
from urllib.parse import urlsplit

FLEET_TOKEN_ENV = "GYMFLEET_FLEET_TOKEN"
"""The token of the fleet that started this server (set by the supervisor in each server's environment)."""
USER_TOKEN_ENV = "GYMFLEET_TOKEN"
"""A fleet token the user gives a client (e.g. on another machine than the head server's)."""
AUTH_OFF_ENV = "GYMFLEET_AUTH_OFF"
"""Set (to `1`) by a fleet started with `disable_fleet_auth: true`: its servers check no token."""
TOKEN_HEADER = "X-Gymfleet-Token"
FLEET_HEADER = "X-Gymfleet-Fleet"
INSTANCE_HEADER = "X-Gymfleet-Instance"
"""`GET /`'s headers naming the fleet (its token) and the instance, to a request carrying the fleet's token only
(`gymfleet.serving.server`): how the supervisor's readiness probe knows its own server (`gymfleet.fleet.credential`,
which needs only these names, not the serving stack)."""

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""})
"""Host names that mean this machine (a bind-all address is reached through loopback)."""

_held: dict[str, str] = {}
"""This server process's own fleet credential (`hold`): `token`, and `off` when its fleet opted out."""
_fleets: dict[tuple[str, int], str] = {}
"""Head server address -> token of the fleets this process started."""
_origins: dict[tuple[str, int], str] = {}
"""Server address -> the token to send it (`grant`)."""


def new_token() -> str:
    """A fresh fleet token (256 random bits)."""
    return token_urlsafe(32)


def _key(host: str | None, port: int | str) -> tuple[str, int]:
    host = (host or "").strip("[]").lower()
    if host in LOOPBACK_NAMES or host.startswith("127."):
        host = "localhost"
    return host, int(port)


def token_dir() -> Path:
    """The owner-only folder holding the token files of the fleets this user runs."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "gymfleet"
    return Path(os.path.expanduser("~")) / ".cache" / "gymfleet" / "tokens"


def token_path(host: str | None, port: int | str) -> Path:
    """The token file of the fleet whose head server listens at `host:port`."""
    name, number = _key(host, port)
    return token_dir() / f"head-{name.replace(':', '_')}-{number}.token"


def remember(host: str | None, port: int | str, token: str) -> list[Path]:
    """Make `token` this machine's token for the head server at `host:port`: known to this process and written
    (0600) to its token file, under each name the head is reached by. Returns the files written."""
    _fleets[_key(host, port)] = token
    hosts = {host or ""}
    if _key(host, port)[0] == "localhost" and (host or "") in ("0.0.0.0", "::", ""):
        hosts |= {socket.gethostname(), socket.getfqdn()}  # a bind-all head is reached by the machine's name too
    folder = token_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    written = []
    for name in sorted(hosts):
        path = token_path(name, port)
        descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=".token-")  # created 0600
        with os.fdopen(descriptor, "w") as file:
            file.write(token)
        os.replace(temporary, path)
        written.append(path)
    return written


def started_here() -> list[str]:
    """The tokens of the fleets this process started and has not stopped."""
    return list(dict.fromkeys(_fleets.values()))


def forget(host: str | None, port: int | str, token: str, paths: list[Path]) -> None:
    """Undo `remember`: drop the token from this process and remove its files (those still holding it)."""
    if _fleets.get(_key(host, port)) == token:
        del _fleets[_key(host, port)]
    for path in paths:
        with contextlib.suppress(OSError):
            if path.read_text() == token:
                path.unlink()


def hold(token: str | None, off: bool = False) -> None:
    """Make `token` this server process's fleet token, held in memory only: not in `os.environ`, so no process it
    starts (workers, vLLM, tools) inherits it. `off`: its fleet opted out of the check (`disable_fleet_auth`)."""
    _held.clear()
    if token:
        _held.update(token=token, off="1" if off else "")


def hold_from_environ() -> None:
    """Move a fleet credential found in this process's environment (`FLEET_TOKEN_ENV`, `AUTH_OFF_ENV`) into memory
    (`hold`), removing the variables so that no process this one starts inherits them."""
    token, off = os.environ.pop(FLEET_TOKEN_ENV, None), os.environ.pop(AUTH_OFF_ENV, None)
    if token:
        hold(token, bool(off))


def held() -> tuple[str, bool] | None:
    """`(token, off)` of the credential this process holds (`hold`), for handing it on to its own workers."""
    return (_held["token"], bool(_held["off"])) if _held else None


def fleet_token() -> str | None:
    """The token of the fleet this server process belongs to (held, else from its environment), whether or not the
    fleet checks it: it also roots the session-signing keys (`gymfleet.serving.sessions`)."""
    return _held.get("token") or os.environ.get(FLEET_TOKEN_ENV) or None


def token_for(host: str | None, port: int | str | None) -> str | None:
    """The token of the fleet whose head server is at `host:port` (see the module docstring for the order; with no
    head address known, only the environment's)."""
    known = _fleets.get(_key(host, port)) if port is not None else None
    token = known or fleet_token() or os.environ.get(USER_TOKEN_ENV)
    if token or port is None:
        return token or None
    try:
        return token_path(host, port).read_text().strip() or None
    except OSError:
        return None


def head_headers(host: str | None, port: int | str) -> dict[str, str]:
    """The headers that carry the token of the fleet whose head server is at `host:port` (none if unknown), for a
    client that does not go through `gymfleet.http`."""
    token = token_for(host, port)
    return {TOKEN_HEADER: token} if token else {}


def grant(base_url: str, token: str | None) -> None:
    """Send `token` on every request to the server at `base_url` (`http://host:port`) from now on."""
    if token:
        parts = urlsplit(base_url)
        if parts.hostname and parts.port:
            _origins[_key(parts.hostname, parts.port)] = token


def token_of(url: str) -> str | None:
    """The token granted to the server `url` points at, if any."""
    if not _origins:
        return None
    parts = urlsplit(url)
    try:
        return _origins.get(_key(parts.hostname, parts.port or 80))
    except ValueError:
        return None


def server_token() -> str | None:
    """The token this server process requires, or None (no fleet token, or the fleet opted out)."""
    if _held:
        return None if _held["off"] else _held["token"]
    if os.environ.get(AUTH_OFF_ENV):
        return None
    return os.environ.get(FLEET_TOKEN_ENV) or None


def presented(headers: dict[bytes, bytes] | list[tuple[bytes, bytes]]) -> str | None:
    """The token an ASGI request's headers carry (`TOKEN_HEADER`, or `Authorization: Bearer`), if any."""
    bearer = None
    for name, value in headers.items() if isinstance(headers, dict) else headers:
        lowered = name.lower()
        if lowered == b"x-gymfleet-token":
            return value.decode("latin-1")
        if lowered == b"authorization" and value[:7].lower() == b"bearer ":
            bearer = value[7:].decode("latin-1").strip()
    return bearer


def matches(offered: str | None, token: str) -> bool:
    """Constant-time comparison of a presented token with the fleet's."""
    return offered is not None and hmac.compare_digest(offered.encode(), token.encode())


def is_loopback(host: str | None) -> bool:
    """Whether a listener on `host` is reachable from this machine only (`0.0.0.0`/`::` are not)."""
    host = (host or "").strip("[]").lower()
    return host in ("localhost", "::1") or host.startswith("127.")
