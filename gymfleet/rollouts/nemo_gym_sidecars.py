"""NeMo-Gym 0.7.0's rollout-collection records beyond a result: failure rows, what counts as zero, and
`/aggregate_metrics` over a run (`nemo_gym.rollout_collection`, used by `gymfleet.rollouts.nemo_gym_collect`).

- `agent_request_failure_row(exc, status)`: the sidecar row for a `/run` that came back without a result:
  `agent_run_error` when a server answered (it ran and broke), `agent_request_failed` for a gateway status
  (429/502/503/504) or no answer; `_ng_failure_type`, `_ng_failure_message`, `_ng_failure_http_status`,
  `_ng_failure_response_body` (its first 2,000 characters); never a `reward` or a `response`.
- `latest_failure_rows`, `failure_rows_counted_as_zero`, `missing_rollout_rows_counted_as_zero`,
  `fill_task_fields`: 0.7.0's `count_failure_classes_as_zero` / `count_missing_rollouts_as_zero`: the last attempt of
  a rollout stands; a counted row enters the metric input only (its `_ng_failure_*` diagnostics dropped,
  `mask_sample` false, `reward` 0.0 unless it has one), never an output file.
- `environment_server_for_agent`: the Environment Server that fronts an agent (one `environment_servers:` instance
  naming it), where `/run` and `/aggregate_metrics` go. gymfleet's own fleets have none: their agents answer
  `/run` themselves, so an agent no Environment Server fronts is called directly (0.7.0 refuses such an agent).
- `call_aggregate_metrics(client, results, rows, out.jsonl)`: one `/aggregate_metrics` per Environment Server (or
  agent), written to `out_aggregate_metrics.json` (0.7.0's entries: `agent_ref`, `_ng_environment_server`,
  `agent_metrics`, `key_metrics`, `group_level_metrics`, `repeat_level_metrics`).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

from gymfleet.errors import ConfigError
from gymfleet.rollouts import rows
from gymfleet.serving.nemo_gym_client import get_response_json, plain_config, raise_for_status
from gymfleet.serving.nemo_gym_records import NG_FAILURE_CLASS_KEY, aggregate_metrics_path_for
from gymfleet.serving.nemo_gym_types import AGENT_REF_KEY_NAME, ROLLOUT_INDEX_KEY_NAME, TASK_INDEX_KEY_NAME

log = logging.getLogger(__name__)

AGENT_REQUEST_FAILED_FAILURE_CLASS = "agent_request_failed"
AGENT_RUN_ERROR_FAILURE_CLASS = "agent_run_error"
ENVIRONMENT_SERVER_FAILURE_CLASS = "environment_server_failed"
NG_ENVIRONMENT_SERVER_KEY = "_ng_environment_server"
NG_RESULT_TYPE_KEY = "_ng_result_type"
NG_DISPATCH_DRAINED_KEY = "_ng_dispatch_drained"
GATEWAY_STATUSES = frozenset({429, 502, 503, 504})
"""Statuses something in front of a server answers with: they say nothing about whether the rollout ran."""
MAX_FAILURE_BODY_CHARS = 2000


def agent_request_failure_row(exc: BaseException, status: int | None) -> dict[str, Any]:
    """The sidecar row of a `/run` that returned no result (see the module docstring)."""
    body = getattr(exc, "response_content", None)
    text = None
    if body:
        text = body[:MAX_FAILURE_BODY_CHARS * 4].decode("utf-8", "replace")[:MAX_FAILURE_BODY_CHARS]
        text += "…" if len(body) > MAX_FAILURE_BODY_CHARS else ""
    ran = status is not None and status not in GATEWAY_STATUSES
    return {
        NG_FAILURE_CLASS_KEY: AGENT_RUN_ERROR_FAILURE_CLASS if ran else AGENT_REQUEST_FAILED_FAILURE_CLASS,
        "_ng_failure_type": type(exc).__name__,
        "_ng_failure_message": str(exc) or repr(exc),
        "_ng_failure_http_status": status,
        "_ng_failure_response_body": text,
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of `path`, one a line (`gymfleet.rollouts.rows.read_jsonl` without the line numbers).

    Raises:
        DataError: the file does not exist, or a line is not a JSON object (naming the file and line).
    """
    return [row for _, row in rows.read_jsonl(path)]


def rollout_key(row: Mapping[str, Any]) -> tuple[Any, Any]:
    return row.get(TASK_INDEX_KEY_NAME), row.get(ROLLOUT_INDEX_KEY_NAME)


def rollout_order_key(row: Mapping[str, Any]) -> tuple[Any, Any]:
    """Task, then repeat (metrics that read a task's repeats by position need that order)."""
    return row.get(TASK_INDEX_KEY_NAME) or 0, row.get(ROLLOUT_INDEX_KEY_NAME) or 0


def routing_identity(row: Mapping[str, Any]) -> str | None:
    """The agent a rollout ran on, else its Environment Server stamp."""
    return (row.get(AGENT_REF_KEY_NAME) or {}).get("name") or row.get(NG_ENVIRONMENT_SERVER_KEY)


