"""Prometheus metrics for every server (`GET /metrics`), the head server included.

Families every server exposes:

- `gymfleet_requests_total{route, method, status}`, `gymfleet_request_seconds{route}` (histogram),
  `gymfleet_requests_in_flight`. `route` is the matched route's template (`/verify`, `/{tool}`), so arbitrary
  paths never make new series; a request no route matched is `route="unmatched"`.
- `gymfleet_failures_total{failure_class, hop}`: infrastructure failures by class (`timeout`, `connection_error`,
  `judge_failed`, `server_error`, ...) and by the hop that failed: a fleet instance name (`policy_model`), an
  upstream base URL (`http://vllm:8000`), or `local` (this server's own code: an unhandled error, a verify past
  its deadline). Calls that did not say which hop count as `unknown`.
- `process_resident_memory_bytes`, `process_cpu_seconds_total`, `process_open_fds`, ... (prometheus_client's
  `ProcessCollector`, read from `/proc` at each scrape).
- `gymfleet_upstream_seconds{target}` (histogram, per attempt) and `gymfleet_upstream_requests_total{target,
  outcome}`: every call this process made through `gymfleet.http`, by target (the instance name when called by
  name, else the base URL: model servers' vLLM/OpenAI endpoints, the sandbox) and outcome (`2xx`, `4xx`, `5xx`,
  `timeout`, `connection_error`). These two are per process, shared by every app the process serves.

Resources servers add, per environment (the instance name) and task (the row's first field of `TASK_FIELDS`):

- `gymfleet_reward{environment, task}` (histogram over [0, 1]: `_count` is the number of scored rows, `_sum` /
  `_count` the mean reward);
- `gymfleet_verify_results_total{environment, task, outcome}`: `outcome` is `scored` or the row's
  `_ng_failure_class`. Failure rows are never rewards: they count here, not in `gymfleet_reward`, so an
  environment's infrastructure-failure share is `outcome != "scored"` over all;
- `gymfleet_infra_failure_share{environment}` (gauge): exactly that share, failure answers over all `/verify`
  answers since the server started, computed from `gymfleet_verify_results_total` at each scrape (a broken judge
  or sandbox shows here before it shows as a flat reward curve). Present once the server has answered a `/verify`.

Label cardinality is bounded: at most `MAX_TASKS` task values per environment, `MAX_TARGETS` upstream targets and
`MAX_FAILURE_CLASSES` outcome values (later ones count as `other`); values are cut to `MAX_LABEL_CHARS`.

Each app gets its own registry (so tests can build many apps in one process). With `num_workers > 1`, each worker
process has its own registry, and a scrape reads whichever worker answers it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

from gymfleet.masking import mask_text

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
UNMATCHED = "unmatched"
OTHER = "other"
LOCAL_HOP = "local"
UNKNOWN_HOP = "unknown"
SCORED = "scored"

TASK_FIELDS = ("task", "category", "subset_for_metrics", "subset", "dataset", "dataset_name")
"""Row fields naming a row's task, first present wins (NeMo-Gym datasets use `category` and `subset_for_metrics`;
per-row ids such as `task_id` or `_ng_task_index` are not tasks). A row with none is `task="none"`."""
MAX_TASKS = 32
MAX_TARGETS = 64
MAX_FAILURE_CLASSES = 16
MAX_LABEL_CHARS = 64


class BoundedLabel:
    """Maps values to at most `limit` distinct label values; values first seen after that are `other`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        value = value[:MAX_LABEL_CHARS]
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


# ------------------------------------------------------------------------------------ upstream calls (per process)

UPSTREAM_LATENCY = Histogram(
    "gymfleet_upstream_seconds",
    "Latency of one call attempt this process made to another server or upstream",
    ["target"],
    buckets=LATENCY_BUCKETS_S,
    registry=None,
)
UPSTREAM_CALLS = Counter(
    "gymfleet_upstream_requests",
    "Call attempts this process made to another server or upstream, by outcome",
    ["target", "outcome"],
    registry=None,
)
_targets = BoundedLabel(MAX_TARGETS)
_instance_at: dict[str, str] = {}


def name_instance(base_url: str, name: str) -> None:
    """Record that fleet instance `name` serves at `base_url`, so calls and failures there are labelled `name`."""
    _instance_at[base_url] = name


def target_of(url: str | None) -> str:
    """The `target`/`hop` label of a URL: the instance serving it if known, else its base URL (no path)."""
    if not url:
        return UNKNOWN_HOP
    slash = url.find("/", url.find("//") + 2)  # the end of `scheme://host:port`
    base = url if slash < 0 else url[:slash]
    if "@" in base:  # a base URL's credentials never become a label
        base = mask_text(base)
    return _targets(_instance_at.get(base, base))


