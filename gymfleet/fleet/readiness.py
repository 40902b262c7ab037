"""Start-up readiness of a fleet: which servers answer as this fleet's own, and which model endpoints answer.

The `Fleet` of `gymfleet.fleet.supervisor` is made of this, `gymfleet.fleet.server_start` and its own process table;
this module also holds that table's entry (`_Child`) and `ServerCrashedError`, which the wait for readiness raises.
`start()` returns once every instance answers `GET /` as this fleet's own server (the fleet's random token
and the instance name in its headers, see `gymfleet.serving.server`; another process on the same port never counts),
ready (a server whose warm-up is a start-up check, the sandbox's isolation self-test, is ready once it passed; when
it failed, `start()` raises `StartupCheckFailed` with its error at once: `gymfleet.serving.warm_up`) and
every upstream `base_url` answers, if configured.

The fleet says what it does while it starts: one line per server as it is spawned (name, implementation, URL, pid,
log file), which servers are ready and which are not yet (`gymfleet.progress`: a bar on a terminal, a plain line
every `START_REPORT_EVERY_S` elsewhere), and the model endpoints it waits for. Those (every `*base_url` of a model
server, NeMo-Gym's readiness rule) are probed in the background from the first moment of `start()`, so an
unreachable policy URL is named within a second, then every `ENDPOINT_REPORT_EVERY_S` with the time so far and the
timeout (`model_endpoint_readiness_timeout_seconds`, default 600 s from the start; 0: no wait). Until its endpoints
answer, a model server's status in `/server_instances` is `waiting for upstream` rather than `running`.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gymfleet.auth import TOKEN_HEADER
from gymfleet.errors import ConfigError, GymfleetError
from gymfleet.fleet.config_instances import GlobalConfig, ServerInstance
from gymfleet.fleet.credential import check_failed, probe_server
from gymfleet.fleet.launch import EXIT_PORT_IN_USE, PortInUseError
from gymfleet.fleet.zygote import EXIT_UNKNOWN, ForkedProcess
from gymfleet.progress import Progress

__all__ = ["ServerCrashedError", "WAITING_FOR_UPSTREAM"]

TAIL_LINES = 40
POLL_INTERVAL_S = 0.1
READY_WAIT_S = 0.5
"""How long a start-up probe lets a server that is warming up before it counts as ready (the sandbox's self-test) wait
for its verdict before answering (`gymfleet.serving.warm_up`): it is seen the moment it is in, not a poll later."""
START_REPORT_EVERY_S = 5.0
"""While the fleet starts and its output is not a terminal: seconds between progress lines."""
WAITING_FOR_UPSTREAM = "waiting for upstream"
"""A model server's status while one of its upstream endpoints does not answer yet (`/server_instances`)."""
ENDPOINT_PROBE_TIMEOUT_S = 2.0
ENDPOINT_PROBE_INTERVAL_S = 1.0
INTERNAL_PROBE_INTERVAL_S = 0.1
"""Between probes of a model endpoint the fleet serves itself (a scripted policy): a refused local connect is free."""
ENDPOINT_ANNOUNCE_AFTER_S = 0.5
"""A model endpoint that has not answered this long (or refused) is named as waited for at once."""
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1")
ENDPOINT_REPORT_EVERY_S = 10.0
"""Seconds between "still waiting for" lines about a model endpoint."""


class ServerCrashedError(GymfleetError, RuntimeError):
    """A server process of the fleet exited (a RuntimeError too, as NeMo-Gym's `poll()` raises)."""


@dataclass
class _Child:
    """One supervised server instance; kept across restarts (its `process` is replaced)."""

    instance: ServerInstance
    process: subprocess.Popen | ForkedProcess
    start_time: float
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    restarts: int = 0
    """Restarts done so far (all time)."""
    ready: bool = False
    state: str = "starting"
    """starting (first start), running, restarting (dead and due back, or back and not answering yet), failed."""
    crashes: collections.deque = field(default_factory=collections.deque)
    """Monotonic times of the crashes restarted within the last `RESTART_WINDOW_S`."""
    restart_at: float | None = None
    """When a dead server is due to be started again (monotonic); None while a process is meant to run."""
    deadline: float = 0.0
    """While restarting: when waiting for its port (before the spawn) or its answer (after) gives up."""
    failure: GymfleetError | None = None
    """Why it cannot be brought back (state failed)."""


class Readiness:
    """Waiting, while `Fleet.start()` runs, until every server answers and every model endpoint does, with progress."""

    def _wait_ready(self, timeout_s: float, report: bool = False) -> None:
        """Return once every server answers. While starting, any exit raises; once started, crashed servers are
        restarted (see `poll()`) and waited for, and only one that cannot be brought back raises. With `report`,
        show which servers are ready and which are not yet (`gymfleet.progress`)."""
        deadline = time.monotonic() + timeout_s
        progress = self._open_progress(len(self.children), "Servers ready", "server") if report else None
        try:
            while pending := self._not_ready():
                if time.monotonic() > deadline:
                    names = ", ".join(sorted(child.instance.name for child in pending))
                    raise ServerCrashedError(
                        f"servers not ready after {timeout_s:g}s: {names}"
                        + "".join(self._tail_text(c) for c in pending)
                    )
                if progress is not None:
                    progress.update(len(self.children) - len(pending) - progress.done)
                    progress.set_status(f"not yet: {_names(c.instance.name for c in pending)} (timeout "
                                        f"{timeout_s:g} s){self._endpoints_status()}")
                    progress.tick()
                time.sleep(POLL_INTERVAL_S)
            if progress is not None:
                progress.update(len(self.children) - progress.done)
                progress.set_status(self._endpoints_status().removeprefix("; "))
        finally:
            self._close_progress(progress)

    def _open_progress(self, total: int, desc: str, unit: str) -> Progress:
        progress = Progress(total, desc, unit=unit, file=self.output, every_s=START_REPORT_EVERY_S)
        with self._lock:
            self._progress = progress
        return progress

    def _close_progress(self, progress: Progress | None) -> None:
        if progress is None:
            return
        with self._lock:
            self._progress = None
            progress.close()

    def _endpoints_status(self) -> str:
        """`; waiting for model endpoint(s) URL, ... (N s so far, timeout T s)`, or nothing."""
        watch = self._endpoints
        if watch is None or not (pending := watch.pending()):
            return ""
        return (f"; waiting for model endpoint(s) {_names(pending)} ({watch.elapsed_s():.0f} s so far, timeout "
                f"{watch.timeout_s:g} s)")

    def _not_ready(self) -> list[_Child]:
        """The servers that do not answer yet (marking those that now do)."""
        if self._started:
            self.poll()
            return [child for child in self.children.values() if child.state != "running"]
        pending = []
        for child in self.children.values():
            if not child.ready:
                self._check_alive(child)
                answer = probe_server(child.instance.url, self.token, child.instance.name, wait_s=READY_WAIT_S)
                if answer is not None and answer.failure is not None:
                    raise check_failed(child.instance.name, child.instance.path, answer.failure)
                if answer is not None and answer.ready:
                    child.ready, child.state = True, "running"
                else:
                    pending.append(child)
        return pending

    def _wait_model_endpoints(self) -> None:
        """Wait until every model endpoint answers (probed since `start()` began), showing which are pending.

        Raises:
            ConfigError: some did not answer within `model_endpoint_readiness_timeout_seconds` of the start.
        """
        watch = self._endpoints
        if watch is None or not watch.pending():
            return
        progress = self._open_progress(len(watch.urls), "Model endpoints answering", "endpoint")
        try:
            while pending := watch.pending():
                if watch.elapsed_s() > watch.timeout_s:
                    raise ConfigError(
                        f"model endpoints not reachable after {watch.timeout_s:g}s: {sorted(pending)}"
                        f"{watch.errors_text()}; check policy_base_url / base_url (or set "
                        "model_endpoint_readiness_timeout_seconds=0)"
                    )
                progress.update(len(watch.urls) - len(pending) - progress.done)
                progress.set_status(self._endpoints_status().removeprefix("; "))
                progress.tick()
                time.sleep(POLL_INTERVAL_S)
            progress.update(len(watch.urls) - progress.done)
            progress.set_status("")
        finally:
            self._close_progress(progress)

    def _tail_text(self, child: _Child) -> str:
        lines = "\n".join(f"    {line}" for line in child.tail) or "    (no output)"
        return f"\n  last output of {child.instance.name}:\n{lines}"

    def _check_alive(self, child: _Child) -> None:
        """While the fleet starts: raise if `child` exited (`PortInUseError` for a taken port)."""
        code = child.process.poll()
        if code is None:
            return
        if code == EXIT_PORT_IN_USE:
            raise PortInUseError(child.instance.port, f"{child.instance.path}.port")
        time.sleep(0.1)  # let the log pump drain the last lines
        raise ServerCrashedError(
            f"server {child.instance.name!r} exited unexpectedly with {_exit_text(code)}{_last_error(child.tail)}"
            + self._tail_text(child)
        )


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Exit)\b.*:\s*\S")


