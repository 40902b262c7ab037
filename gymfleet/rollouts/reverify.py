"""Re-verification: re-score a stored rollouts file and say which rewards changed, and why (`ng_reverify`).

`reverify(config, backend)` reads a rollouts JSONL as `ng_collect_rollouts` writes it (one verify answer per line,
with `response`, `agent_ref` and the `reward_provenance` it was scored under) and re-POSTs each row's `/verify` to
its environment: the agent named by the row's `agent_ref` names its resources server in the fleet config
(`responses_api_agents.<impl>.resources_server`). Two backends:

- `FleetBackend`: a running fleet, found through its head server, over `gymfleet.http`;
- `InProcessBackend`: no fleet: each environment is built from the config files (`gymfleet.fleet.launch.build_server`)
  and its real app is called through an ASGI transport (routes, middleware and lifespan included). Meant for
  environments that call no other server; a judge environment's judge is not there (its rows fail, typed).

Each environment's `GET /reverify_mode` decides: `stateless` rows are re-scored; `unsupported` rows are skipped
(the reward needs the rollout's session); `unknown` rows are skipped unless `+reverify_unknown=true`.

Incremental and resumable: every re-score is appended to a cache (`<stem>_reverify_cache.jsonl` beside the input,
flushed per line, fsync'd every `FSYNC_EVERY` lines and at the end) keyed by the SHA-256 of the verify input (the
row and its response without the reward, the environment's fields a failure adds, `reward_provenance` and the
collector's attempt bookkeeping) and of the environment's current `reward_provenance` (`GET /reward_provenance`).
A row whose key is cached is not re-POSTed; an interrupted run rerun picks up where it stopped; a changed
environment version, config, library or judge changes the key, so exactly that environment's rows are re-scored.

Output: a table per environment (rows, re-scored, from cache, unchanged, changed, skipped, failed), and
`<stem>_reverify.jsonl` with one line per changed row: its input line, key, task and rollout indices, environment,
old and new reward, and `why`: the provenance fields that differ between the stored row and now
(`gymfleet.serving.provenance.provenance_diff`), or `["same provenance"]` (the environment is not deterministic).
Infrastructure failures while re-verifying (environment unreachable, non-2xx, a `_ng_failure_class` answer) are
counted by class, never as changed rewards, and never cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gymfleet.errors import ConfigError, DataError, TransportError
from gymfleet.fleet.config_instances import GlobalConfig
from gymfleet.http import HttpResponse, RetryPolicy, ServerClient
from gymfleet.progress import Progress
from gymfleet.rollouts.rows import read_jsonl
from gymfleet.serving.provenance import PROVENANCE_KEY, provenance_diff

log = logging.getLogger(__name__)

MODES = ("stateless", "unsupported", "unknown")
NOT_VERIFY_INPUT = frozenset({
    "reward", PROVENANCE_KEY, "failure", "_ng_failure_class", "_ng_failure_status", "_ng_failure_detail",
    "_ng_attempt_index", "_ng_superseded",
})  # fmt: skip
"""Row fields that are not part of the verify input: what `/verify` and the collector added."""
FSYNC_EVERY = 256
VERIFY_RETRY = RetryPolicy(max_attempts=3)
"""Connection failures and 429/502/503/504 are retried; a POST that may have run is not."""
SAME_PROVENANCE = "same provenance"
PROGRESS_EVERY_S = 10.0


class ReverifyConfig(BaseModel):
    """`ng_reverify`'s keys."""

    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)

    input_jsonl_fpath: str
    """The rollouts file to re-score (as `ng_collect_rollouts` wrote it)."""
    output_jsonl_fpath: str | None = None
    """Where the changed rows go (default `<input stem>_reverify.jsonl`; rewritten each run)."""
    cache_jsonl_fpath: str | None = None
    """The re-score cache (default `<input stem>_reverify_cache.jsonl`; appended to)."""
    concurrency: int = Field(default=32, ge=1)
    """`/verify` calls in flight at once."""
    reverify_unknown: bool = False
    """Re-score rows of environments whose `reverify_mode` is `unknown` (skipped otherwise)."""
    in_process: bool | None = None
    """Build the environments from `+config_paths` and call them in this process (default: when config paths are
    given); false: use the running fleet at `+head_server`."""
    agent_name: str | None = None
    """The agent of rows without `agent_ref`."""
    request_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline for one `/verify`."""
    limit: int | None = Field(default=None, ge=1)
    """Re-score only the first `limit` rows."""

    def path(self, given: str | None, suffix: str) -> Path:
        if given:
            return Path(given)
        source = Path(self.input_jsonl_fpath)
        return source.with_name(source.stem + suffix)

    @property
    def output(self) -> Path:
        return self.path(self.output_jsonl_fpath, "_reverify.jsonl")

    @property
    def cache(self) -> Path:
        return self.path(self.cache_jsonl_fpath, "_reverify_cache.jsonl")


# ------------------------------------------------------------------------------------------------ backends


@dataclass
class Environment:
    """What re-verification needs of one resources server instance."""

    instance: str
    mode: str | None
    """`reverify_mode`, or None when it could not be asked (`failure` says why)."""
    provenance: dict[str, Any] | None
    verify: Callable[[dict[str, Any]], Awaitable[HttpResponse]]
    failure: tuple[str, str] | None = None
    """`(failure_class, detail)` when the environment could not be reached."""


class FleetBackend:
    """Environments of a running fleet, called through `gymfleet.http` by instance name."""

    def __init__(self, client: ServerClient, timeout_s: float = 600.0):
        self.client = client
        self.config = client.config
        self.timeout_s = timeout_s

    async def __aenter__(self) -> FleetBackend:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None

    async def environment(self, instance: str) -> Environment:
        async def verify(body: dict[str, Any]) -> HttpResponse:
            return await self.client.post(instance, "/verify", json=body, timeout_s=self.timeout_s,
                                          retry=VERIFY_RETRY)

        try:
            answer = (await self.client.get(instance, "/reverify_mode", timeout_s=30.0)).raise_for_status()
            mode = answer.json()
            provenance_answer = await self.client.get(instance, "/reward_provenance", timeout_s=30.0)
        except TransportError as exc:
            return Environment(instance, None, None, verify, (exc.failure_class, str(exc)))
        provenance = provenance_answer.json() if provenance_answer.ok else None
        if provenance is None:
            log.warning("%s has no GET /reward_provenance: its rows are cached under its address only", instance)
            provenance = {"instance": instance, "url": self.client.url_of(instance)}
        return Environment(instance, mode if mode in MODES else "unknown", provenance, verify)


class InProcessBackend:
    """Environments built from the config and called through their real ASGI app in this process."""

    def __init__(self, config: GlobalConfig, timeout_s: float = 600.0):
        self.config = config.data
        self.global_config = config
        self.timeout_s = timeout_s
        self._stack = contextlib.AsyncExitStack()
        self._built: dict[str, Environment] = {}

    async def __aenter__(self) -> InProcessBackend:
        await self._stack.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._stack.__aexit__(*exc)

    async def environment(self, instance: str) -> Environment:
        import httpx

        from gymfleet.fleet.launch import build_server

        if instance in self._built:
            return self._built[instance]
        found = self.global_config.instance(instance)
        # Served by no socket: the port (null in a config parsed without assigning ports) only has to validate.
        server = build_server(dataclasses.replace(found, fields={**found.fields, "port": found.port or 0}),
                              self.global_config)
        app = server.create_app()
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        client = await self._stack.enter_async_context(
            # A loopback Host: a server bound to loopback refuses any other (`gymfleet.serving.guard`).
            httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=self.timeout_s)
        )

        async def verify(body: dict[str, Any]) -> HttpResponse:
            try:
                answer = await client.post("/verify", content=orjson.dumps(body),
                                           headers={"content-type": "application/json"})
            except httpx.TimeoutException as exc:
                raise TransportError(f"{instance} /verify: no answer in {self.timeout_s:g}s", failure_class="timeout",
                                     url=f"http://{instance}/verify") from exc
            return HttpResponse(answer.status_code, answer.content, str(answer.url), answer.headers)

        built = self._built[instance] = Environment(instance, server.reverify_mode, server.reward_provenance(), verify)
        return built


def resources_server_of(config: dict[str, Any], agent: str) -> str | None:
    """The resources server instance agent `agent` names in the fleet config (`{type, name}` or a plain name)."""
    block = config.get(agent)
    impls = block.get("responses_api_agents") if isinstance(block, dict) else None
    for fields in (impls.values() if isinstance(impls, dict) else ()):
        ref = fields.get("resources_server") if isinstance(fields, dict) else None
        if isinstance(ref, dict):
            ref = ref.get("name")
        if isinstance(ref, str) and ref:
            return ref
    return None


# ------------------------------------------------------------------------------------------------ the run


def verify_input(row: dict[str, Any]) -> dict[str, Any]:
    """The `/verify` body of a stored row: the row without what `/verify` and the collector added."""
    return {key: value for key, value in row.items() if key not in NOT_VERIFY_INPUT}


def cache_key(body: dict[str, Any], provenance: Any) -> str:
    """SHA-256 (32 hex digits) of the verify input and the environment's current provenance."""
    digest = hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
    digest.update(b"\0" + orjson.dumps(provenance, option=orjson.OPT_SORT_KEYS))
    return digest.hexdigest()[:32]


