"""Reading a running fleet from outside, for the bench scripts: its head server's answers (with the fleet's
token), each server's pid and address, and latency histograms summed over the servers' `/metrics`.

`head` is the head server's config (`RunHelper.head_server_config`: its `host` and `port`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gymfleet import auth


def head_host(head: Any) -> str:
    """The address to reach the head server at (loopback where it listens on every interface)."""
    return "127.0.0.1" if head.host in ("0.0.0.0", "::", "") else head.host


def head_get(head: Any, url_path: str, base_url: str | None = None) -> httpx.Response:
    """GET `url_path` from the head server (or from `base_url`, a server of the same fleet) with the fleet's token."""
    base = base_url or f"http://{head_host(head)}:{head.port}"
    response = httpx.get(f"{base}{url_path}", headers=auth.head_headers(head.host, head.port), timeout=60)
    return response.raise_for_status()


def instance_pids(head: Any) -> dict[int, str]:
    """Each server's pid -> its instance name, from the head server (`GET /server_instances`)."""
    return {row["pid"]: row["process_name"] for row in head_get(head, "/server_instances").json() if row.get("pid")}


def server_urls(head: Any) -> list[tuple[str, str]]:
    """(instance, base URL) of every server and, under Ray placement, of every replica (`/server_instances`)."""
    rows = head_get(head, "/server_instances").json()
    return [(row["process_name"], f"http://{replica['host']}:{replica['port']}")
            for row in rows for replica in (row.get("replicas") or [row])]


def scrape(head: Any, url: str) -> list:
    """The samples of the `/metrics` of the fleet's server at `url`."""
    text = head_get(head, "/metrics", url).text
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


class Buckets:
    """A histogram summed over scrapes: cumulative count per upper bound."""

    def __init__(self):
        self.cumulative: dict[float, float] = defaultdict(float)

    def add(self, sample) -> None:
        self.cumulative[float(sample.labels["le"])] += sample.value

    def quantile(self, q: float) -> str:
        """Prometheus' `histogram_quantile`: linear within the bucket that holds the q-th observation."""
        bounds = sorted(self.cumulative)
        total = self.cumulative[bounds[-1]] if bounds else 0
        if not total:
            return "-"
        rank, lower, below = q * total, 0.0, 0.0
        for bound in bounds:
            count = self.cumulative[bound]
            if count >= rank:
                if math.isinf(bound):
                    return f">{lower:g} s"
                share = (rank - below) / (count - below) if count > below else 1.0
                return _seconds(lower + (bound - lower) * share)
            lower, below = bound, count
        return "-"

    @property
    def count(self) -> int:
        return int(max(self.cumulative.values(), default=0))


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
