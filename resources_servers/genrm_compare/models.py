"""genrm_compare's config and bodies: its config fields (the app's docstring explains each), the `/verify` and
`/compare` bodies, and one judged pair (`Comparison`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymfleet.serving.resources import ResourcesServerConfig, VerifyRequest, VerifyResponse
from gymfleet.serving.server import ServerRef
from resources_servers.genrm_compare.scoring import Shaping


class GenRMCompareConfig(ResourcesServerConfig):
    """genrm_compare's fields (the module docstring explains each)."""

    genrm_model_server: ServerRef
    """The GenRM's model server instance."""
    genrm_responses_create_params: dict[str, Any] = {}
    """Sampling for GenRM calls, Responses-style; sent as Chat Completions fields."""
    judge_timeout_s: float = Field(default=600.0, gt=0)
    judge_max_attempts: int = Field(default=3, ge=1)
    judge_max_concurrency: int = Field(default=256, ge=1)
    num_rollouts_per_prompt: int = 1
    cohort_timeout_s: float = Field(default=1800.0, gt=0)
    verify_timeout_s: float = 2400.0
    comparison_strategy: Literal["circular", "all_pairs"] = "circular"
    num_judges_per_comparison: int = Field(default=1, ge=1)
    aggregator_method: Literal["simple_tiebreaker"] = "simple_tiebreaker"
    use_principle: bool = False
    default_principle: str | None = None
    """Principle for rows without one; null: `principle.txt`."""
    reasoning_bonus: float = Field(default=0.0, ge=0)
    answer_bonus: float = Field(default=0.0, ge=0)
    top_percentile: float = Field(default=0.2, ge=0, le=1)
    group_reasoning_length_penalty_coeff: float = Field(default=0.0, ge=0)
    group_answer_length_penalty_coeff: float = Field(default=0.0, ge=0)
    group_style_penalty_coeff: float = Field(default=0.0, ge=0)
    default_score: float = 3.0
    default_ranking: float = 3.5
    debug_logging: bool = False
    genrm_parse_retries: int = Field(default=3, ge=0)
    genrm_parse_retry_sleep_s: float = Field(default=0.2, ge=0)
    max_open_groups: int = Field(default=4096, ge=1)
    """Groups pending at once (`/verify` groups still short of members, plus `/compare` calls being judged): one
    more is a 429 with Retry-After, so callers cannot grow the registry or the GenRM's queue without bound."""
    max_compare_responses: int = Field(default=64, ge=2)
    """Responses one `/compare` may hold: more is a 413 (its GenRM calls grow with their number, or its square
    with `all_pairs`)."""

    @model_validator(mode="after")
    def _consistent(self):
        if self.num_workers not in (None, 1):
            raise ValueError("genrm_compare keeps its groups in one process: num_workers must be 1")
        if self.verify_timeout_s <= self.cohort_timeout_s:
            raise ValueError(f"verify_timeout_s ({self.verify_timeout_s:g}) must exceed cohort_timeout_s "
                             f"({self.cohort_timeout_s:g}), or waiting members time out before their group does")
        return self

    def shaping(self) -> Shaping:
        return Shaping(default_score=self.default_score, reasoning_bonus=self.reasoning_bonus,
                       answer_bonus=self.answer_bonus, top_percentile=self.top_percentile,
                       group_reasoning_length_penalty_coeff=self.group_reasoning_length_penalty_coeff,
                       group_answer_length_penalty_coeff=self.group_answer_length_penalty_coeff,
                       group_style_penalty_coeff=self.group_style_penalty_coeff)


class GenRMCompareRequest(VerifyRequest):
    """A rollout to score within its group."""

    principle: str | None = None
    prompt_id: str | int | None = None


class GenRMCompareResponse(VerifyResponse):
    """The scored rollout."""


class ConversationMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class CompareRequest(BaseModel):
    """`POST /compare` body (NeMo-Gym's)."""

    conversation_history: Annotated[list[ConversationMessage], Field(fail_fast=True)]
    response_objs: Annotated[list[dict[str, Any]], Field(fail_fast=True)]
    principle: str | None = None


class Comparison(BaseModel):
    """One judged pair of slots."""

    response_1: int
    response_2: int
    judge_index: int
    score_1: float
    score_2: float
    ranking: float
    parsed: bool
    """False when no reply held a verdict and the defaults were used."""
    attempts: int
    provenance: dict[str, Any] | None = Field(default=None, exclude=True)