def load_cache(path: Path) -> dict[str, float]:
    """`{key: reward}` from the cache file; a line cut short by an interrupted run is ignored (with a warning)."""
    cache: dict[str, float] = {}
    if not path.is_file():
        return cache
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            try:
                entry = orjson.loads(line)
                cache[entry["key"]] = float(entry["reward"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                if line.strip():
                    log.warning("%s:%d: unreadable cache line ignored (an interrupted write?)", path, lineno)
    return cache


class CacheWriter:
    """Appends cache entries, flushing each line and fsync-ing every `FSYNC_EVERY` lines and on close."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle: IO[bytes] = path.open("ab")
        self.unsynced = 0

    def add(self, key: str, reward: float) -> None:
        self.handle.write(orjson.dumps({"key": key, "reward": reward}) + b"\n")
        self.handle.flush()
        self.unsynced += 1
        if self.unsynced >= FSYNC_EVERY:
            self.sync()

    def sync(self) -> None:
        os.fsync(self.handle.fileno())
        self.unsynced = 0

    def close(self) -> None:
        self.sync()
        self.handle.close()


@dataclass
class EnvironmentCounts:
    """One environment's line of the summary table."""

    mode: str = "-"
    rows: int = 0
    rescored: int = 0
    cached: int = 0
    unchanged: int = 0
    changed: int = 0
    skipped: int = 0
    failed: int = 0


COLUMNS = ("rows", "rescored", "cached", "unchanged", "changed", "skipped", "failed")
HEADERS = ("rows", "re-scored", "from cache", "unchanged", "changed", "skipped", "failed")


@dataclass
class ReverifySummary:
    """What a re-verification found (`table()` prints it)."""

    input_path: Path
    output_path: Path
    cache_path: Path
    by_environment: dict[str, EnvironmentCounts] = field(default_factory=dict)
    skipped_reasons: Counter = field(default_factory=Counter)
    failure_classes: Counter = field(default_factory=Counter)
    unreachable: dict[str, str] = field(default_factory=dict)
    """Environment -> why it could not be asked anything."""
    changes: list[dict[str, Any]] = field(default_factory=list)

    def counts(self, environment: str) -> EnvironmentCounts:
        return self.by_environment.setdefault(environment, EnvironmentCounts())

    def total(self, column: str) -> int:
        return sum(getattr(counts, column) for counts in self.by_environment.values())

    @property
    def exit_code(self) -> int:
        return 1 if self.total("failed") else 0

    def table(self) -> str:
        names = sorted(self.by_environment)
        width = max([len("environment"), len("total"), *map(len, names)])
        lines = [f"Re-verification of {self.input_path}",
                 f"{'environment':<{width}}  {'mode':<11}  " + "  ".join(f"{h:>10}" for h in HEADERS)]
        for name in names:
            counts = self.by_environment[name]
            lines.append(f"{name:<{width}}  {counts.mode:<11}  "
                         + "  ".join(f"{getattr(counts, c):>10}" for c in COLUMNS))
        lines.append(f"{'total':<{width}}  {'':<11}  " + "  ".join(f"{self.total(c):>10}" for c in COLUMNS))
        if self.skipped_reasons:
            lines.append("Skipped: " + "; ".join(f"{reason} ({n})" for reason, n in self.skipped_reasons.items()))
        if self.failure_classes:
            lines.append("Failed (infrastructure, not reward changes): "
                         + ", ".join(f"{cls}: {n}" for cls, n in sorted(self.failure_classes.items())))
        lines += [f"{name}: {detail}" for name, detail in sorted(self.unreachable.items())]
        lines.append(f"Wrote {len(self.changes)} changed rows: {self.output_path}")
        lines.append(f"Cache: {self.cache_path}")
        return "\n".join(lines)


def read_rollouts(path: Path, limit: int | None = None) -> list[tuple[int, dict[str, Any]]]:
    """`(line number, row)` of a rollouts file.

    Raises:
        ConfigError: the file is missing.
        DataError: a line (named `file:line`) is not a JSON object or holds no `response`.
    """
    if not path.is_file():
        raise ConfigError(f"{path}: no such file", path="input_jsonl_fpath",
                          hint="Give +input_jsonl_fpath=<rollouts.jsonl>, a file ng_collect_rollouts wrote.")
    rows = read_jsonl(path)
    for lineno, row in rows:
        if not isinstance(row.get("response"), dict):
            raise DataError("no `response` object: not a rollout as ng_collect_rollouts writes them (one verify "
                            "answer per line)", file=str(path), line=lineno)
    return rows[:limit] if limit else rows


def _is_reward(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


async def reverify(config: ReverifyConfig, backend: FleetBackend | InProcessBackend, *,
                   rows: list[tuple[int, dict[str, Any]]] | None = None, progress: bool = True) -> ReverifySummary:
    """Re-score `config.input_jsonl_fpath` through `backend` (see the module docstring).

    Args:
        config: what to re-score, where the cache and the report go.
        backend: the environments (`FleetBackend` or `InProcessBackend`, entered).
        rows: `read_rollouts(...)` of the input, if already read.
        progress: show progress on stderr.

    Raises:
        DataError: a malformed rollouts line (nothing is sent).
    """
    source = Path(config.input_jsonl_fpath)
    rows = read_rollouts(source, config.limit) if rows is None else rows
    summary = ReverifySummary(source, config.output, config.cache)
    cache = load_cache(config.cache)
    targets: dict[int, str | None] = {}
    for lineno, row in rows:
        ref = row.get("agent_ref")
        agent = ref.get("name") if isinstance(ref, dict) else config.agent_name
        targets[lineno] = resources_server_of(backend.config, agent) if agent else None
    instances = sorted({name for name in targets.values() if name})
    environments = dict(zip(instances, await asyncio.gather(*(_environment(backend, name) for name in instances)),
                            strict=True))
    for name, environment in environments.items():
        summary.counts(name).mode = environment.mode or "unreachable"
        if environment.failure is not None:
            summary.unreachable[name] = environment.failure[1]
    semaphore = asyncio.Semaphore(config.concurrency)
    writer = CacheWriter(config.cache)
    try:
        with Progress(len(rows), "Re-verifying", unit="row", file=sys.stderr, enabled=progress,
                      every_s=PROGRESS_EVERY_S) as bar:
            jobs = [_one(lineno, row, environments.get(targets[lineno] or ""), targets[lineno], config, cache,
                         writer, semaphore, summary, bar) for lineno, row in rows]
            await asyncio.gather(*jobs)
    finally:
        writer.close()
    summary.changes.sort(key=lambda change: change["line"])
    config.output.parent.mkdir(parents=True, exist_ok=True)
    scratch = config.output.with_name(config.output.name + ".tmp")
    scratch.write_bytes(b"".join(orjson.dumps(change) + b"\n" for change in summary.changes))
    os.replace(scratch, config.output)
    return summary


async def _environment(backend: FleetBackend | InProcessBackend, name: str) -> Environment:
    try:
        return await backend.environment(name)
    except ConfigError as exc:
        async def unavailable(body: dict[str, Any]) -> HttpResponse:
            raise AssertionError("never called")

        return Environment(name, None, None, unavailable, ("unknown_environment", str(exc)))


async def _one(
    lineno: int, row: dict[str, Any], environment: Environment | None, instance: str | None, config: ReverifyConfig,
    cache: dict[str, float], writer: CacheWriter, semaphore: asyncio.Semaphore, summary: ReverifySummary,
    bar: Progress,
) -> None:
    try:
        counts = summary.counts(instance or "(none)")
        counts.rows += 1
        if environment is None:
            counts.skipped += 1
            summary.skipped_reasons["no resources server for the row's agent (give +agent_name= for rows without "
                                    "agent_ref)"] += 1
            return
        if environment.failure is not None:
            counts.failed += 1
            summary.failure_classes[environment.failure[0]] += 1
            return
        if row.get("_ng_failure_class"):
            counts.skipped += 1
            summary.skipped_reasons["an infrastructure failure row (no reward to compare)"] += 1
            return
        if environment.mode == "unsupported":
            counts.skipped += 1
            summary.skipped_reasons[f"{environment.instance}: reverify_mode is unsupported"] += 1
            return
        if environment.mode == "unknown" and not config.reverify_unknown:
            counts.skipped += 1
            summary.skipped_reasons[f"{environment.instance}: reverify_mode is unknown (+reverify_unknown=true "
                                    "re-scores it anyway)"] += 1
            return
        body = verify_input(row)
        key = cache_key(body, environment.provenance)
        new_provenance = environment.provenance
        if key in cache:
            counts.cached += 1
            new_reward = cache[key]
        else:
            async with semaphore:
                answer = await _verify(environment, body)
            if isinstance(answer, tuple):
                counts.failed += 1
                summary.failure_classes[answer[0]] += 1
                log.debug("%s line %d: %s", summary.input_path, lineno, answer[1])
                return
            counts.rescored += 1
            new_reward = float(answer["reward"])
            new_provenance = answer.get(PROVENANCE_KEY, new_provenance)
            cache[key] = new_reward
            writer.add(key, new_reward)
        old_reward = row.get("reward")
        if _is_reward(old_reward) and float(old_reward) == new_reward:
            counts.unchanged += 1
            return
        counts.changed += 1
        summary.changes.append({
            "line": lineno, "key": key, "_ng_task_index": row.get("_ng_task_index"),
            "_ng_rollout_index": row.get("_ng_rollout_index"), "environment": environment.instance,
            "old_reward": old_reward, "new_reward": new_reward,
            "why": provenance_diff(row.get(PROVENANCE_KEY), new_provenance) or [SAME_PROVENANCE],
        })
    finally:
        bar.update()


async def _verify(environment: Environment, body: dict[str, Any]) -> dict[str, Any] | tuple[str, str]:
    """The `/verify` answer, or `(failure_class, detail)` for an infrastructure failure."""
    try:
        response = await environment.verify(body)
    except TransportError as exc:
        return exc.failure_class, str(exc)
    if not response.ok:
        return response.failure_class, f"HTTP {response.status}: {response.text[:300]}"
    try:
        answer = response.json()
    except orjson.JSONDecodeError:
        return "bad_response", f"not JSON: {response.text[:300]}"
    if not isinstance(answer, dict) or not _is_reward(answer.get("reward")):
        return "bad_response", f"no numeric reward: {response.text[:300]}"
    if answer.get("_ng_failure_class"):
        return str(answer["_ng_failure_class"]), str(answer.get("failure", ""))
    return answer