def _last_error(tail: Iterable[str]) -> str:
    """`: <the exception>` from a dead server's last lines (its traceback's last error line), so the first line of
    the report says why; empty when none is there.

    Examples:
        >>> _last_error(["Traceback (most recent call last):", '  File "app.py", line 3', "RuntimeError: no data"])
        ': RuntimeError: no data'
        >>> _last_error(["INFO started", "killed"])
        ''
    """
    for line in reversed(list(tail)):
        text = line.strip()
        if _ERROR_LINE.match(text):
            return f": {text[:300]}"
    return ""


def _exit_text(code: int) -> str:
    """`code -9 (SIGKILL)` for a process killed by a signal, `code 3` otherwise."""
    if code == EXIT_UNKNOWN:
        return "an unknown code (it was forked by a zygote that died before it, so nobody could collect it)"
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"code {code}"
    return f"code {code}"


def _model_endpoint_urls(config: GlobalConfig) -> dict[str, list[str]]:
    """Probe URL -> the model server instances using it, for every `*base_url` value under model servers
    (NeMo-Gym's readiness rule)."""
    urls: dict[str, list[str]] = {}
    for instance in config.instances_of("responses_api_models"):
        for key, value in instance.fields.items():
            if not key.endswith("base_url"):
                continue
            for url in value if isinstance(value, list) else [value]:
                if isinstance(url, str) and url.startswith("http"):
                    url = url.rstrip("/")
                    users = urls.setdefault(url + "/models" if url.endswith("/v1") else url, [])
                    if instance.name not in users:
                        users.append(instance.name)
    return urls


