"""NeMo-Gym 0.7.0's `nemo_gym.base_environment_server`: the shared lifecycle of an Environment Server.

An Environment Server (a folder under a NeMo-Gym tree's `environment_servers/`) answers `POST /run` with one typed
episode: its `request_model` (a `BaseEpisodeRequest`) in, its `response_model` (a `BaseEpisodeResponse`) out, and
`POST /aggregate_metrics`. `BaseEnvironmentServer.run_request` wraps the subclass's `run(request, cleanup)`:

- admission: with `max_concurrent_episodes`, at most that many run at once; one that waits past
  `queue_timeout_seconds` is a non-terminal `admission` failure (the config requires the timeout with the limit);
- a deadline of `default_episode_timeout_seconds`: past it, a non-terminal "Episode timed out" failure;
- a `HandledEpisodeError(failure)` raised by `run` is answered as that failure; any other exception is a terminal
  failure naming it (and logged); a cancelled request stays cancelled;
- the episode runs inside `rollout_context(episode_id.capture_key)`, so its downstream calls carry the attempt's id;
- `CleanupContext`: callbacks `run` registers (`register_cleanup(name, callback)`, idempotent, each closable early
  through its `CleanupHandle`) run afterwards in reverse order, once each, shielded from cancellation, all within
  `cleanup_timeout_seconds`; one that raises is logged and the rest still run;
- the answer is validated as `response_model`, and its `episode_id` and `task_id` must be the request's.

gymfleet serves resources servers, models and agents; a fleet does not yet start Environment Servers (an
`environment_servers:` instance), so this is the class their folders and tests build on, with NeMo-Gym's behaviour.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from anyio import CancelScope
from fastapi import FastAPI
from pydantic import ConfigDict, PositiveFloat, PositiveInt, model_validator

from gymfleet.serving.nemo_gym_episodes import BaseEpisodeRequest, BaseEpisodeResponse, EpisodeFailure
from gymfleet.serving.nemo_gym_rollout import rollout_context
from gymfleet.serving.nemo_gym_server import SimpleServer
from gymfleet.serving.nemo_gym_types import (
    AggregateMetrics,
    AggregateMetricsRequest,
    BaseRunServerInstanceConfig,
    EpisodeId,
)

log = logging.getLogger(__name__)

EpisodeRequestT = TypeVar("EpisodeRequestT", bound=BaseEpisodeRequest[Any])
EpisodeResponseT = TypeVar("EpisodeResponseT", bound=BaseEpisodeResponse[Any])
CleanupCallback = Callable[[], Awaitable[None]]
REASON_CHARS = 2000
"""`EpisodeFailure.failure_reason`'s limit."""


class BaseEnvironmentServerConfig(BaseRunServerInstanceConfig):
    """An Environment Server's episode limits (unknown keys refused)."""

    model_config = ConfigDict(extra="forbid")
    max_concurrent_episodes: PositiveInt | None = None
    queue_timeout_seconds: PositiveFloat | None = None
    default_episode_timeout_seconds: PositiveFloat | None = None
    cleanup_timeout_seconds: PositiveFloat

    @model_validator(mode="after")
    def _queue_timeout_with_limit(self) -> BaseEnvironmentServerConfig:
        if self.max_concurrent_episodes is not None and self.queue_timeout_seconds is None:
            raise ValueError("queue_timeout_seconds is required when max_concurrent_episodes is enabled")
        return self


@dataclass
class _Cleanup:
    name: str
    callback: CleanupCallback
    done: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run_once(self) -> None:
        async with self.lock:
            if not self.done:
                await self.callback()
                self.done = True


@dataclass
class CleanupHandle:
    """Closes one registered callback early (once; later closes, and the final unwinding, skip it)."""

    entry: _Cleanup
    timeout_seconds: float

    async def close(self) -> None:
        async with asyncio.timeout(self.timeout_seconds):
            await self.entry.run_once()


@dataclass
class CleanupContext:
    """One episode's cleanup callbacks (module docstring). They live in this process: what they release remotely
    needs an expiry of its own in case the process dies first."""

    episode_id: EpisodeId
    cleanup_timeout_seconds: float
    _cleanups: list[_Cleanup] = field(default_factory=list)

    def register_cleanup(self, name: str, callback: CleanupCallback) -> CleanupHandle:
        entry = _Cleanup(name, callback)
        self._cleanups.append(entry)
        return CleanupHandle(entry, self.cleanup_timeout_seconds)

    async def aclose(self) -> None:
        """Run every callback not yet run, last registered first, within `cleanup_timeout_seconds` in all."""
        try:
            async with asyncio.timeout(self.cleanup_timeout_seconds):
                for entry in reversed(self._cleanups):
                    try:
                        await entry.run_once()
                    except Exception:
                        log.exception("episode %s: cleanup %r failed", self.episode_id, entry.name)
        except TimeoutError:
            log.error("episode %s: cleanup timed out after %ss", self.episode_id, self.cleanup_timeout_seconds)