def latest_failure_rows(paths: list[Path]) -> dict[tuple[Any, Any], dict[str, Any]]:
    """The last attempt recorded for each rollout across the failures sidecars."""
    latest: dict[tuple[Any, Any], dict[str, Any]] = {}
    for path in paths:
        if path.exists():
            for row in read_jsonl(path):
                latest[rollout_key(row)] = row
    return latest


def counted_failure_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The metric-input copy of a sidecar row counted as zero (diagnostics left in the sidecar)."""
    scored = {k: v for k, v in row.items()
              if not k.startswith("_ng_failure_") and k not in ("failure_kind", "failure_reason")}
    scored["mask_sample"] = False
    scored.setdefault("reward", 0.0)
    return scored


def failure_rows_counted_as_zero(paths: list[Path], classes: list[str], scored: set) -> list[dict[str, Any]]:
    """The latest sidecar rows of `classes` whose rollout has no result, as metric-input zeros."""
    if not classes:
        return []
    wanted = set(classes)
    return [counted_failure_row(row) for key, row in latest_failure_rows(paths).items()
            if key not in scored and row.get(NG_FAILURE_CLASS_KEY) in wanted]


def missing_rollout_rows_counted_as_zero(materialized: list[Path], failures: list[Path],
                                         scored: set) -> list[dict[str, Any]]:
    """Materialized rollouts with no row anywhere (neither a result nor a failure), as zeros; `scored` gains them."""
    recorded = set(latest_failure_rows(failures))
    counted, unroutable = [], 0
    for path in materialized:
        if not path.exists():
            log.warning("%s is missing; the rollouts that shard owes cannot be counted", path)
            continue
        for row in read_jsonl(path):
            key = rollout_key(row)
            if key in scored or key in recorded:
                continue
            if routing_identity(row) is None:
                unroutable += 1
                continue
            scored.add(key)
            zero = {TASK_INDEX_KEY_NAME: key[0], ROLLOUT_INDEX_KEY_NAME: key[1],
                    AGENT_REF_KEY_NAME: row.get(AGENT_REF_KEY_NAME), "reward": 0.0}
            if NG_ENVIRONMENT_SERVER_KEY in row:
                zero[NG_ENVIRONMENT_SERVER_KEY] = row[NG_ENVIRONMENT_SERVER_KEY]
            counted.append(zero)
    if unroutable:
        log.warning("%d materialized rollout(s) name no agent or environment server and are not counted", unroutable)
    return counted


def fill_task_fields(added: list[dict[str, Any]], real: list[dict[str, Any]], materialized: list[Path],
                     group: Callable[[Mapping[str, Any]], str | None]) -> None:
    """Give counted rows their task's dataset fields (from the materialized row), only those that real rows of the
    same group carry (a field no real row reports would become a metric of its own)."""
    def identity(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return group(row), *rollout_key(row)

    wanted = {identity(row): row for row in added}
    if not wanted:
        return
    carried: dict[str | None, set] = defaultdict(set)
    for row in real:
        carried[group(row)].update(row)
    for path in materialized:
        if not path.exists():
            continue
        for source in read_jsonl(path):
            target = wanted.get(identity(source))
            if target is not None:
                for key in carried[group(source)] & source.keys():
                    if not key.startswith("_") and key not in ("responses_create_params", "response"):
                        target.setdefault(key, source[key])


def coverage_report(expected: int, scored: int, failure_counts: Counter, hint: Any, *, imputed: int = 0) -> str:
    """How much of the input the score covers, when it is not all of it."""
    report = ""
    if expected - scored > 0:
        routed = ", ".join(f"{count} {name}" for name, count in sorted(failure_counts.items()))
        routed = f"{routed} routed this run; " if routed else ""
        report = (f"\nRollouts missing from the score: {expected - scored} of {expected} materialized ({routed}see "
                  f"{hint})\nMetrics cover: {scored} of {expected} rollouts")
    if imputed:
        report += f"\nScored as zero because they left no row: {imputed} of {expected} rollouts"
    return report


# ---------------------------------------------------------------------------------------------- Environment Servers


def _agent_names(server: Mapping[str, Any]) -> list[str]:
    """The agents one Environment Server's config references: `agent_server`, and any field of type
    `responses_api_agents`."""
    return [str(ref["name"]) for field, ref in server.items()
            if isinstance(ref, Mapping) and ref.get("name") is not None
            and (field == "agent_server" or ref.get("type") == "responses_api_agents")]


def environment_servers_by_agent(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Each agent's name -> the Environment Server instances that front it."""
    found: dict[str, list[str]] = {}
    for name, instance in config.items():
        servers = instance.get("environment_servers") if isinstance(instance, Mapping) else None
        for server in (servers or {}).values() if isinstance(servers, Mapping) else ():
            if isinstance(server, Mapping):
                for agent in _agent_names(server):
                    found.setdefault(agent, []).append(str(name))
    return found


