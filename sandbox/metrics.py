"""The sandbox's own Prometheus families, added to the server's registry (so `GET /metrics` shows them)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sandbox.admission import Admission
from sandbox.cgroups import Hierarchy

RUN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class SandboxMetrics:
    """Runs by status, queue depth, runs in progress, memory budget and admitted, run durations, refusals, open
    sessions."""

    def __init__(self, registry: CollectorRegistry, admission: Admission):
        self.runs = Counter(
            "gymfleet_sandbox_runs", "Program runs (cases and session execs) by language and status",
            ["language", "status"], registry=registry,
        )  # fmt: skip
        self.duration = Histogram(
            "gymfleet_sandbox_run_seconds", "Program run time inside the sandbox", ["language"],
            buckets=RUN_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "gymfleet_sandbox_queue_depth", "Requests waiting for a run slot or memory", registry=registry
        )
        self.queue_depth.set_function(lambda: admission.waiting)
        self.running = Gauge("gymfleet_sandbox_running", "Sandboxes running a request", registry=registry)
        self.running.set_function(lambda: admission.running)
        self.memory_budget = Gauge(
            "gymfleet_sandbox_memory_budget_bytes", "Memory that the runs and sessions admitted at once may ask for",
            registry=registry,
        )  # fmt: skip
        self.memory_budget.set_function(lambda: admission.memory_budget_mb << 20)
        self.memory_admitted = Gauge(
            "gymfleet_sandbox_memory_admitted_bytes", "Memory (memory_mb) of the runs and sessions admitted now",
            registry=registry,
        )  # fmt: skip
        self.memory_admitted.set_function(lambda: admission.admitted_mb << 20)
        self.waiting_for_memory = Gauge(
            "gymfleet_sandbox_waiting_for_memory", "Requests in the queue held back by the memory budget",
            registry=registry,
        )  # fmt: skip
        self.waiting_for_memory.set_function(lambda: admission.waiting_for_memory)
        self.rejected = Counter(
            "gymfleet_sandbox_rejected", "Requests refused with 429", ["reason"], registry=registry
        )
        self.sessions = Gauge("gymfleet_sandbox_sessions", "Open sessions", registry=registry)
        self._registry = registry

    def count_cgroups(self, hierarchy: Hierarchy | None) -> None:
        """Export the memory the sandboxes' cgroups hold now (where there are cgroups: `sandbox.cgroups`)."""
        if hierarchy is not None:
            used = Gauge("gymfleet_sandbox_memory_used_bytes", "Memory the running sandboxes' cgroups hold now",
                         registry=self._registry)
            used.set_function(hierarchy.used_bytes)

    def observe(self, language: str, status: str, duration_s: float) -> None:
        self.runs.labels(language, status).inc()
        self.duration.labels(language).observe(duration_s)