_upstream_children: dict[tuple[str, str], tuple[Any, Any]] = {}


def observe_upstream(target: str, seconds: float, outcome: str) -> None:
    """Count one call attempt to `target` (a label from `target_of`, or an instance name) and its latency."""
    children = _upstream_children.get((target, outcome))
    if children is None:
        children = _upstream_children[target, outcome] = (
            UPSTREAM_LATENCY.labels(target), UPSTREAM_CALLS.labels(target, outcome)
        )
    children[0].observe(seconds)
    children[1].inc()


# ------------------------------------------------------------------------------------------------- one server


class Failures:
    """`gymfleet_failures_total{failure_class, hop}`; `labels(failure_class)` alone counts under `hop="unknown"`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counter = Counter(
            "gymfleet_failures", "Infrastructure failures by class and failing hop", ["failure_class", "hop"],
            registry=registry,
        )
        self._classes = BoundedLabel(MAX_FAILURE_CLASSES)

    def labels(self, failure_class: str, hop: str = UNKNOWN_HOP) -> Any:
        return self.counter.labels(self._classes(failure_class), hop)


class ServerMetrics:
    """The metric families one server exposes (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gymfleet_requests", "HTTP requests handled", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "gymfleet_request_seconds", "Request latency", ["route"], buckets=LATENCY_BUCKETS_S, registry=self.registry
        )
        self.in_flight = Gauge("gymfleet_requests_in_flight", "Requests being handled", registry=self.registry)
        self.failures = Failures(self.registry)
        ProcessCollector(registry=self.registry)
        self.registry.register(UPSTREAM_LATENCY)
        self.registry.register(UPSTREAM_CALLS)
        self._rewards: Histogram | None = None
        self._results: Counter | None = None
        self._tasks: dict[str, BoundedLabel] = {}
        self._outcomes = BoundedLabel(MAX_FAILURE_CLASSES)
        self._scored: dict[tuple[str, str], tuple[Any, Any]] = {}
        """The children a scored row counts in, by (environment, task label): no `.labels()` lookup per row."""

    def record_verify(self, environment: str, row: dict[str, Any]) -> None:
        """Count one `/verify` answer: its reward if scored, its `_ng_failure_class` if a failure row."""
        if self._rewards is None:
            self._rewards = Histogram(
                "gymfleet_reward", "Rewards of scored /verify rows", ["environment", "task"],
                buckets=REWARD_BUCKETS, registry=self.registry,
            )
            self._results = Counter(
                "gymfleet_verify_results", "/verify answers: scored, or the infrastructure failure class",
                ["environment", "task", "outcome"], registry=self.registry,
            )
            self.registry.register(_InfraShareCollector(self._results))
        tasks = self._tasks.get(environment)
        if tasks is None:
            tasks = self._tasks[environment] = BoundedLabel(MAX_TASKS)
        task = tasks(task_of(row))
        failure_class = row.get("_ng_failure_class")
        if failure_class:
            self._results.labels(environment, task, self._outcomes(str(failure_class))).inc()
            return
        children = self._scored.get((environment, task))
        if children is None:
            children = self._scored[environment, task] = (
                self._results.labels(environment, task, SCORED), self._rewards.labels(environment, task)
            )
        children[0].inc()
        children[1].observe(row["reward"])

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def task_of(row: dict[str, Any]) -> str:
    """The task label of a row: its first `TASK_FIELDS` field holding a string or integer, else `none`."""
    for field in TASK_FIELDS:
        value = row.get(field)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return "none"


INFRA_SHARE_HELP = (
    "Share of /verify answers that were infrastructure failures (a _ng_failure_class row: judge, sandbox, inner "
    "call, deadline) among all /verify answers of the environment since the server started"
)


class _InfraShareCollector:
    """`gymfleet_infra_failure_share{environment}`, computed from `gymfleet_verify_results_total` at each scrape."""

    def __init__(self, results: Counter) -> None:
        self.results = results

    def collect(self) -> Iterator[Metric]:
        answers: dict[str, float] = {}
        failures: dict[str, float] = {}
        for metric in self.results.collect():
            for sample in metric.samples:
                if not sample.name.endswith("_total"):
                    continue
                environment = sample.labels["environment"]
                answers[environment] = answers.get(environment, 0.0) + sample.value
                if sample.labels["outcome"] != SCORED:
                    failures[environment] = failures.get(environment, 0.0) + sample.value
        family = GaugeMetricFamily("gymfleet_infra_failure_share", INFRA_SHARE_HELP, labels=["environment"])
        for environment, total in sorted(answers.items()):
            family.add_metric([environment], failures.get(environment, 0.0) / total if total else 0.0)
        yield family


