"""`RolloutCollectionHelper`: the library entry point NeMo-RL drives rollouts through (`spec/protocol.md`, A.2).

`run_examples(rows, head_server_config)` starts every row's `POST /run` to its agent at once (no concurrency cap
unless a semaphore is given) and yields awaitables in completion order, each resolving to `(row, result)` with the
very row object passed in; a non-2xx answer raises `TransportError` with an integer `.status`. The requests go out in
row order, a window of them connecting at a time, and no more to an agent than it admits at once now and a margin:
the others wait their turn in this process rather than inside the agent, so sending a whole step does not slow its
first rollouts down (`gymfleet.rollouts.dispatch`; an agent with no bound gets every row at once). One
fleet's line is shared by every `run_examples` call on the same event loop: a later step queues behind an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator
from typing import Any

import orjson

from gymfleet import auth, http
from gymfleet.errors import TransportError
from gymfleet.fleet.config import client_limits
from gymfleet.http import ServerClient
from gymfleet.rollouts.collect import RUN_RETRY
from gymfleet.rollouts.dispatch import AgentLines, SendWindow, agent_name
from gymfleet.rollouts.fleet_watch import head_address


class RolloutCollectionHelper:
    """NeMo-RL's entry point: `run_examples(rows, head_server_config)` (`nemo_gym.rollout_collection`)."""

    def __init__(self, request_timeout_s: float = 3600.0) -> None:
        self.request_timeout_s = request_timeout_s
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Future[
            tuple[ServerClient, AgentLines]]]]
        self._clients = weakref.WeakKeyDictionary()

    def _client(self, head: tuple[str, int]) -> asyncio.Future[tuple[ServerClient, AgentLines]]:
        """One bootstrap per head and event loop (the client, and the fleet's agent lines), shared by concurrent
        `run_examples` calls; a failed one is redone."""
        per_loop = self._clients.setdefault(asyncio.get_running_loop(), {})
        future = per_loop.get(head)
        if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
            future = per_loop[head] = asyncio.ensure_future(_bootstrap(head))
        return future

    def run_examples(
        self,
        examples: list[dict[str, Any]],
        head_server_config: Any = None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> Iterator[asyncio.Future]:
        """Start one `POST <agent>/run` per row; yield awaitables in completion order, like `asyncio.as_completed`.

        Each awaitable resolves to `(row, result)` where `row` is the very object passed in. Must be called with an
        event loop running. No concurrency cap unless `semaphore` is given. The connection pool takes its limits
        from the fleet's `global_aiohttp_connector_limit[_per_host]` (set before this loop's first request).

        Raises (when awaited):
            TransportError: a non-2xx answer (integer `.status`, `.response_content`) or an unreachable agent.
        """
        if not examples:
            return iter([])
        client_task = self._client(head_address(head_server_config))
        window = SendWindow()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future] = [loop.create_future() for _ in examples]

        async def one(client: ServerClient, lines: AgentLines, row: dict[str, Any]) -> tuple[dict[str, Any],
                                                                                          dict[str, Any]]:
            async with semaphore or contextlib.nullcontext(), window.sending():
                response = await client.post(row["agent_ref"]["name"], "/run", json=row,
                                             timeout_s=self.request_timeout_s, retry=RUN_RETRY)
            lines.heard(row["agent_ref"]["name"], response.headers)
            return row, response.raise_for_status().json()

        async def start() -> None:
            try:
                client, lines = await _planned(client_task, None if semaphore is not None else examples)
                lines.start(examples, functools.partial(one, client, lines), agent_name, futures)
            except Exception as exc:  # the fleet's config could not be had: every row's awaitable raises it
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)

        starting = asyncio.ensure_future(start())
        _starting.add(starting)  # the loop keeps only a weak reference to a task
        starting.add_done_callback(_starting.discard)
        return asyncio.as_completed(futures)


_starting: set[asyncio.Task] = set()


async def _planned(client_task: asyncio.Future[tuple[ServerClient, AgentLines]],
                   rows: list[dict[str, Any]] | None) -> tuple[ServerClient, AgentLines]:
    """The client and the agent lines, once this loop's pool is ready for as many of `rows` as go out at once (None:
    the caller's semaphore decides; `http.plan_in_flight` raises the open-files limit, or says once why some must
    wait for a connection)."""
    client, lines = await asyncio.shield(client_task)
    if rows:
        http.plan_in_flight(lines.in_flight(agent_name(row) for row in rows), "rollouts (POST /run)")
    return client, lines


async def _bootstrap(head: tuple[str, int]) -> tuple[ServerClient, AgentLines]:
    """The fleet's config from its head server, and this process's pool limits set from it.

    The config is fetched outside the pooled session (NeMo-Gym's clients use a plain GET too), so that the session
    this loop creates next is built with the fleet's limits.
    """
    config = await asyncio.to_thread(_fetch_head_config, *head)
    http.configure(client_limits(config))
    return ServerClient(config), AgentLines(config)


def _fetch_head_config(host: str, port: int, timeout_s: float = 30.0) -> dict[str, Any]:
    url = f"http://{host}:{port}/global_config_dict_yaml"
    try:
        request = urllib.request.Request(url, headers=auth.head_headers(host, port))
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return http.published_config(orjson.loads(answer.read()))
    except urllib.error.HTTPError as exc:
        raise TransportError(f"head server {url} answered {exc.code}", status=exc.code, url=url,
                             failure_class="http_5xx" if exc.code >= 500 else "http_4xx") from None
    except (urllib.error.URLError, OSError) as exc:
        raise TransportError(f"cannot reach the head server at {url} ({exc}); is the fleet running?", url=url,
                             failure_class="connection_error") from None
