"""Prometheus metrics for every server: requests and latency per route, requests in flight, failures by class.

Each app gets its own registry (so tests can build many apps in one process); `GET /metrics` renders it.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ServerMetrics:
    """The metric families one server exposes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gymfleet_requests", "HTTP requests handled", ["route", "method", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "gymfleet_request_seconds", "Request latency", ["route"], buckets=LATENCY_BUCKETS_S, registry=self.registry
        )
        self.in_flight = Gauge("gymfleet_requests_in_flight", "Requests being handled", registry=self.registry)
        self.failures = Counter(
            "gymfleet_failures", "Infrastructure failures by class", ["failure_class"], registry=self.registry
        )

    async def endpoint(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class MetricsMiddleware:
    """Pure ASGI middleware recording every HTTP request into a `ServerMetrics`."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

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

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, record_status)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, scope["method"], str(status)).inc()
            self.metrics.latency.labels(path).observe(time.perf_counter() - start)
