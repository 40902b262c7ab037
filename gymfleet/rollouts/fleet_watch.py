"""The fleet as a rollout collection sees it: where the head server is, and whether the fleet is down.

- `head_address`: `(host, port)` of the head server.
- `FleetWatch`: counts each agent's `connection_error`s in a row and asks the head server whether the fleet is up
  (the policy is in `gymfleet.rollouts.collect`'s docstring).
- `summarized_warnings`: repeated HTTP retry warnings are summarized, not printed one per rollout.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson

from gymfleet import auth, http
from gymfleet.errors import TransportError
from gymfleet.http import RetryPolicy

log = logging.getLogger(__name__)

HEAD_PROBE = RetryPolicy(max_attempts=2, retry_statuses=frozenset())
DEFAULT_HEAD = ("127.0.0.1", 11000)


def head_address(head_server_config: Any = None) -> tuple[str, int]:
    """`(host, port)` to reach the head server named by a `{host, port}` dict or object (None: 127.0.0.1:11000);
    a bind-all host means this machine."""
    if head_server_config is None:
        host, port = DEFAULT_HEAD
    elif isinstance(head_server_config, dict):
        host, port = head_server_config["host"], head_server_config["port"]
    else:
        host, port = head_server_config.host, head_server_config.port
    host = str(host)
    return ("127.0.0.1" if host in ("", "0.0.0.0", "::") else host), int(port)


async def _probe_head(head: tuple[str, int]) -> tuple[bool, list[str]]:
    """Whether the head server answers, and the servers its `/server_instances` lists as not running."""
    url = f"http://{head[0]}:{head[1]}/server_instances"
    auth.grant(url, auth.token_for(*head))
    try:
        response = await http.request("GET", url, timeout_s=10.0, retry=HEAD_PROBE)
    except TransportError:
        return False, []
    try:
        listed = response.json()
    except orjson.JSONDecodeError:
        listed = None
    if not isinstance(listed, list):
        return True, []
    return True, [f"{entry.get('process_name')} ({entry['status']})" for entry in listed
                  if isinstance(entry, dict) and entry.get("status") not in (None, "running", "unknown")]


class FleetWatch:
    """Tells a dead fleet from the rollouts' outcomes (the policy is in `gymfleet.rollouts.collect`'s docstring)."""

    def __init__(self, threshold: int | None, head: tuple[str, int] | None) -> None:
        self.threshold = threshold
        self.head = head
        self.runs: Counter[str] = Counter()
        """Per agent: how many of its latest rollouts in a row failed with `connection_error`."""
        self.not_running: list[str] = []

    async def stop_reason(self, record: dict[str, Any]) -> str | None:
        """Count `record`'s outcome; return why the collection must stop now, or None."""
        agent = record["agent_ref"]["name"]
        if record.get("_ng_failure_class") != "connection_error":
            self.runs[agent] = 0
            return None
        self.runs[agent] += 1
        run = self.runs[agent]
        if self.threshold is None or run < self.threshold:
            return None
        if run == self.threshold and self.head is not None:
            answers, self.not_running = await _probe_head(self.head)
            if not answers:
                return (f"{run} rollouts of {agent} in a row could not connect, and the head server at "
                        f"{self.head[0]}:{self.head[1]} does not answer: the fleet is down")
            log.warning("%d rollouts of %s in a row could not connect, but the head server answers%s; going on "
                        "(stopping if this goes on for %d rollouts)", run, agent, self._not_running(),
                        2 * self.threshold)
        if run < 2 * self.threshold:
            return None
        return f"{run} rollouts of {agent} in a row could not connect{self._not_running()}"

    def _not_running(self) -> str:
        return f" (servers not running: {', '.join(self.not_running)})" if self.not_running else ""


class _RepeatedWarnings(logging.Filter):
    """Lets the first `shown` records through (whatever their message) and counts the others per message template."""

    def __init__(self, shown: int = 5) -> None:
        super().__init__()
        self.shown = shown
        self.passed = 0
        self.counts: Counter[str] = Counter()
        """Records held back, per message template."""
        self.example: dict[str, str] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if self.passed < self.shown:
            self.passed += 1
            return True
        template = str(record.msg)
        self.counts[template] += 1
        self.example.setdefault(template, record.getMessage())
        return False


@contextlib.contextmanager
def summarized_warnings(logger: logging.Logger) -> Iterator[None]:
    """Within the block, `logger` prints each kind of warning a few times; one line then counts the rest."""
    repeated = _RepeatedWarnings()
    logger.addFilter(repeated)
    try:
        yield
    finally:
        logger.removeFilter(repeated)
        for template, example in repeated.example.items():
            log.warning("%d more warnings like this one were not shown: %s", repeated.counts[template], example)
