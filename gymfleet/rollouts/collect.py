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

NeMo-RL's library entry point, `RolloutCollectionHelper.run_examples`, is in `gymfleet.rollouts.rollout_helper`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gymfleet import http
from gymfleet.errors import ConfigError, DataError, GymfleetError, TransportError
from gymfleet.fleet.config import GlobalConfig
from gymfleet.http import HttpResponse, RetryPolicy, ServerClient
from gymfleet.progress import Progress
from gymfleet.rollouts.rows import (
    describe_errors,
    placeholder_response,
    row_problems,
    task_fields_problem,
    verify_request_model,
    warn_unknown_params,
)
from gymfleet.wire import ResponseCreateParams

log = logging.getLogger(__name__)

RUN_RETRY = RetryPolicy(max_attempts=3, retry_statuses=frozenset(), connect_retry_s=10.0)
"""`/run` is retried on connection failures only: any answer, even a 5xx, may mean the rollout ran. One that cannot
connect keeps trying for 10 s, so an agent its supervisor restarts costs only the rollouts in flight at its death."""
DETAIL_MAX_CHARS = 2000
FLEET_DOWN_EXIT_CODE = 3
HEAD_PROBE = RetryPolicy(max_attempts=2, retry_statuses=frozenset())
DEFAULT_HEAD = ("127.0.0.1", 11000)
PROGRESS_EVERY_S = 10.0
"""Seconds between plain progress lines when stderr is not a terminal (a tqdm bar there would be one garbled line
per refresh in a log file)."""


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
    """Finish an earlier run into the same output: finished rollouts are kept and not redone, failed ones are
    retried (up to `max_attempts`), and the output files are appended to."""
    overwrite: bool = Field(default=False, description=(
        "Replace the outputs of an earlier run into the same `output_jsonl_fpath` (all four files). Without it, "
        "or `resume_from_cache`, a collection into existing outputs is refused before anything is sent."))
    stop_after_connection_failures: int | None = Field(default=20, ge=1, description=(
        "This many rollouts of one agent in a row failing with `connection_error` make the collector ask the head "
        "server whether the fleet is up; it stops (exit code 3, resume later) if the head does not answer or the "
        "failures go on to twice this many. null: never stop."))
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

    def output_files(self) -> dict[str, Path]:
        """The four files a collection writes, by what they hold."""
        return {
            "rollouts": Path(self.output_jsonl_fpath),
            "failures": self.sidecar("_failures.jsonl"),
            "materialized inputs": self.sidecar("_materialized_inputs.jsonl"),
            "aggregate metrics": self.sidecar("_aggregate_metrics.json"),
        }


def check_outputs(config: RolloutCollectionConfig) -> None:
    """Refuse to replace an earlier run's outputs unless `overwrite` (or `resume_from_cache`) says what to do.

    Raises:
        ConfigError: both flags are set, or an output file exists and neither is.
    """
    if config.resume_from_cache and config.overwrite:
        raise ConfigError(
            "+resume_from_cache=true and +overwrite=true contradict each other: resuming keeps the earlier "
            "rollouts, overwriting replaces them.", path="overwrite", hint="Pass only one of them.")
    if config.resume_from_cache or config.overwrite:
        return
    existing = [str(path) for path in config.output_files().values() if path.exists()]
    if existing:
        raise ConfigError(
            f"the output of an earlier collection exists: {', '.join(existing)}. It is not replaced silently.",
            path="output_jsonl_fpath",
            hint="Rerun with +resume_from_cache=true to keep those rollouts and finish the rest, or with "
            "+overwrite=true to replace all four files (or choose another +output_jsonl_fpath).",
        )


# ---------------------------------------------------------------------------------------------- rows


def load_rows(config: RolloutCollectionConfig) -> list[dict[str, Any]]:
    """Read, check and expand the input rows (every rollout to run, in dispatch order).

    Raises:
        DataError: the file is missing, or lines are bad (every bad line is named as `file:line: reason`).
    """
    return [rollout for _, base in read_tasks(config) for rollout in _repeat(base, config)]


