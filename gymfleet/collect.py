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

Every line is flushed as it is written, so a crash or Ctrl-C loses no finished rollout. With `resume_from_cache`,
rollouts already in `out.jsonl` are never redone, failed ones are retried up to `max_attempts` attempts in all
(counted in the failures file), and both files are appended to.

NeMo-RL's library entry point, `RolloutCollectionHelper.run_examples`, is in `gymfleet.rollout_helper`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tqdm import tqdm

from gymfleet.errors import DataError, TransportError
from gymfleet.http import HttpResponse, RetryPolicy, ServerClient
from gymfleet.wire import ResponseCreateParams

log = logging.getLogger(__name__)

RUN_RETRY = RetryPolicy(max_attempts=3, retry_statuses=frozenset())
"""`/run` is retried on connection failures only: any answer, even a 5xx, may mean the rollout ran."""
DETAIL_MAX_CHARS = 2000


class RolloutCollectionConfig(BaseModel):
    """`ng_collect_rollouts`' keys (top-level keys of the global config; any other key is ignored)."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    input_jsonl_fpath: str
    """Dataset rows, one JSON object per line."""
    output_jsonl_fpath: str
    """Where successful results go; the sidecar files are named after it."""
    agent_name: str | None = None
    """Agent for rows without an `agent_ref`."""
    limit: int | None = Field(default=None, ge=0)
    """Read at most this many lines."""
    num_repeats: int | dict[str, int] | None = 1
    """Rollouts per row: a number, or `{<agent>: n, _default: n}`."""
    num_repeats_add_seed: bool = False
    """Put `{"seed": <rollout index>}` into `responses_create_params.metadata.extra_body`."""
    num_samples_in_parallel: int | None = Field(default=None, ge=1)
    """Most `/run` requests in flight (None: all at once)."""
    responses_create_params: dict[str, Any] = Field(default_factory=dict)
    """Shallow-merged over every row's `responses_create_params` (e.g. `{temperature: 0.6}`)."""
    resume_from_cache: bool = False
    disable_aggregation: bool = False
    max_attempts: int = Field(default=3, ge=1)
    """With `resume_from_cache`, a rollout that failed this many times is not tried again."""
    request_timeout_s: float = Field(default=3600.0, gt=0)
    """Deadline for one `/run` (a long agentic episode takes minutes)."""

    @field_validator("num_repeats")
    @classmethod
    def _positive_repeats(cls, value: int | dict[str, int] | None) -> int | dict[str, int] | None:
        counts = value.values() if isinstance(value, dict) else [value] if value is not None else []
        if any(count < 1 for count in counts):
            raise ValueError(f"repeat counts must be >= 1, got {value!r}")
        return value

    def repeats_for(self, agent: str) -> int:
        if isinstance(self.num_repeats, dict):
            return self.num_repeats.get(agent, self.num_repeats.get("_default", 1))
        return self.num_repeats or 1

    def sidecar(self, suffix: str) -> Path:
        """`<output dir>/<output stem><suffix>`."""
        output = Path(self.output_jsonl_fpath)
        return output.with_name(output.stem + suffix)


# ---------------------------------------------------------------------------------------------- rows


def load_rows(config: RolloutCollectionConfig) -> list[dict[str, Any]]:
    """Read, check and expand the input rows (every rollout to run, in dispatch order).

    Raises:
        DataError: the file is missing, or lines are bad (every bad line is named as `file:line: reason`).
    """
    path = Path(config.input_jsonl_fpath)
    if not path.is_file():
        raise DataError("input file does not exist", file=str(path))
    problems: list[tuple[int, str]] = []
    tasks_by_text: dict[str, int] = {}
    bases: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as lines:
        read = 0
        for lineno, line in enumerate(lines, 1):
            text = line.strip()
            if not text:
                continue
            if config.limit is not None and read >= config.limit:
                break
            read += 1
            row, reason = _parse_row(text, config)
            if reason is not None:
                problems.append((lineno, reason))
                continue
            if "_ng_task_index" not in row:
                row["_ng_task_index"] = tasks_by_text.setdefault(text, len(tasks_by_text))
            bases.append(row)
    if problems:
        (first, reason), rest = problems[0], problems[1:]
        more = "".join(f"\n{path}:{lineno}: {why}" for lineno, why in rest)
        raise DataError(reason + more, file=str(path), line=first)
    return [rollout for base in bases for rollout in _repeat(base, config)]