def environment_server_types(config: Mapping[str, Any]) -> dict[str, str]:
    """Each Environment Server instance -> its type (`legacy_agent`, ...)."""
    return {str(name): str(next(iter(block["environment_servers"])))
            for name, block in config.items()
            if isinstance(block, Mapping) and isinstance(block.get("environment_servers"), Mapping)
            and block["environment_servers"]}


def environment_server_for_agent(agent: str, by_agent: Mapping[str, list[str]]) -> str | None:
    """The one Environment Server fronting `agent`; None when none does (the agent is called itself).

    Raises:
        ConfigError: several Environment Servers front it (rows routed by agent cannot choose).
    """
    servers = by_agent.get(agent, [])
    if len(servers) > 1:
        raise ConfigError(f"agent {agent!r} is fronted by several environment servers: {sorted(servers)}",
                          path="environment_routing_mode",
                          hint="set environment_routing_mode=legacy with environment_server_name, or route these "
                               "rows by taskset")
    return servers[0] if servers else None


def label_runs(agent_by_key: Mapping[str, str | None]) -> dict[str, str]:
    """Each run key labelled by its agent's name where that name names one run only, else by the key itself."""
    keys_by_agent: dict[str, set] = defaultdict(set)
    for key, agent in agent_by_key.items():
        if agent is not None:
            keys_by_agent[agent].add(key)
    labels = {key: agent if agent is not None and len(keys_by_agent[agent]) == 1 else key
              for key, agent in agent_by_key.items()}
    while clashing := [key for key, label in labels.items()
                       if Counter(labels.values())[label] > 1 and label != key]:
        for key in clashing:
            labels[key] = key
    return labels


_HEAVY = ("response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture", "ng_trajectory")


def _for_aggregation(result: Mapping[str, Any]) -> dict[str, Any]:
    """A result without its bulky payloads (its response's `usage` and `incomplete_details` kept)."""
    entry = {k: v for k, v in result.items() if k not in _HEAVY}
    response = result.get("response") or {}
    kept = {k: response[k] for k in ("usage", "incomplete_details")
            if isinstance(response, Mapping) and response.get(k) is not None}
    if kept:
        entry["response"] = kept
    return entry


async def call_aggregate_metrics(client: Any, results: list[dict[str, Any]], rows: list[dict[str, Any]],
                                 output_fpath: Path) -> Path | None:
    """`/aggregate_metrics` of each Environment Server (else agent) the rollouts ran through, written to
    `<out>_aggregate_metrics.json`; None when there is nothing to aggregate.

    Raises:
        ConfigError: a row is stamped with an Environment Server the fleet's config does not have.
        TransportError: a server failed to answer (`aiohttp.ClientResponseError` too).
    """
    if not results:
        return None
    config = plain_config(client.global_config_dict)
    by_agent, types = environment_servers_by_agent(config), environment_server_types(config)
    grouped: dict[str, list[dict[str, Any]]] = {}
    agents: dict[str, str | None] = {}
    for row, result in zip(rows, results, strict=True):
        agent = (row.get(AGENT_REF_KEY_NAME) or result.get(AGENT_REF_KEY_NAME) or {}).get("name")
        server = row.get(NG_ENVIRONMENT_SERVER_KEY) or result.get(NG_ENVIRONMENT_SERVER_KEY)
        if not isinstance(server, str):
            if not agent:
                continue
            server = environment_server_for_agent(agent, by_agent) or agent
        elif server not in types:
            raise ConfigError(f"result rows are stamped with environment server {server!r}, which the running "
                              f"fleet does not have (it has {sorted(types)})", path=NG_ENVIRONMENT_SERVER_KEY,
                              hint="aggregate with the fleet config that produced them")
        grouped.setdefault(server, []).append(result)
        agents.setdefault(server, agent)
    labels = label_runs(agents)
    entries = []
    for server, server_results in grouped.items():
        answer = await client.post(server_name=server, url_path="/aggregate_metrics",
                                   json={"verify_responses": [_for_aggregation(r) for r in server_results]})
        await raise_for_status(answer)
        metrics = await get_response_json(answer)
        entry = {AGENT_REF_KEY_NAME: {"name": labels[server]},
                 **({NG_ENVIRONMENT_SERVER_KEY: server} if server in types else {}),
                 **{k: metrics.get(k, default) for k, default in (
                     ("agent_metrics", {}), ("key_metrics", {}), ("group_level_metrics", []),
                     ("repeat_level_metrics", []))}}
        if metrics.get("perf_summary") is not None:
            entry["perf_summary"] = metrics["perf_summary"]
        entries.append(entry)
        log.info("key metrics of %s: %s", labels[server], entry["key_metrics"])
    path = aggregate_metrics_path_for(output_fpath)
    path.write_bytes(orjson.dumps(entries, option=orjson.OPT_INDENT_2))
    return path