def read_tasks(config: RolloutCollectionConfig) -> list[tuple[int, dict[str, Any]]]:
    """The input rows before repeating, with their line numbers (`load_rows` without the expansion).

    Raises:
        DataError: as `load_rows`.
    """
    path = Path(config.input_jsonl_fpath)
    if not path.is_file():
        raise DataError("input file does not exist", file=str(path))
    problems: list[tuple[int, str]] = []
    tasks_by_text: dict[str, int] = {}
    bases: list[tuple[int, dict[str, Any]]] = []
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
            bases.append((lineno, row))
    if problems:
        raise row_problems(path, problems)
    warn_unknown_params(path, bases)
    return bases


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


# ---------------------------------------------------------------------------------------------- the fleet


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


def check_task_fields(config: RolloutCollectionConfig, client: ServerClient) -> None:
    """Check every input row against its environment's `/verify` request model, as `ng_prepare_data` does.

    Which environment an agent uses comes from the fleet's config (`client.config`, the head server's). An
    environment whose code cannot be imported here is not checked (logged): the fleet still checks at `/verify`.

    Raises:
        DataError: rows the environment would refuse, each named as `file:line: reason`.
    """

    tasks = read_tasks(config)
    models = _request_models(client, {row["agent_ref"]["name"] for _, row in tasks})
    if not any(models.values()):
        return
    placeholder = placeholder_response()
    problems = [(lineno, problem) for lineno, row in tasks
                if (problem := task_fields_problem(row, models.get(row["agent_ref"]["name"]), placeholder))]
    if problems:
        raise row_problems(
            Path(config.input_jsonl_fpath), problems,
            f"{len(problems)} rows do not fit their environment's request model, so nothing was sent. Fix the "
            "rows (ng_prepare_data checks a dataset the same way) and rerun.",
        )


def _request_models(client: ServerClient, agents: set[str]) -> dict[str, type[BaseModel] | None]:
    """Each agent's environment `/verify` request model (None where there is none to check with)."""

    try:
        fleet_config = GlobalConfig.from_data(client.config)
    except GymfleetError as exc:
        log.warning("rows are not checked against their environments' request models: the fleet's config does "
                    "not parse here (%s)", exc)
        return {}
    return {agent: verify_request_model(fleet_config, fleet_config.instances[agent])
            for agent in sorted(agents) if agent in fleet_config.instances}


async def _probe_head(head: tuple[str, int]) -> tuple[bool, list[str]]:
    """Whether the head server answers, and the servers its `/server_instances` lists as not running."""
    url = f"http://{head[0]}:{head[1]}/server_instances"
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


class _FleetWatch:
    """Tells a dead fleet from the rollouts' outcomes (the policy is in the module docstring)."""

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
def _summarized_warnings(logger: logging.Logger) -> Iterator[None]:
    """Within the block, `logger` prints each kind of warning a few times; one line then counts the rest."""
    repeated = _RepeatedWarnings()
    logger.addFilter(repeated)
    try:
        yield
    finally:
        logger.removeFilter(repeated)
        for template, example in repeated.example.items():
            log.warning("%d more warnings like this one were not shown: %s", repeated.counts[template], example)


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
    client: ServerClient,
    row: dict[str, Any],
    timeout_s: float,
    semaphore: asyncio.Semaphore | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any] | None:
    """POST one row to its agent; return the result or a failure row (never raises for HTTP/transport failures).

    Returns None, having sent nothing, when `stop` is set by the time the semaphore lets the row go.
    """
    try:
        async with semaphore or contextlib.nullcontext():
            if stop is not None and stop.is_set():
                return None
            response = await client.post(row["agent_ref"]["name"], "/run", json=row, timeout_s=timeout_s,
                                         retry=RUN_RETRY)
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
    with _JsonlFile(files["materialized inputs"], "wb") as materialized:
        materialized.write_lines(orjson.dumps(row) + b"\n" for row in rows)
    published = client.config.get("head_server")
    watch = _FleetWatch(config.stop_after_connection_failures,
                        head or (head_address(published) if isinstance(published, dict) else None))
    with _summarized_warnings(logging.getLogger(http.__name__)):
        results = previous + await _dispatch(todo, client, config, summary, watch, progress)
    summary.superseded = _supersede_failures(files["failures"], {rollout_key(result) for result in results})

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
        summary.aggregate_metrics = await aggregate(client, _group_by_agent(results + open_failures))
        metrics_path = summary.output_paths["aggregate metrics"] = files["aggregate metrics"]
        _replace_file(metrics_path, (json.dumps(summary.aggregate_metrics, indent=2) + "\n").encode())
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
    watch: _FleetWatch, progress: bool,
) -> list[dict[str, Any]]:
    """Run `todo`, writing (and flushing) each record as it completes; return the successful results.

    Once `watch` says the fleet is down, nothing more is sent (`summary.stopped`, `summary.not_finished`).
    """
    mode = "ab" if config.resume_from_cache else "wb"
    semaphore = asyncio.Semaphore(config.num_samples_in_parallel) if config.num_samples_in_parallel else None
    stop = asyncio.Event()
    results: list[dict[str, Any]] = []
    reward_sum, reward_count = 0.0, 0
    with _JsonlFile(summary.output_paths["rollouts"], mode) as ok_file, \
            _JsonlFile(summary.output_paths["failures"], mode) as failed_file, \
            Progress(len(todo), "Rollouts", unit="rollout", file=sys.stderr, enabled=progress,
                     every_s=PROGRESS_EVERY_S) as bar:
        pending = [asyncio.ensure_future(run_rollout(client, row, config.request_timeout_s, semaphore, stop))
                   for row in todo]
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