def _parse_row(text: str, config: RolloutCollectionConfig) -> tuple[dict[str, Any], str | None]:
    try:
        row = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return {}, f"not valid JSON ({exc})"
    if not isinstance(row, dict):
        return {}, f"expected a JSON object, got {type(row).__name__}"
    if "agent_ref" not in row:
        if config.agent_name is None:
            return row, "no agent_ref, and no +agent_name=<agent> to default to"
        row["agent_ref"] = {"type": "responses_api_agents", "name": config.agent_name}
    ref = row["agent_ref"]
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str):
        return row, f"agent_ref must be {{type, name}}, got {ref!r}"
    params = row.get("responses_create_params")
    if not isinstance(params, dict):
        return row, "missing responses_create_params (an object with at least `input`)"
    row["responses_create_params"] = {**params, **config.responses_create_params}
    try:
        ResponseCreateParams.model_validate(row["responses_create_params"])
    except ValidationError as exc:
        return row, "responses_create_params: " + describe_errors(exc)
    return row, None


def describe_errors(exc: ValidationError, limit: int = 3) -> str:
    """`a.b: msg; c: msg` for the first `limit` errors of a pydantic validation error."""
    errors = exc.errors(include_url=False)
    parts = [f"{'.'.join(map(str, e['loc'])) or '(row)'}: {e['msg']}" for e in errors[:limit]]
    if len(errors) > limit:
        parts.append(f"... {len(errors) - limit} more")
    return "; ".join(parts)


def _repeat(base: dict[str, Any], config: RolloutCollectionConfig) -> Iterator[dict[str, Any]]:
    encoded = orjson.dumps(base)
    for rollout_index in range(config.repeats_for(base["agent_ref"]["name"])):
        row = orjson.loads(encoded)
        row["_ng_rollout_index"] = rollout_index
        if config.num_repeats_add_seed:
            params = row["responses_create_params"]
            metadata = dict(params.get("metadata") or {})
            try:
                extra = json.loads(metadata.get("extra_body") or "{}")
            except json.JSONDecodeError:
                extra = None
            if not isinstance(extra, dict):
                raise DataError(f"task {base['_ng_task_index']}: metadata.extra_body is not a JSON object string")
            metadata["extra_body"] = json.dumps({**extra, "seed": rollout_index})
            params["metadata"] = metadata
        yield row


def rollout_key(row: dict[str, Any]) -> tuple[bytes, bytes]:
    """`(task, rollout)` identity of a rollout, hashable whatever JSON type the task index has."""
    return orjson.dumps(row.get("_ng_task_index")), orjson.dumps(row.get("_ng_rollout_index"))


def read_results(path: Path) -> list[dict[str, Any]]:
    """The JSON objects in an output file; a truncated last line (crash mid-write) is dropped from the file.

    Raises:
        DataError: a line other than the last is not a JSON object.
    """
    if not path.exists():
        return []
    content = path.read_bytes()
    rows: list[dict[str, Any]] = []
    offset = 0
    lines = content.split(b"\n")
    for lineno, line in enumerate(lines, 1):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
            continue
        if any(rest.strip() for rest in lines[lineno:]):
            raise DataError("not a JSON object; fix or delete the line, then resume", file=str(path), line=lineno)
        log.warning("%s:%d: dropping a truncated last line (interrupted write)", path, lineno)
        with path.open("r+b") as handle:
            handle.truncate(start)
        return rows
    if content and not content.endswith(b"\n"):
        with path.open("ab") as handle:
            handle.write(b"\n")
    return rows


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


async def run_rollout(
    client: ServerClient, row: dict[str, Any], timeout_s: float, semaphore: asyncio.Semaphore | None = None
) -> dict[str, Any]:
    """POST one row to its agent; return the result or a failure row (never raises for HTTP/transport failures)."""
    try:
        async with semaphore or contextlib.nullcontext():
            response = await client.post(row["agent_ref"]["name"], "/run", json=row, timeout_s=timeout_s,
                                         retry=RUN_RETRY)
    except TransportError as exc:
        return _failure_row(row, getattr(exc, "failure_class", None) or "connection_error", exc.status, str(exc))
    return _result_of(row, response)


# ---------------------------------------------------------------------------------------------- collection


@dataclass
class CollectionSummary:
    """What a collection did. `exit_code` is 0 when every rollout has a result, else 1."""

    ok: int = 0
    """Rollouts with a result in the output file (earlier runs included when resuming)."""
    failed: int = 0
    """Rollouts without a result: failed in this run, or skipped after `max_attempts` failures."""
    dispatched: int = 0
    already_done: int = 0
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
        return 0 if self.failed == 0 else 1