class HandledEpisodeError(Exception):
    """Raised by `run` for a failure that is the episode's answer (`failure`), not a crash."""

    def __init__(self, failure: EpisodeFailure) -> None:
        super().__init__(failure.failure_reason)
        self.failure = failure


class BaseEnvironmentServer(SimpleServer, Generic[EpisodeRequestT, EpisodeResponseT]):
    """A typed episode protocol at `POST /run`, with shared limits and cleanup (module docstring)."""

    config: BaseEnvironmentServerConfig
    request_model: ClassVar[type[BaseEpisodeRequest[Any]]]
    response_model: ClassVar[type[BaseEpisodeResponse[Any]]]
    _admission: asyncio.Semaphore | None = None

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        limit = self.config.max_concurrent_episodes
        self._admission = asyncio.Semaphore(limit) if limit is not None else None

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()

        async def run_endpoint(body: Any) -> Any:
            return await self.run_request(body)

        async def aggregate_metrics_endpoint(body: AggregateMetricsRequest) -> AggregateMetrics:
            return await self.aggregate_metrics(body)

        # The body and answer types are this class's, known only now (annotations are strings under __future__).
        run_endpoint.__annotations__ = {"body": self.request_model, "return": self.response_model}
        aggregate_metrics_endpoint.__annotations__ = {"body": AggregateMetricsRequest, "return": AggregateMetrics}
        app.post("/run", response_model=self.response_model)(run_endpoint)
        app.post("/aggregate_metrics", response_model=AggregateMetrics)(aggregate_metrics_endpoint)
        return app

    async def run_request(self, request: EpisodeRequestT) -> EpisodeResponseT:
        """One episode through admission, deadline, failure mapping and cleanup (module docstring)."""
        if self._admission is not None:
            try:
                await asyncio.wait_for(self._admission.acquire(), timeout=self.config.queue_timeout_seconds)
            except TimeoutError:
                return self.failure_response(request, EpisodeFailure(
                    failure_reason="Episode admission timed out", terminal=False, stage="admission"))
        cleanup = CleanupContext(request.episode_id, float(self.config.cleanup_timeout_seconds))
        deadline = asyncio.timeout(self.config.default_episode_timeout_seconds)
        try:
            with rollout_context(request.episode_id.capture_key):
                try:
                    async with deadline:
                        response = await self.run(request, cleanup)
                except TimeoutError as error:
                    response = (self.failure_response(request, EpisodeFailure(failure_reason="Episode timed out",
                                                                              terminal=False))
                                if deadline.expired() else self._unhandled(request, error))
                except HandledEpisodeError as error:
                    response = self.failure_response(request, error.failure)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    response = self._unhandled(request, error)
                finally:
                    with CancelScope(shield=True):
                        await cleanup.aclose()
        finally:
            if self._admission is not None:
                self._admission.release()
        response = self.response_model.model_validate(response)
        self.validate_response_identity(request, response)
        return response

    @abstractmethod
    async def run(self, request: EpisodeRequestT, cleanup: CleanupContext) -> EpisodeResponseT:
        """Run one episode of this environment's protocol."""

    def _unhandled(self, request: EpisodeRequestT, error: Exception) -> EpisodeResponseT:
        log.exception("episode %s: unhandled %s", request.episode_id, type(error).__name__)
        reason = f"Unhandled environment server error: {type(error).__name__}: {error}"
        return self.failure_response(request, EpisodeFailure(failure_reason=reason[:REASON_CHARS], terminal=True))

    def failure_response(self, request: EpisodeRequestT, failure: EpisodeFailure) -> EpisodeResponseT:
        """This server's `response_model` carrying `failure` for `request`."""
        return self.response_model.model_validate({"episode_id": request.episode_id, "task_id": request.task.task_id,
                                                   "failure": failure.model_dump(mode="json")})

    @staticmethod
    def validate_response_identity(request: EpisodeRequestT, response: EpisodeResponseT) -> None:
        """Raises `ValueError` when `response` names another episode or task than `request`."""
        if response.episode_id != request.episode_id:
            raise ValueError("response episode_id does not match request")
        if response.task_id != request.task.task_id:
            raise ValueError("response task_id does not match request")

    @abstractmethod
    async def aggregate_metrics(self, body: AggregateMetricsRequest) -> AggregateMetrics:
        """Task-level metrics over per-rollout scores."""
