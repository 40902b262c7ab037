"""NeMo-Gym 0.7.0's rollout collector (`nemo_gym.rollout_collection.RolloutCollectionHelper.run_from_config`) on
gymfleet's client: what a NeMo-Gym folder's driver or test calls, with 0.7.0's files and rules.

`run_from_config(config)` for an output `out.jsonl` writes `out_materialized_inputs.jsonl` (every rollout as it is
dispatched: `_ng_task_index`, `_ng_rollout_index`), `out.jsonl` (results, in completion order),
`out_failures.jsonl` (the sidecar: results an environment tagged `_ng_failure_class`, and, with
`route_failures_to_sidecar`, `/run`s that came back without a result, as `agent_run_error` or
`agent_request_failed` rows: `gymfleet.rollouts.nemo_gym_sidecars`) and `out_aggregate_metrics.json`. Without
`route_failures_to_sidecar` a failed `/run` ends the run, as in 0.7.0. A run in which no rollout produced a result
(and none is counted as zero: `count_failure_classes_as_zero`, `count_missing_rollouts_as_zero`) raises
`RuntimeError` naming the failure classes and the sidecar. Without `resume_from_cache` a run starts afresh (0.7.0:
the earlier run's three files are removed, not refused as gymfleet's `ng_collect_rollouts` does).

What is retried, and how: never a request. `/run` goes through gymfleet's client with NeMo-Gym's surface rule
(`gymfleet.serving.nemo_gym_client.ANSWERS_NOT_RETRIED`): only a request that never reached the server is sent
again; an answer, whatever its status, is final. Whole rollouts are retried only when the user asks, by rerunning
with `resume_from_cache`: rollouts in `out.jsonl` are kept, and a rollout whose sidecar rows are not terminal and
number fewer than `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` (3) is dispatched again with `_ng_attempt_index` set. A row is
terminal iff stamped `_ng_failure_terminal`; `retry_terminal_timeouts` makes `timeout_exceeded` and the repairable
environment faults retryable all the same (`skipped` never is); `retry_invalid_judge_responses` first moves rows of
`out.jsonl` flagged `invalid_judge_response` into the sidecar as retryable `judge_invalid` attempts
(`gymfleet.serving.nemo_gym_records`).

Rows (`gymfleet.rollouts.nemo_gym_rows`, beside the config): `agent_name` / `agent_map` (`_default` too) route
them, `fan_out` runs a row on several agents, `num_repeats` (a number, or per agent with `_default`),
`num_repeats_add_seed`, `interleave_repeats`, `responses_create_params` (merged over each row's), `limit`; identical
input lines share a task index unless a row carries its own. Rows are
dispatched in input order, at most `num_samples_in_parallel` (and `max_resident_rollout_tasks`) at once, new ones not
started once `dispatch_budget_s` is spent or less than the drain margin is left (written nowhere: a resume sends
them). A row goes to the one Environment Server that fronts its agent (`environment_routing_mode=legacy`: to
`environment_server_name`); gymfleet's own fleets have no Environment Servers, so there the agent is called itself.

Not here, each refused with a message, never skipped silently: `prompt_config`, `skills`, rows routed by
`task_source` alone, materialized taskset rows (`environment_server_routes`), token-ID capture. gymfleet's model
servers keep no per-call capture, so `ng_perf`, `ng_model_call_capture` and the trajectory record are not built, and
NeMo-Gym's rollout health checks are not run (logged). Where NeMo-Gym main differs from 0.7.0, 0.7.0 is followed:
the main read for this (commit 00536e7, the version stored in the reference index) has the failures sidecar and the
attempt limit but no `retry_*` fields, `route_failures_to_sidecar` (a failed `/run` ends the run), counted zeros,
`agent_map`/`fan_out`, dispatch budget or Environment Servers (`/run` and `/aggregate_metrics` go to the agent), and
its `agent_name` only fills rows without an `agent_ref`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from gymfleet.errors import ConfigError, DataError, TransportError, did_you_mean
from gymfleet.progress import Progress
from gymfleet.rollouts import nemo_gym_sidecars as sidecars
from gymfleet.rollouts.nemo_gym_rows import RolloutCollectionConfig, preprocess_raw_rows, read_raw_rows
from gymfleet.rollouts.rollout_helper import RolloutCollectionHelper as NeMoRLHelper
from gymfleet.rollouts.rollout_helper import _fetch_head_config
from gymfleet.serving.nemo_gym_agent_server import OBSERVABILITY_ENABLED_KEY_NAME
from gymfleet.serving.nemo_gym_client import (
    ServerClient,
    get_response_json,
    plain_config,
    raise_for_status,
    served_config,
)
from gymfleet.serving.nemo_gym_collection import attach_ng_perf
from gymfleet.serving.nemo_gym_records import (
    NG_FAILURE_CLASS_KEY,
    NG_NO_PERSIST_KEY,
    DispatchLatencyTracker,
    aggregate_metrics_path_for,
    failures_path_for,
    get_max_rollout_attempts,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
    observed_elapsed,
)
from gymfleet.serving.nemo_gym_types import (
    AGENT_REF_KEY_NAME,
    ATTEMPT_INDEX_KEY_NAME,
    ROLLOUT_INDEX_KEY_NAME,
    SKILLS_REF_KEY_NAME,
    TASK_INDEX_KEY_NAME,
    TASK_SOURCE_KEY_NAME,
)

log = logging.getLogger(__name__)

RUN_FAILURE_ERRORS = (aiohttp.ClientError, TransportError, orjson.JSONDecodeError, TimeoutError)
"""`/run` failures that become sidecar rows under `route_failures_to_sidecar` (anything else propagates)."""
_COPIED_KEYS = (AGENT_REF_KEY_NAME, TASK_SOURCE_KEY_NAME, SKILLS_REF_KEY_NAME, ATTEMPT_INDEX_KEY_NAME,
                "_ng_rollout_id")


@dataclass(frozen=True)
class _CompletedRollout:
    """A finished `/run` dispatch, its timing carried beside (not inside) the result."""

    row: dict[str, Any]
    result: dict[str, Any]
    rollout_latency_ms: float | None
    environment_server: str | None = None
    environment_server_type: str | None = None


CompletedRollout = _CompletedRollout


def _patched(name: str, default: Any) -> Any:
    """`nemo_gym.rollout_collection.<name>` when that module is loaded (a folder's test patches it there, as 0.7.0's
    code reads its module's globals at each call), else `default`."""
    module = sys.modules.get("nemo_gym.rollout_collection")
    return getattr(module, name, default) if module is not None else default


_FLEET: list[tuple[Any, dict[str, Any]]] = []
"""The fleet `use_fleet` names (innermost last)."""


@contextlib.contextmanager
def use_fleet(head_server_config: Any, config: dict[str, Any]) -> Iterator[None]:
    """Within it, `setup_server_client()` (and the global config `run_from_config` reads) is this fleet's: how
    `ng_collect_rollouts` hands a driver the fleet it reached (`gymfleet.rollouts.nemo_gym_driver`)."""
    _FLEET.append((head_server_config, config))
    try:
        yield
    finally:
        _FLEET.pop()


def setup_server_client(head_server_config: Any = None) -> ServerClient:
    """The fleet's NeMo-Gym `ServerClient`: the one `use_fleet` names, else the fleet this process serves in, else
    the one whose head server (`head_server_config`, else the global config's `head_server`, else 127.0.0.1:11000)
    publishes its config.

    Raises:
        TransportError: the head server cannot be reached.
    """
    if _FLEET:
        head, config = _FLEET[-1]
        return ServerClient(head_server_config=head_server_config or head, global_config_dict=config)
    served = served_config()
    if served is not None:
        return ServerClient(head_server_config=head_server_config or served.get("head_server"),
                            global_config_dict=served)
    from gymfleet.rollouts.fleet_watch import head_address

    if head_server_config is None:
        from gymfleet.fleet.run_helper import maybe_get_global_config_dict

        head_server_config = plain_config(maybe_get_global_config_dict() or {}).get("head_server")
    host, port = head_address(head_server_config)
    return ServerClient(head_server_config={"host": host, "port": port},
                        global_config_dict=_fetch_head_config(host, port))


setup_server_client_utils = setup_server_client
"""0.7.0's name for it in `nemo_gym.rollout_collection` (a folder's test patches that one)."""


def _global_config(client: ServerClient) -> dict[str, Any]:
    """The global config: `nemo_gym.rollout_collection.get_global_config_dict` where a test patched it, else the
    fleet's (`client`'s; 0.7.0 parses its command line, which a library caller's is not)."""
    from gymfleet.fleet.run_helper import get_global_config_dict

    source = _patched("get_global_config_dict", get_global_config_dict)
    return plain_config(client.global_config_dict if source is get_global_config_dict else source())


def _drop_truncated_tail(path: Path) -> None:
    """Cut a last line a killed run left half-written (no newline), so a resume appends whole lines."""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning("%s ends in a half-written line (%d bytes); dropping it", path, len(data) - keep)
        with path.open("r+b") as file:
            file.truncate(keep)


class RolloutCollectionHelper(NeMoRLHelper):
    """0.7.0's `RolloutCollectionHelper`: `run_from_config` and the parts drivers call (`_preprocess_rows_from_config`,
    `_run_examples_with_metadata`, `_call_aggregate_metrics`); `run_examples` is NeMo-RL's (gymfleet's dispatch)."""

    def setup_server_client(self, head_server_config: Any = None) -> ServerClient:
        return _patched("setup_server_client_utils", setup_server_client)(head_server_config)

    def _preprocess_rows_from_config(self, config: RolloutCollectionConfig) -> list[dict[str, Any]]:
        """The rollouts `config` asks for: input lines read (`file:line` for a bad one), routed, repeated."""
        if config.prompt_config is not None or config.skills is not None:
            key = "prompt_config" if config.prompt_config is not None else "skills"
            raise ConfigError(f"{key} is not supported by gymfleet's NeMo-Gym collector", path=key,
                              hint="build responses_create_params.input into the dataset rows instead")
        return preprocess_raw_rows(read_raw_rows(Path(config.input_jsonl_fpath), config.limit), config)

    def _load_from_cache(self, config: RolloutCollectionConfig, success_keys: set) -> tuple[list, list, list]:
        """A resume: (rows still to run, rows of the kept results, kept results); `success_keys` gains the kept."""
        output = Path(config.output_jsonl_fpath)
        if config.retry_invalid_judge_responses:
            migrate_invalid_judge_main_rows(output)
        materialized = sidecars.read_jsonl(config.materialized_jsonl_fpath)
        results = sidecars.read_jsonl(output)
        success_keys.update(map(sidecars.rollout_key, results))
        attempts: Counter = Counter()
        terminal, reuse, elapsed = set(), set(), {}
        failures = failures_path_for(output)
        for row in sidecars.read_jsonl(failures) if failures.exists() else []:
            if TASK_INDEX_KEY_NAME not in row or ROLLOUT_INDEX_KEY_NAME not in row:
                continue
            key = sidecars.rollout_key(row)
            attempts[key] += 1
            if is_terminal_failure(row, retry_terminal_timeouts=config.retry_terminal_timeouts):
                terminal.add(key)
            if row.get("reuse_cached_deliverable"):
                reuse.add(key)
            if (seconds := observed_elapsed(row)) is not None:
                elapsed[key] = max(elapsed.get(key, 0.0), seconds)
        maxed = {key for key, n in attempts.items() if n >= get_max_rollout_attempts()}
        todo = [row for row in materialized if sidecars.rollout_key(row) not in success_keys | terminal | maxed]
        for row in todo:
            key = sidecars.rollout_key(row)
            if attempts[key]:
                row[ATTEMPT_INDEX_KEY_NAME] = attempts[key]
            if key in reuse:
                row["reuse_cached_deliverable"] = True
        if config.dispatch_longest_first and elapsed:
            todo.sort(key=lambda row: -elapsed.get(sidecars.rollout_key(row), -1.0))  # stable: unseen keep order
        by_key = {sidecars.rollout_key(row): row for row in materialized}
        rows = [by_key.get(sidecars.rollout_key(result), result) for result in results]
        log.info("resumed: %d materialized rollouts, %d done, %d failure attempts, %d terminal, %d at max attempts, "
                 "%d to run", len(materialized), len(success_keys), sum(attempts.values()), len(terminal),
                 len(maxed), len(todo))
        return todo, rows, results

    async def run_from_config(self, config: RolloutCollectionConfig) -> list[dict[str, Any]]:
        """Collect the rollouts `config` names (see the module docstring); returns this run's results (and, on a
        resume, the kept ones), sorted by task and rollout.

        Raises:
            RuntimeError: no dispatched rollout produced a result; or `require_complete` and some are missing.
            ConfigError, DataError: bad config or input (nothing sent); TransportError: a failed `/run` without
                `route_failures_to_sidecar`.
        """
        output = Path(config.output_jsonl_fpath)
        failures = failures_path_for(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        self.request_timeout_s = config.request_timeout_s
        done_keys: set = set()
        if config.resume_from_cache and config.materialized_jsonl_fpath.exists() and output.exists():
            _drop_truncated_tail(output)
            if failures.exists():
                _drop_truncated_tail(failures)
            input_rows, rows, results = self._load_from_cache(config, done_keys)
            kept_rows, kept_results = list(rows), list(results)
        else:
            if config.resume_from_cache:
                log.info("nothing to resume from (%s or %s is missing): starting afresh", output,
                         config.materialized_jsonl_fpath)
            input_rows = self._preprocess_rows_from_config(config)
            config.materialized_jsonl_fpath.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in input_rows))
            for path in (output, failures, aggregate_metrics_path_for(output)):
                path.unlink(missing_ok=True)
            rows, results, kept_rows, kept_results = [], [], [], []
        semaphore = asyncio.Semaphore(config.num_samples_in_parallel) if config.num_samples_in_parallel else None
        observability = bool(_global_config(self.setup_server_client()).get(OBSERVABILITY_ENABLED_KEY_NAME, False))
        tracker = DispatchLatencyTracker()
        failure_counts: Counter = Counter()
        persisted = len(done_keys)
        with output.open("ab") as results_file, failures.open("ab") as failures_file, \
                Progress(len(input_rows), "Rollouts", unit="rollout", file=sys.stderr) as bar:
            for future in self._run_examples_with_metadata(
                    input_rows, semaphore=semaphore, route_failures_to_sidecar=config.route_failures_to_sidecar,
                    max_resident_tasks=config.max_resident_rollout_tasks, dispatch_budget_s=config.dispatch_budget_s,
                    drain_margin_s=config.drain_margin_s, latency_tracker=tracker):
                completed = await future
                bar.update()
                row, result = completed.row, _stamped(completed)
                attach_ng_perf(result, observability_enabled=observability,
                               rollout_latency_ms=completed.rollout_latency_ms)
                if config.retain_results_in_memory:
                    rows.append(row)
                    results.append(result)
                if result.get(NG_NO_PERSIST_KEY):
                    continue  # drained or kill-shaped: written nowhere, so a resume dispatches it again
                line = orjson.dumps(result) + b"\n"
                if (failure_class := result.get(NG_FAILURE_CLASS_KEY)) is not None:
                    failure_counts[failure_class] += 1
                    log.warning("rollout dropped from the score: row=%s class=%s error=%s",
                                json.dumps(_summary(row), sort_keys=True), failure_class,
                                str(result.get("_ng_failure_message") or result.get("error") or "")[:200])
                    failures_file.write(line)
                    failures_file.flush()
                    continue
                results_file.write(line)
                results_file.flush()
                persisted += 1
                done_keys.add(sidecars.rollout_key(result))
                if config.retain_results_in_memory:
                    kept_rows.append(row)
                    kept_results.append(result)
        counted = sidecars.failure_rows_counted_as_zero([failures], config.count_failure_classes_as_zero, done_keys)
        missing = []
        if config.count_missing_rollouts_as_zero and not config.disable_aggregation:
            missing = sidecars.missing_rollout_rows_counted_as_zero(
                [config.materialized_jsonl_fpath], [failures], done_keys | set(map(sidecars.rollout_key, counted)))
        if input_rows and persisted == 0 and not counted and not missing:
            drained = (f" {tracker.drained} of them were never started because dispatch_budget_s ran out; "
                       "resume_from_cache dispatches them in the next run." if tracker.drained else "")
            raise RuntimeError(f"None of the {len(input_rows)} dispatched rollouts produced a result "
                               f"{dict(failure_counts)}.{drained} Inspect {failures}; the run has no score to report.")
        log.info("%s", tracker.summary())
        if not config.retain_results_in_memory and not config.disable_aggregation:
            kept_results = sidecars.read_jsonl(output)
            kept_rows = kept_results
        for listed in (rows, results):
            listed.sort(key=sidecars.rollout_key)
        metrics_path = None
        if config.disable_aggregation:
            log.info("disable_aggregation: no aggregate metrics (aggregate the shards with RolloutAggregationHelper)")
        else:
            counted.extend(missing)
            sidecars.fill_task_fields(counted, kept_results, [config.materialized_jsonl_fpath],
                                      sidecars.routing_identity)
            scored, meta = kept_results + counted, kept_rows + counted
            order = sorted(range(len(scored)), key=lambda i: sidecars.rollout_order_key(scored[i]))
            metrics_path = await self._call_aggregate_metrics([scored[i] for i in order], [meta[i] for i in order],
                                                              output)
        with config.materialized_jsonl_fpath.open("rb") as materialized:
            expected = sum(1 for line in materialized if line.strip())
        coverage = sidecars.coverage_report(expected, persisted + len(counted), failure_counts, failures,
                                            imputed=len(missing))
        log.info("collection done: materialized inputs %s, rollouts %s, aggregate metrics %s%s",
                 config.materialized_jsonl_fpath, output, metrics_path, coverage)
        if not config.disable_aggregation and not config.disable_health_check:
            log.info("NeMo-Gym's rollout health checks are not run by gymfleet (disable_health_check=true silences "
                     "this)")
        config.check_completion(expected=expected, results=kept_results)
        return results

    def _run_examples_with_metadata(
        self, examples: list[dict[str, Any]], head_server_config: Any = None, semaphore: Any = None,
        route_failures_to_sidecar: bool = False, environment_server_name: str | None = None, *,
        max_resident_tasks: int | None = None, dispatch_budget_s: float | None = None,
        drain_margin_s: float | None = None, latency_tracker: DispatchLatencyTracker | None = None,
    ) -> Iterator[asyncio.Future]:
        """Start one `/run` per row (in row order, once iterated; deadline `request_timeout_s`, an hour unless the
        helper was made with another) and yield awaitables in completion order, each resolving to a
        `_CompletedRollout`. A row the dispatch budget never started resolves to a `cancelled` result
        marked not to be persisted; with `route_failures_to_sidecar` a failed `/run` resolves to a failure row.

        Raises:
            ConfigError: a row names no agent, or one the fleet does not have (before anything is sent).
        """
        client = self.setup_server_client(head_server_config)
        fleet = plain_config(client.global_config_dict)
        if environment_server_name is not None:
            for row in examples:
                row[sidecars.NG_ENVIRONMENT_SERVER_KEY] = environment_server_name
        by_agent, types = sidecars.environment_servers_by_agent(fleet), sidecars.environment_server_types(fleet)
        known = set(fleet) | set(getattr(client, "_server_base_urls", {}))
        targets: dict[str, str] = {}
        for row in examples:
            agent = (row.get(AGENT_REF_KEY_NAME) or {}).get("name")
            if isinstance(row.get(sidecars.NG_ENVIRONMENT_SERVER_KEY), str) or agent in targets:
                continue
            if agent is None:
                raise ConfigError(f"a row names no agent (task {row.get(TASK_INDEX_KEY_NAME)})", path="agent_ref",
                                  hint="give each row an agent_ref, or set agent_name")
            if agent not in known:
                raise ConfigError(f"agent {agent!r} is not in the fleet.{did_you_mean(agent, known)}",
                                  path="agent_ref.name", hint=f"the fleet has: {', '.join(sorted(known))}")
            targets[agent] = sidecars.environment_server_for_agent(agent, by_agent) or agent
        tracker = latency_tracker if latency_tracker is not None else DispatchLatencyTracker()
        deadline = time.monotonic() + dispatch_budget_s if dispatch_budget_s is not None else None
        resident = asyncio.Semaphore(max_resident_tasks) if max_resident_tasks else None

        async def one(row: dict[str, Any]) -> _CompletedRollout:
            server = row.get(sidecars.NG_ENVIRONMENT_SERVER_KEY) or targets[row[AGENT_REF_KEY_NAME]["name"]]
            stamp = (server, types[server]) if server in types else (None, None)
            async with resident or contextlib.nullcontext(), semaphore or contextlib.nullcontext():
                if deadline is not None:  # checked once a slot is free: the time left when it would start
                    left, margin = deadline - time.monotonic(), tracker.drain_margin(drain_margin_s)
                    if left <= 0 or (margin is not None and left < margin):
                        tracker.record_drained()
                        return _CompletedRollout(row, _drained(left, margin), None, *stamp)
                started, answer = time.monotonic(), None
                try:
                    answer = await client.post(server_name=server, url_path="/run", json=row,
                                               timeout=self.request_timeout_s)
                    await raise_for_status(answer)
                    result = await get_response_json(answer)
                except RUN_FAILURE_ERRORS as exc:
                    log.warning("/run failed: status=%s row=%s", getattr(answer, "status", None),
                                json.dumps(_summary(row), sort_keys=True))
                    if not route_failures_to_sidecar:
                        raise
                    status = getattr(exc, "status", None) or getattr(answer, "status", None)
                    return _CompletedRollout(row, sidecars.agent_request_failure_row(exc, status), None, *stamp)
                tracker.record(time.monotonic() - started)
                if not isinstance(result, dict):
                    raise DataError(f"{server} /run answered {type(result).__name__}, not a JSON object")
                return _CompletedRollout(row, result, (time.monotonic() - started) * 1000, *stamp)

        def in_input_order() -> Iterator[asyncio.Future]:
            yield from asyncio.as_completed([asyncio.ensure_future(one(row)) for row in examples])

        return in_input_order()

    async def _call_aggregate_metrics(self, results: list[dict[str, Any]], rows: list[dict[str, Any]],
                                      output_fpath: Path) -> Path | None:
        return await sidecars.call_aggregate_metrics(self.setup_server_client(), results, rows, output_fpath)