async def collect(
    config: RolloutCollectionConfig,
    client: ServerClient,
    *,
    rows: list[dict[str, Any]] | None = None,
    progress: bool = True,
) -> CollectionSummary:
    """Run a collection (see the module docstring).

    Args:
        config: what to collect and where to write it.
        client: resolves agent names (`ServerClient.from_head(host, port)`).
        rows: the rows from `load_rows(config)`, if already loaded.
        progress: show a progress bar on stderr.

    Raises:
        DataError: bad input lines or a corrupt output file (nothing is dispatched).
        ServerRefError: a row names an agent the fleet does not have (nothing is dispatched).
    """
    rows = load_rows(config) if rows is None else rows
    for name in dict.fromkeys(row["agent_ref"]["name"] for row in rows):
        client.url_of(name)  # an unknown agent fails here, with a did-you-mean, before anything is sent
    output = Path(config.output_jsonl_fpath)
    summary = CollectionSummary(output_paths={
        "rollouts": output,
        "failures": config.sidecar("_failures.jsonl"),
        "materialized inputs": config.sidecar("_materialized_inputs.jsonl"),
    })
    output.parent.mkdir(parents=True, exist_ok=True)
    previous = read_results(output) if config.resume_from_cache else []
    todo = _plan(rows, config, previous, summary)
    with summary.output_paths["materialized inputs"].open("wb") as handle:
        handle.writelines(orjson.dumps(row) + b"\n" for row in rows)
    results = previous + await _dispatch(todo, client, config, summary, progress)

    summary.ok = len(results)
    summary.failed = sum(summary.failure_classes.values()) + len(summary.exhausted)
    by_agent = _group_by_agent(results)
    for agent, agent_results in by_agent.items():
        agent_rewards = [r["reward"] for r in agent_results if _is_number(r.get("reward"))]
        summary.mean_reward[agent] = statistics.fmean(agent_rewards) if agent_rewards else None
    summary.rewards = sorted(
        ((r.get("_ng_task_index"), r.get("_ng_rollout_index"), r.get("reward")) for r in results), key=_sort_key
    )
    if not config.disable_aggregation:
        summary.aggregate_metrics = await aggregate(client, by_agent)
        metrics_path = summary.output_paths["aggregate metrics"] = config.sidecar("_aggregate_metrics.json")
        metrics_path.write_text(json.dumps(summary.aggregate_metrics, indent=2) + "\n")
    return summary


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
    progress: bool,
) -> list[dict[str, Any]]:
    """Run `todo`, writing (and flushing) each record as it completes; return the successful results."""
    mode = "ab" if config.resume_from_cache else "wb"
    semaphore = asyncio.Semaphore(config.num_samples_in_parallel) if config.num_samples_in_parallel else None
    results: list[dict[str, Any]] = []
    reward_sum, reward_count = 0.0, 0
    with summary.output_paths["rollouts"].open(mode) as ok_file, \
            summary.output_paths["failures"].open(mode) as failed_file, \
            tqdm(total=len(todo), unit="rollout", file=sys.stderr, disable=not progress, desc="Rollouts") as bar:
        pending = [asyncio.ensure_future(run_rollout(client, row, config.request_timeout_s, semaphore))
                   for row in todo]
        try:
            for next_done in asyncio.as_completed(pending):
                record = await next_done
                bar.update()
                if record.get("_ng_no_persist"):
                    continue
                failed = bool(record.get("_ng_failure_class"))
                target = failed_file if failed else ok_file
                target.write(orjson.dumps(record) + b"\n")
                target.flush()
                if failed:
                    summary.failure_classes[record["_ng_failure_class"]] += 1
                    continue
                results.append(record)
                if _is_number(record.get("reward")):
                    reward_sum, reward_count = reward_sum + record["reward"], reward_count + 1
                    bar.set_postfix(mean_reward=f"{reward_sum / reward_count:.3f}", refresh=False)
        finally:
            for task in pending:
                task.cancel()
    return results


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


async def aggregate(client: ServerClient, by_agent: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each agent's `/aggregate_metrics` over its results; an agent that fails is logged and left out."""
    entries = []
    for agent, results in by_agent.items():
        body = {"verify_responses": [for_aggregation(result) for result in results]}
        try:
            response = await client.post(agent, "/aggregate_metrics", json=body, timeout_s=600.0, retry=RUN_RETRY)
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