def _names(names: Any, limit: int = 6) -> str:
    """`a, b, c` (sorted), or `a, b, c, ... (+4 more)` past `limit`."""
    names = sorted(names)
    more = f", ... (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class _EndpointWatch:
    """Probes every model endpoint (one thread per URL, any HTTP answer counts) until each answers or `stop()`.

    It says (through `say`) which URL it waits for as soon as a probe fails or `ENDPOINT_ANNOUNCE_AFTER_S` pass
    without an answer, then every `ENDPOINT_REPORT_EVERY_S` how long so far and the timeout, and when one answers.
    Giving up is the fleet's decision (`Fleet._wait_model_endpoints`); the watch only observes.
    """

    def __init__(self, urls: dict[str, list[str]], timeout_s: float, say: Any, internal: frozenset[str] = frozenset(),
                 token: str | None = None):
        self.urls = urls
        self.internal = internal
        """URLs served by the fleet's own servers (a scripted policy): their start is reported as theirs, not here."""
        self._token = token
        """The fleet's token, shown to its own servers' URLs (never to a policy outside it), so that they do not log
        the probe as a refused request."""
        self.timeout_s = timeout_s
        self._say = say
        self.started = time.monotonic()
        self._answered: dict[str, float] = {}
        self._errors: dict[str, str] = {}
        self._announced: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._probe, args=(url,), name=f"probe-{url}", daemon=True)
                         for url in urls]
        self._threads.append(threading.Thread(target=self._report, name="probe-report", daemon=True))
        for thread in self._threads:
            thread.start()

    @classmethod
    def for_config(cls, config: GlobalConfig, say: Any, token: str | None = None) -> _EndpointWatch | None:
        """A running watch over `config`'s model endpoints; None when there are none or the check is off. `token`:
        the fleet's, for the endpoints its own servers serve."""
        timeout_s = float(config.data.get("model_endpoint_readiness_timeout_seconds", 600))
        urls = _model_endpoint_urls(config)
        own = {(host, instance.port) for instance in config.instances.values()
               for host in (instance.host, *LOCAL_HOSTS)}
        internal = frozenset(url for url in urls if (urllib.parse.urlsplit(url).hostname,
                                                     urllib.parse.urlsplit(url).port) in own)
        return cls(urls, timeout_s, say, internal, token) if timeout_s > 0 and urls else None

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def pending(self, instance: str | None = None) -> list[str]:
        """URLs that have not answered yet (only those `instance` uses, if given)."""
        with self._lock:
            return [url for url, users in self.urls.items()
                    if url not in self._answered and (instance is None or instance in users)]

    def errors_text(self) -> str:
        with self._lock:
            errors = [f"{url}: {error}" for url, error in self._errors.items() if url not in self._answered]
        return f" ({'; '.join(errors)})" if errors else ""

    def stop(self) -> None:
        self._stop.set()

    def _probe(self, url: str) -> None:
        while not self._stop.is_set():
            token = self._token if url in self.internal else None
            error = _probe_error(url, ENDPOINT_PROBE_TIMEOUT_S, {TOKEN_HEADER: token} if token else None)
            with self._lock:
                if error is None:
                    self._answered[url] = self.elapsed_s()
                    announced = url in self._announced
                else:
                    self._errors[url] = error
            if error is None:
                if announced:
                    self._say(f"model endpoint {url} answers (after {self._answered[url]:.1f} s)")
                return
            self._announce(url, error)
            # The fleet's own (scripted) model comes up with its servers: asked often, the fleet is ready with it.
            self._stop.wait(INTERNAL_PROBE_INTERVAL_S if url in self.internal else ENDPOINT_PROBE_INTERVAL_S)

    def _announce(self, url: str, error: str | None) -> bool:
        """Name `url` as waited for, once; whether this call did."""
        with self._lock:
            if url in self._announced or url in self._answered or url in self.internal:
                return False
            self._announced.add(url)
        users = ", ".join(self.urls[url])
        self._say(f"waiting for model endpoint {url} (used by {users}): {error or 'no answer yet'}; "
                  f"timeout {self.timeout_s:g} s (model_endpoint_readiness_timeout_seconds)")
        return True

    def _report(self) -> None:
        last_report: dict[str, float] = {}
        while not self._stop.wait(0.1):
            pending = self.pending()
            if not pending:
                return
            elapsed = self.elapsed_s()
            for url in pending:
                with self._lock:
                    error = self._errors.get(url)
                    first = url not in self._announced
                if url in self.internal:
                    continue
                if first:
                    if elapsed >= ENDPOINT_ANNOUNCE_AFTER_S and self._announce(url, error):
                        last_report[url] = elapsed
                    continue
                last_report.setdefault(url, elapsed)
                if elapsed - last_report[url] >= ENDPOINT_REPORT_EVERY_S:
                    last_report[url] = elapsed
                    self._say(f"still waiting for model endpoint {url}: {error or 'no answer yet'} "
                              f"({elapsed:.0f} s so far, timeout {self.timeout_s:g} s)")


def _probe_error(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> str | None:
    """None when `url` gives any HTTP answer, else why not (`connection refused`, `timed out`, ...)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as exc:
        reason = exc.reason
        return str(getattr(reason, "strerror", None) or reason).lower()
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
