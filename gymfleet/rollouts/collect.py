"""Rollout collection: send every dataset row to its agent's `POST /run` and write what comes back.

`collect(config, client)` is `ng_collect_rollouts`' engine. For an output path `out.jsonl` it writes:

- `out_materialized_inputs.jsonl`: every row as it will be dispatched (written before the first request);
- `out.jsonl`: one verify result per successful rollout, in completion order, with `_ng_task_index`,
  `_ng_rollout_index` and `agent_ref` added;
- `out_failures.jsonl`: failed rollouts. Results tagged `_ng_failure_class` by the environment (judge down, ...),
  and, unlike NeMo-Gym, which aborts the whole collection on the first HTTP error, every non-2xx answer or
  transport failure too, as the input row plus `_ng_failure_class` (the agent's `error_type`, which names the
  hop that failed: `connection_error`, `timeout`, `upstream_error`, ...; else `http_5xx` / `http_4xx`),
  `_ng_failure_status`, `_ng_failure_detail` and `_ng_attempt_index`;
- `out_aggregate_metrics.json`: each agent's `/aggregate_metrics` over its successful results.

Before the first request, every check that can refuse the run does, and nothing is written when one does: existing
outputs (an earlier run's files are never replaced silently: `resume_from_cache` appends to them, `overwrite`
replaces all four), the input lines (`load_rows`), the agent names, and every row against its environment's
`/verify` request model (the check `ng_prepare_data` does; `file:line` per bad row).

Every row is in flight at once (or `num_samples_in_parallel` of them), but the requests go out in row order, a
window of connections at a time, and no more to an agent than it admits at once now and a margin (the rest wait
their turn here: `gymfleet.rollouts.dispatch`), so the agent gets the first rows first and at once.

Every line is on disk once it is written (unbuffered, whole lines), so a crash or Ctrl-C loses no finished rollout.
A write that fails (no space left, file size limit) is undone, so the file keeps only whole lines, and the collection
stops with an `OutputError` naming the file and the reason (`ng_collect_rollouts`: exit code 4); a resume once there
is space runs exactly the rollouts missing. With `resume_from_cache`,
rollouts already in `out.jsonl` are never redone, failed ones are retried up to `max_attempts` attempts in all
(counted in the failures file), and both files are appended to. A failure row whose rollout has since succeeded is
kept, marked `"_ng_superseded": true` (the failures file is rewritten at the end of the run), so the rows without
that mark are exactly the rollouts still missing.

A dead fleet stops the collection instead of turning every remaining row into a failure: after
`stop_after_connection_failures` rollouts of one agent in a row fail with `connection_error`, the head server is
asked for `/server_instances`; if it does not answer, or the run of failures reaches twice that many, nothing more is
dispatched, the requests in flight finish (successes are written; failures are not, as they say nothing about the
row), no aggregate is computed, and `CollectionSummary.stopped` says why (exit code 3). Rerunning with
`resume_from_cache` once the fleet is back finishes the job. Repeated HTTP retry warnings are summarized, not
printed one per rollout.

Progress goes to stderr (`gymfleet.progress`): a bar on a terminal, else one plain line every `PROGRESS_EVERY_S`
(`Rollouts: 120/500 (24%), 30 s elapsed, mean_reward=0.412`) and a last one at the end.

The parts: `gymfleet.rollouts.collect_inputs` (the config, the input rows and the checks before anything is
sent), `gymfleet.rollouts.collect_outputs` (the output files: whole-line writes, reading back to resume) and
`gymfleet.rollouts.fleet_watch` (the head server, telling a dead fleet). NeMo-RL's library entry point,
`RolloutCollectionHelper.run_examples`, is in `gymfleet.rollouts.rollout_helper`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gymfleet import http
from gymfleet.errors import TransportError
from gymfleet.http import HttpResponse, RetryPolicy, ServerClient
from gymfleet.progress import Progress
from gymfleet.rollouts.collect_inputs import RolloutCollectionConfig, check_outputs, check_task_fields, load_rows
from gymfleet.rollouts.collect_outputs import JsonlFile, read_results, replace_file, rollout_key, supersede_failures
from gymfleet.rollouts.dispatch import AgentLines, SendWindow, agent_name
from gymfleet.rollouts.fleet_watch import FleetWatch, head_address, summarized_warnings

log = logging.getLogger(__name__)

RUN_RETRY = RetryPolicy(max_attempts=3, retry_statuses=frozenset(), connect_retry_s=10.0)
"""`/run` is retried on connection failures only: any answer, even a 5xx, may mean the rollout ran. One that cannot
connect keeps trying for 10 s (the config's `connect_retry_s`), so an agent its supervisor restarts costs only the
rollouts in flight at its death."""
DETAIL_MAX_CHARS = 2000
FLEET_DOWN_EXIT_CODE = 3
PROGRESS_EVERY_S = 10.0
"""Seconds between plain progress lines when stderr is not a terminal (a tqdm bar there would be one garbled line
per refresh in a log file)."""


# ---------------------------------------------------------------------------------------------- dispatch


def _failure_row(row: dict[str, Any], failure_class: str, status: int | None, detail: str) -> dict[str, Any]:
    return {
        **row,
        "_ng_failure_class": failure_class,
        "_ng_failure_status": status,
        "_ng_failure_detail": detail[:DETAIL_MAX_CHARS],
        "_ng_attempt_index": row.get("_ng_attempt_index", 0),
    }


def _result_of(row: dict[str, Any], response: HttpResponse) -> dict[str, Any]:
    """The record to write for one `/run` answer (a result, or a failure row)."""
    if not response.ok:
        return _failure_row(row, response.failure_class, response.status, response.text)
    try:
        result = response.json()
    except orjson.JSONDecodeError:
        result = None
    if not isinstance(result, dict):
        return _failure_row(row, "bad_response", response.status, f"not a JSON object: {response.text}")
    result["_ng_task_index"] = row["_ng_task_index"]
    result["_ng_rollout_index"] = row["_ng_rollout_index"]
    result["agent_ref"] = row["agent_ref"]
    if "_ng_attempt_index" in row or result.get("_ng_failure_class"):
        result["_ng_attempt_index"] = row.get("_ng_attempt_index", 0)
    return result


def _run_retry(config: RolloutCollectionConfig) -> RetryPolicy:
    return replace(RUN_RETRY, connect_retry_s=config.connect_retry_s)


async def run_rollout(
    client: ServerClient,
    row: dict[str, Any],
    timeout_s: float,
    semaphore: asyncio.Semaphore | None = None,
    stop: asyncio.Event | None = None,
    retry: RetryPolicy = RUN_RETRY,
    window: SendWindow | None = None,
    lines: AgentLines | None = None,
) -> dict[str, Any] | None:
    """POST one row to its agent; return the result or a failure row (never raises for HTTP/transport failures).

    Returns None, having sent nothing, when `stop` is set by the time the semaphore and `window`, which pace the
    sending (`gymfleet.rollouts.dispatch`), let the row go. `lines`: where the agent's answer says how many it admits
    at once now (`AgentLines.heard`).
    """
    try:
        async with semaphore or contextlib.nullcontext(), window.sending() if window else contextlib.nullcontext():
            if stop is not None and stop.is_set():
                return None
            response = await client.post(row["agent_ref"]["name"], "/run", json=row, timeout_s=timeout_s,
                                         retry=retry)
        if lines is not None:
            lines.heard(row["agent_ref"]["name"], response.headers)
    except TransportError as exc:
        return _failure_row(row, getattr(exc, "failure_class", None) or "connection_error", exc.status, str(exc))
    return _result_of(row, response)


# ---------------------------------------------------------------------------------------------- collection


@dataclass
class CollectionSummary:
    """What a collection did. `exit_code`: 0 when every rollout has a result, 3 when the collection stopped early
    (`stopped`), else 1."""

    ok: int = 0
    """Rollouts with a result in the output file (earlier runs included when resuming)."""
    failed: int = 0
    """Rollouts without a result: failed in this run, or skipped after `max_attempts` failures."""
    dispatched: int = 0
    already_done: int = 0
    not_finished: int = 0
    """Rollouts left for a resume after the collection stopped: not sent, or failed once it had stopped."""
    stopped: str | None = None
    """Why the collection stopped before sending every rollout (the fleet went down), or None."""
    fleet_command: str = "ng_run"
    """How the fleet was started, as far as its config says (for the restart advice)."""
    superseded: int = 0
    """Failure rows marked `_ng_superseded` in this run: their rollout has a result now."""
    exhausted: list[tuple[Any, Any]] = field(default_factory=list)
    """`(task, rollout)` keys skipped because they failed `max_attempts` times."""
    failure_classes: Counter = field(default_factory=Counter)
    mean_reward: dict[str, float | None] = field(default_factory=dict)
    """Per agent, over its successful results."""
    rewards: list[tuple[Any, Any, Any]] = field(default_factory=list)
    """`(task, rollout, reward)` of every successful result, sorted."""
    aggregate_metrics: list[dict[str, Any]] | None = None
    output_paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.stopped is not None:
            return FLEET_DOWN_EXIT_CODE
        return 0 if self.failed == 0 else 1

    def stop_message(self) -> str:
        """The one message for a collection that stopped early: what happened and how to finish."""
        return (
            f"collection stopped: {self.stopped}. {self.not_finished} rollouts were not run; the finished ones are "
            f"saved in {self.output_paths.get('rollouts')}. Restart the fleet ({self.fleet_command}) and rerun "
            "this command with +resume_from_cache=true to run the rest."
        )


async def collect(
    config: RolloutCollectionConfig,
    client: ServerClient,
    *,
    rows: list[dict[str, Any]] | None = None,
    progress: bool = True,
    head: tuple[str, int] | None = None,
) -> CollectionSummary:
    """Run a collection (see the module docstring).

    Args:
        config: what to collect and where to write it.
        client: resolves agent names (`ServerClient.from_head(host, port)`).
        rows: the rows from `load_rows(config)`, if already loaded.
        progress: show progress on stderr: a bar on a terminal, else a plain line every `PROGRESS_EVERY_S`.
        head: where the head server is, to check on it when rollouts cannot connect (default: the address in
            `client.config`).

    Raises:
        ConfigError: the outputs exist and neither `resume_from_cache` nor `overwrite` is set (nothing is sent).
        DataError: bad input lines, rows their environment would refuse, or a corrupt output file (nothing is sent).
        ServerRefError: a row names an agent the fleet does not have (nothing is sent).
    """
    check_outputs(config)
    rows = load_rows(config) if rows is None else rows
    for name in dict.fromkeys(row["agent_ref"]["name"] for row in rows):
        client.url_of(name)  # an unknown agent fails here, with a did-you-mean, before anything is sent
    check_task_fields(config, client)
    files = config.output_files()
    summary = CollectionSummary(
        output_paths={what: files[what] for what in ("rollouts", "failures", "materialized inputs")},
        fleet_command=_fleet_command(client.config),
    )
    files["rollouts"].parent.mkdir(parents=True, exist_ok=True)
    if config.overwrite:
        files["aggregate metrics"].unlink(missing_ok=True)  # the other three are rewritten below
    previous = read_results(files["rollouts"]) if config.resume_from_cache else []
    todo = _plan(rows, config, previous, summary)
    with JsonlFile(files["materialized inputs"], "wb") as materialized:
        materialized.write_lines(orjson.dumps(row) + b"\n" for row in rows)
    published = client.config.get("head_server")
    watch = FleetWatch(config.stop_after_connection_failures,
                        head or (head_address(published) if isinstance(published, dict) else None))
    with summarized_warnings(logging.getLogger(http.__name__)):
        results = previous + await _dispatch(todo, client, config, summary, watch, progress)
    summary.superseded = supersede_failures(files["failures"], {rollout_key(result) for result in results})

    summary.ok = len(results)
    summary.failed = sum(summary.failure_classes.values()) + len(summary.exhausted)
    by_agent = _group_by_agent(results)
    for agent, agent_results in by_agent.items():
        agent_rewards = [r["reward"] for r in agent_results if _is_number(r.get("reward"))]
        summary.mean_reward[agent] = statistics.fmean(agent_rewards) if agent_rewards else None
    summary.rewards = sorted(
        ((r.get("_ng_task_index"), r.get("_ng_rollout_index"), r.get("reward")) for r in results), key=_sort_key
    )
    if not config.disable_aggregation and summary.stopped is None:  # a stopped run's resume aggregates
        # Open failure rows go along so each environment's `infra_failure_share` counts them; `aggregate_metrics`
        # keeps them out of every reward statistic.
        agents = {str(row["agent_ref"]["name"]) for row in rows if isinstance(row.get("agent_ref"), dict)}
        open_failures = [row for row in read_results(files["failures"]) if not row.get("_ng_superseded")
                         and isinstance(row.get("agent_ref"), dict) and row["agent_ref"].get("name") in agents]
        summary.aggregate_metrics = await aggregate(client, _group_by_agent(results + open_failures),
                                                    _run_retry(config))
        metrics_path = summary.output_paths["aggregate metrics"] = files["aggregate metrics"]
        replace_file(metrics_path, (json.dumps(summary.aggregate_metrics, indent=2) + "\n").encode())
    return summary


def _fleet_command(fleet_config: dict[str, Any]) -> str:
    """`ng_run "+config_paths=[...]"` with the config files the fleet was started from, if it says."""
    paths = fleet_config.get("config_paths")
    if isinstance(paths, list) and paths:
        return f'ng_run "+config_paths=[{",".join(map(str, paths))}]"'
    return "ng_run"


def _plan(
    rows: list[dict[str, Any]], config: RolloutCollectionConfig, previous: list[dict[str, Any]],
    summary: CollectionSummary,
) -> list[dict[str, Any]]:
    """The rows still to run: not done already, and (when resuming) not failed `max_attempts` times."""
    done = {rollout_key(result) for result in previous}
    failures = read_results(summary.output_paths["failures"]) if config.resume_from_cache else []
    attempts = Counter(rollout_key(row) for row in failures)
    todo = []
    for row in rows:
        key = rollout_key(row)
        if key in done:
            summary.already_done += 1
        elif attempts[key] >= config.max_attempts:
            summary.exhausted.append((row["_ng_task_index"], row["_ng_rollout_index"]))
        else:
            todo.append({**row, "_ng_attempt_index": attempts[key]} if attempts[key] else row)
    if summary.exhausted:
        log.warning("skipping %d rollouts that failed %d times already", len(summary.exhausted), config.max_attempts)
    summary.dispatched = len(todo)
    return todo


async def _dispatch(
    todo: list[dict[str, Any]], client: ServerClient, config: RolloutCollectionConfig, summary: CollectionSummary,
    watch: FleetWatch, progress: bool,
) -> list[dict[str, Any]]:
    """Run `todo`, writing (and flushing) each record as it completes; return the successful results.

    Once `watch` says the fleet is down, nothing more is sent (`summary.stopped`, `summary.not_finished`).
    """
    mode = "ab" if config.resume_from_cache else "wb"
    retry = _run_retry(config)
    semaphore = asyncio.Semaphore(config.num_samples_in_parallel) if config.num_samples_in_parallel else None
    lines = AgentLines(client.config)
    in_flight = lines.in_flight(row["agent_ref"]["name"] for row in todo)
    http.plan_in_flight(min(in_flight, config.num_samples_in_parallel or in_flight), "rollouts (POST /run)")
    stop = asyncio.Event()
    results: list[dict[str, Any]] = []
    reward_sum, reward_count = 0.0, 0
    with JsonlFile(summary.output_paths["rollouts"], mode) as ok_file, \
            JsonlFile(summary.output_paths["failures"], mode) as failed_file, \
            Progress(len(todo), "Rollouts", unit="rollout", file=sys.stderr, enabled=progress,
                     every_s=PROGRESS_EVERY_S) as bar:
        window = SendWindow()  # the rows go out in order, a window at a time, so the first ones are answered first
        pending = lines.start(todo, lambda row: run_rollout(client, row, config.request_timeout_s, semaphore, stop,
                                                              retry, window, lines), agent_name)
        ticker = asyncio.ensure_future(_tick(bar))  # plain lines keep coming while no rollout finishes
        try:
            for next_done in asyncio.as_completed(pending):
                record = await next_done
                bar.update()
                if record is None or (stop.is_set() and record.get("_ng_failure_class")):
                    summary.not_finished += 1  # not sent, or failed because the fleet is down: left for a resume
                    continue
                if record.get("_ng_no_persist"):
                    continue
                failed = bool(record.get("_ng_failure_class"))
                target = failed_file if failed else ok_file
                target.write_lines([orjson.dumps(record) + b"\n"])
                if not stop.is_set() and (reason := await watch.stop_reason(record)):
                    summary.stopped = reason
                    stop.set()
                    bar.set_description("Stopping")
                if failed:
                    summary.failure_classes[record["_ng_failure_class"]] += 1
                    continue
                results.append(record)
                if _is_number(record.get("reward")):
                    reward_sum, reward_count = reward_sum + record["reward"], reward_count + 1
                    bar.set_postfix(mean_reward=f"{reward_sum / reward_count:.3f}")
        finally:
            ticker.cancel()
            for task in pending:
                task.cancel()
    return results


async def _tick(bar: Progress) -> None:
    while True:
        await asyncio.sleep(1.0)
        bar.tick()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _sort_key(item: tuple[Any, Any, Any]) -> tuple[str, Any, Any]:
    task, rollout, _ = item
    return (type(task).__name__, task if isinstance(task, int | str) else str(task), rollout)


def _group_by_agent(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        ref = result.get("agent_ref")
        groups[ref.get("name") if isinstance(ref, dict) else str(ref)].append(result)
    return dict(groups)


def for_aggregation(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its bulky payloads (the response, except its usage; the request; `ng_*` captures)."""
    slim = {k: v for k, v in result.items() if k not in ("response", "responses_create_params")
            and not k.startswith("ng_")}
    response = result.get("response")
    if isinstance(response, dict) and "usage" in response:
        slim["response"] = {"usage": response["usage"]}
    return slim


async def aggregate(client: ServerClient, by_agent: dict[str, list[dict[str, Any]]],
                    retry: RetryPolicy = RUN_RETRY) -> list[dict[str, Any]]:
    """Each agent's `/aggregate_metrics` over its results; an agent that fails is logged and left out."""
    entries = []
    for agent, results in by_agent.items():
        body = {"verify_responses": [for_aggregation(result) for result in results]}
        try:
            response = await client.post(agent, "/aggregate_metrics", json=body, timeout_s=600.0, retry=retry)
            metrics = response.raise_for_status().json()
        except (TransportError, orjson.JSONDecodeError) as exc:
            log.error("aggregate metrics of %s failed: %s", agent, exc)
            continue
        entries.append({
            "agent_ref": {"name": agent},
            "agent_metrics": metrics.get("agent_metrics", {}),
            "key_metrics": metrics.get("key_metrics", {}),
            "group_level_metrics": metrics.get("group_level_metrics", []),
        })
    return entries
