"""A fleet's credential (`gymfleet.auth`): made once per fleet, handed to its servers, published to its clients.

On by default. `disable_fleet_auth: true` at the top of the config turns the check off, for NeMo-Gym's own clients
(which cannot send a token), and only for a fleet reachable from this machine alone: a fleet with any listener on
a non-loopback address (the head server, any server, Ray placement) refuses to start with it.

`private_folder` and `owner_only` keep the fleet's log folder and files readable by this user alone.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gymfleet import auth
from gymfleet.errors import ConfigError

if TYPE_CHECKING:
    from gymfleet.fleet.config_instances import GlobalConfig

log = logging.getLogger(__name__)

OPT_OUT_KEY = "disable_fleet_auth"


class FleetCredential:
    """The token of one fleet: its servers' environment (`child_env`), its token files (`publish`/`withdraw`)."""

    def __init__(self, config: GlobalConfig, *, placed_remotely: bool = False):
        self.token = auth.new_token()
        self.enforced = not _opted_out(config, placed_remotely)
        self._config = config
        self._published: list[tuple[str, int, list[Path]]] = []

    def child_env(self) -> dict[str, str]:
        """What a server of this fleet gets in its environment (never its argv)."""
        env = {auth.FLEET_TOKEN_ENV: self.token}
        if not self.enforced:
            env[auth.AUTH_OFF_ENV] = "1"
        return env

    @property
    def head_token(self) -> str | None:
        """The token the head server requires (None: opted out)."""
        return self.token if self.enforced else None

    def publish(self, host: str | None = None) -> None:
        """Make the token known to this process and write its owner-only token file(s), keyed by the head address
        (`host`: another name the head is reached by, e.g. the node address Ray placement publishes)."""
        if self.enforced:
            host = self._config.head_host if host is None else host
            files = auth.remember(host, self._config.head_port, self.token)
            self._published.append((host, self._config.head_port, files))
            log.info("fleet token written to %s", files[0])

    def withdraw(self) -> None:
        """Forget the token and remove the files `publish` wrote. Safe to call more than once."""
        published, self._published = self._published, []
        for host, port, files in published:
            auth.forget(host, port, self.token, files)


def _opted_out(config: GlobalConfig, placed_remotely: bool) -> bool:
    if not config.data.get(OPT_OUT_KEY):
        return False
    exposed = [f"head_server.host={config.head_host!r}"] if not auth.is_loopback(config.head_host) else []
    exposed += [f"{instance.path}.host={instance.host!r}" for instance in config.instances.values()
                if not auth.is_loopback(instance.host)]
    if placed_remotely:
        exposed.append("Ray placement (servers listen on the nodes' addresses)")
    if exposed:
        raise ConfigError(
            f"{OPT_OUT_KEY}: true is only for a fleet that listens on loopback alone, but: {', '.join(exposed)}. "
            f"Set those hosts to 127.0.0.1 (and placement: local), or drop {OPT_OUT_KEY} and give clients the "
            f"fleet token (gymfleet clients find it on their own)"
        )
    log.warning("%s: true: this fleet's servers accept requests without the fleet token (loopback only)", OPT_OUT_KEY)
    return True


class StartupCheckFailed(ConfigError):
    """A server of the fleet answers, but the start-up check its fleet waits for failed (`ServerAnswer.failure`):
    the fleet stops with its error, which says how to fix it."""


@dataclass(frozen=True)
class ServerAnswer:
    """What a server said to its fleet's readiness probe (`probe_server`)."""

    ready: bool
    """It serves: its start-up check, if its fleet waits for one, has passed."""
    failure: str | None = None
    """Its start-up check failed, with this error (and how to fix it)."""


def probe_server(url: str, token: str, name: str, timeout_s: float = 2.0, wait_s: float = 0.0) -> ServerAnswer | None:
    """`GET url/` with the fleet's `token`: None unless it answers 200 as instance `name` of that fleet (a server
    names itself only to a request carrying its fleet's token: `gymfleet.serving.server`); else whether it is ready
    (`X-Gymfleet-Ready`: a warm-up the fleet waits for may still run, or have failed: `gymfleet.serving.warm_up`).
    With `wait_s`, a server still warming up answers once its verdict is in, or after `wait_s`."""
    from gymfleet.serving.warm_up import FAILED, READY, READY_HEADER, READY_WAIT_HEADER  # not the serving stack

    try:
        headers = {auth.TOKEN_HEADER: token, **({READY_WAIT_HEADER: f"{wait_s:g}"} if wait_s > 0 else {})}
        probe = urllib.request.Request(url + "/", headers=headers)
        with urllib.request.urlopen(probe, timeout=timeout_s + wait_s) as response:
            identity = (response.headers.get(auth.FLEET_HEADER), response.headers.get(auth.INSTANCE_HEADER))
            if response.status != 200 or identity != (token, name):
                return None
            state = response.headers.get(READY_HEADER, READY)
            if state != FAILED:
                return ServerAnswer(ready=state == READY)
            detail = json.loads(response.read() or b"{}").get("detail")
            return ServerAnswer(ready=False, failure=str(detail or "its start-up check failed (no detail given)"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def answers_as(url: str, token: str, name: str, timeout_s: float = 2.0) -> bool:
    """Whether `GET url/`, sent with the fleet's `token`, answers 200 as instance `name` of that fleet, ready to serve
    (`probe_server`)."""
    answer = probe_server(url, token, name, timeout_s)
    return answer is not None and answer.ready


def check_failed(name: str, path: str, failure: str) -> StartupCheckFailed:
    """The error a fleet stops with when instance `name` (at YAML `path`) failed its start-up check."""
    return StartupCheckFailed(f"server {name!r} failed its start-up check: {failure}", path=path)


def private_folder(path: Path) -> None:
    """Create `path` (and its parents) if needed, readable by this user only: server logs may quote what servers
    were sent and answered."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def owner_only(path: str, flags: int) -> int:
    """`open()`'s opener for a file only this user may read (a log file)."""
    return os.open(path, flags, 0o600)