def _stamped(completed: _CompletedRollout) -> dict[str, Any]:
    """The result with its row's identity (indices, agent, task source, skills, attempt, rollout id) and the
    Environment Server that ran it."""
    result, row = completed.result, completed.row
    result[TASK_INDEX_KEY_NAME] = row[TASK_INDEX_KEY_NAME]
    result[ROLLOUT_INDEX_KEY_NAME] = row[ROLLOUT_INDEX_KEY_NAME]
    result.update({key: row[key] for key in _COPIED_KEYS if key in row})
    if completed.environment_server is not None:
        result[sidecars.NG_ENVIRONMENT_SERVER_KEY] = completed.environment_server
    if completed.environment_server_type is not None:
        result[sidecars.NG_RESULT_TYPE_KEY] = completed.environment_server_type
    return result


def _drained(left_s: float, margin_s: float | None) -> dict[str, Any]:
    return {NG_FAILURE_CLASS_KEY: "cancelled", NG_NO_PERSIST_KEY: True, sidecars.NG_DISPATCH_DRAINED_KEY: True,
            "error_message": (f"not dispatched: {left_s:.0f}s left in dispatch budget, below the {margin_s:.0f}s "
                              "drain margin" if margin_s is not None else "not dispatched: dispatch budget exhausted")}


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    agent = (row.get(AGENT_REF_KEY_NAME) or {}).get("name")
    found = {TASK_INDEX_KEY_NAME: row.get(TASK_INDEX_KEY_NAME),
             ROLLOUT_INDEX_KEY_NAME: row.get(ROLLOUT_INDEX_KEY_NAME), "agent_name": agent,
             "environment_server": row.get(sidecars.NG_ENVIRONMENT_SERVER_KEY)}
    return {k: v for k, v in found.items() if v is not None}