class _RestartsCollector:
    """`gymfleet_server_restarts_total{instance}`, read from the supervisor's process table at each scrape."""

    def __init__(self, processes: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.processes = processes

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "gymfleet_server_restarts", "Restarts of crashed servers by the fleet supervisor", labels=["instance"]
        )
        for name, state in sorted(self.processes().items()):
            family.add_metric([name], state.get("restarts", 0))
        yield family


def fleet_metrics(processes: Callable[[], dict[str, dict[str, Any]]]) -> ServerMetrics:
    """The head server's metrics: a server's families plus the supervisor's restarts per instance
    (`processes()` gives per instance a dict with `restarts`; see `Fleet`)."""
    metrics = ServerMetrics()
    metrics.registry.register(_RestartsCollector(processes))
    return metrics


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
"""Methods labelled as themselves; any other token a client sends counts as `method="other"`."""


@dataclasses.dataclass(eq=False)
class MetricsMiddleware:
    """Pure ASGI middleware recording every HTTP request into a `ServerMetrics`.

    The route label is the matched route's template. FastAPI routes leave themselves in `scope["route"]`; plain
    Starlette routes (`gymfleet.serving.server.add_route`, `/metrics`, `/openapi.json`) only leave their endpoint,
    which is mapped back to its route's template once and cached. The metric children of each (route, method,
    status) are cached too, and the in-flight gauge reads a plain counter at scrape time: recording costs a few µs a
    request (`bench/metrics_cost.py`).

    `on_idle`, when given, is called once each time the server falls quiet (no request in flight, none ended for
    `quiet_s`) after serving at least `burst` requests since the last call: the moment to hand the memory a burst
    of rollouts used back to the OS. (Counting requests, not the in-flight peak: a burst of 2,000 rollouts may hold
    2,000 connections and sessions while only a few dozen requests are in flight at any moment.)
    """

    app: Any
    metrics: ServerMetrics
    on_idle: Callable[[], None] | None = None
    burst: int = 1000
    quiet_s: float = 2.0
    _in_flight: int = dataclasses.field(default=0, init=False)
    _served: int = dataclasses.field(default=0, init=False)
    _last_end: float = dataclasses.field(default=0.0, init=False)
    _armed: bool = dataclasses.field(default=False, init=False)
    _templates: dict[Any, str] = dataclasses.field(default_factory=dict, init=False)
    _children: dict[tuple[str, str, int], tuple[Any, Any]] = dataclasses.field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.metrics.in_flight.set_function(lambda: self._in_flight)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def record_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self._in_flight += 1
        try:
            await self.app(scope, receive, record_status)
        finally:
            self._in_flight -= 1
            if self.on_idle is not None:
                self._served += 1
                self._last_end = time.monotonic()
                if self._served >= self.burst and not self._armed:
                    self._armed = True
                    asyncio.get_running_loop().call_later(self.quiet_s, self._when_quiet)
            method = scope["method"]
            key = (self._route(scope), method if method in HTTP_METHODS else OTHER, status)
            children = self._children.get(key)
            if children is None:
                children = self._children[key] = self._new_children(*key)
            children[0].inc()
            children[1].observe(time.perf_counter() - start)

    def _when_quiet(self) -> None:
        """Call `on_idle` if nothing happened for `quiet_s`; else look again `quiet_s` later."""
        if self._in_flight == 0 and time.monotonic() - self._last_end >= self.quiet_s:
            self._armed, self._served = False, 0
            self.on_idle()
        else:
            asyncio.get_running_loop().call_later(self.quiet_s, self._when_quiet)

    def _new_children(self, route: str, method: str, status: int) -> tuple[Any, Any]:
        return self.metrics.requests.labels(route, method, str(status)), self.metrics.latency.labels(route)

    def _route(self, scope) -> str:
        route = scope.get("route")
        if route is not None:
            return getattr(route, "path", None) or UNMATCHED
        endpoint = scope.get("endpoint")
        if endpoint is None:
            return UNMATCHED
        template = self._templates.get(endpoint)
        if template is None:
            router = scope.get("router")
            routes = getattr(router, "routes", ())
            template = next((r.path for r in routes if getattr(r, "endpoint", None) == endpoint), UNMATCHED)
            self._templates[endpoint] = template
        return template
