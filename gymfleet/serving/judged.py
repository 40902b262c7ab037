"""The plumbing of a resources server that asks a judge model (`gymfleet.grading.judge_gate` is the rule).

`JudgedConfig` holds the fields every judged environment reads (which model, the request it sends, deadline,
attempts, concurrency; `JudgeCallConfig`, the same with the judge optional). `JudgedServer` builds `self.gate` (a
`JudgeGate`) and `self.judge` (its client, what `gymfleet.serving.provenance` records) from them and, in a fleet,
fails at startup on an unknown judge name instead of on the first rollout.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from pydantic import Field

from gymfleet.grading.judge import JUDGE_TIMEOUT_S
from gymfleet.grading.judge_gate import JudgeGate, judge_client, judge_params
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig
from gymfleet.serving.server import ServerRef
from gymfleet.wire import ResponseCreateParams

log = logging.getLogger(__name__)


class JudgeCallConfig(ResourcesServerConfig):
    """The judge's fields, for an environment whose judge is optional (math_with_judge's `should_use_judge`)."""

    judge_model_server: ServerRef | None = None
    """The judge's model server instance."""
    judge_responses_create_params: ResponseCreateParams = ResponseCreateParams(input=[])
    """Base request for judge calls; `input` is replaced by the prompt."""
    judge_timeout_s: float = Field(default=JUDGE_TIMEOUT_S, gt=0)
    """Deadline for one judge call attempt (a model call's: `gymfleet.grading.judge.JUDGE_TIMEOUT_S`); the
    server's `verify_timeout_s` counts neither the call nor the wait for a free slot (`judge_max_concurrency`)."""
    judge_max_attempts: int = Field(default=3, ge=1)
    """Attempts per judge call, the first included."""
    judge_max_concurrency: int = Field(default=64, ge=1)
    """Judge calls in flight at once from this server process."""


class JudgedConfig(JudgeCallConfig):
    """The judge's fields, the judge required."""

    judge_model_server: ServerRef
    """The judge's model server instance (`{type: responses_api_models, name: ...}` or a plain name)."""


class JudgedServer(ResourcesServer):
    """A resources server with a judge: `self.gate` and `self.judge`. `judge_uncapped` is the concurrency of a
    config whose `judge_max_concurrency` is null; `warn_unchecked` logs when no fleet config lets startup check
    the judge's name."""

    config: JudgedConfig
    reverify_mode = "stateless"  # the reward reads the row and the response; no session state
    judge_uncapped: ClassVar[int] = 1 << 20
    warn_unchecked: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.gate = JudgeGate(judge_client(self.config, self.client, uncapped=self.judge_uncapped),
                              params=judge_params(self.config))
        self.judge = self.gate.judge  # what `gymfleet.serving.provenance` records

    async def startup(self) -> None:
        await super().startup()
        if self.global_config:  # in a fleet: an unknown judge name fails at launch, not on the first rollout
            self.judge.url()
        elif self.warn_unchecked:
            log.warning("no fleet config: judge server %r is not checked", self.judge.server)