def _supersede_failures(path: Path, done: set[tuple[bytes, bytes]]) -> int:
    """Mark the failure rows whose rollout is in `done` with `"_ng_superseded": true` (rewriting the file in one
    `os.replace`); return how many were newly marked."""
    failures = read_results(path)
    stale = [row for row in failures if not row.get("_ng_superseded") and rollout_key(row) in done]
    if not stale:
        return 0
    for row in stale:
        row["_ng_superseded"] = True
    _replace_file(path, b"".join(orjson.dumps(row) + b"\n" for row in failures))
    return len(stale)


class OutputError(GymfleetError):
    """An output file could not be written (no space left, file too large, ...); what it held before is intact."""


def _output_error(path: Path, exc: OSError, what: str) -> OutputError:
    reason = f"{os.strerror(exc.errno)} [errno {exc.errno}]" if exc.errno else str(exc)
    return OutputError(
        f"cannot write {path}: {reason}. {what} Free space on that disk (or raise the file size limit), then rerun "
        "with +resume_from_cache=true: it runs exactly the rollouts the output does not hold yet.")


class _JsonlFile:
    """An output file written a whole line at a time, unbuffered: each line is on disk once `write_lines` returns
    (a crash loses no finished rollout), and a write that fails (disk full) is undone, so the file holds only
    whole lines; the failure is an `OutputError` naming the file."""

    CHUNK_BYTES = 1 << 20

    def __init__(self, path: Path, mode: str) -> None:
        self.path = path
        try:
            self._file = open(path, mode, buffering=0)
        except OSError as exc:
            raise _output_error(path, exc, "Nothing was written to it.") from None

    def __enter__(self) -> _JsonlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def write_lines(self, lines: Iterable[bytes]) -> None:
        """Append `lines` (each ending in a newline), in chunks of whole lines."""
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            chunk.append(line)
            size += len(line)
            if size >= self.CHUNK_BYTES:
                self._append(b"".join(chunk))
                chunk, size = [], 0
        if chunk:
            self._append(b"".join(chunk))

    def _append(self, data: bytes) -> None:
        fd = self._file.fileno()
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError as exc:
            with contextlib.suppress(OSError):  # shrinking a file needs no space
                os.ftruncate(fd, start)
            raise _output_error(self.path, exc, "The collection stopped; every line written before is whole (the "
                                "one being written was removed).") from None


def _replace_file(path: Path, content: bytes) -> None:
    """Write `content` to `path` at once (a scratch file, then `os.replace`): a failed write leaves `path` as it was.

    Raises:
        OutputError: the scratch file could not be written (it is removed).
    """
    scratch = path.with_name(path.name + ".tmp")
    try:
        scratch.write_bytes(content)
        os.replace(scratch, path)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise _output_error(path, exc, "It is unchanged; every rollout is saved.") from None


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
