"""vllm_model's config (NeMo-Gym's field names, so existing recipes and NeMo-RL overrides work unchanged)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from gymfleet.serving.model import ModelServerConfig


class VLLMModelConfig(ModelServerConfig):
    """vllm_model's fields."""

    base_url: str | list[str]
    """Upstream `.../v1` URL, or one per data-parallel rank: each rollout sticks to one (prefix-cache locality, and
    NeMo-RL's per-rank engines)."""
    api_key: str = "EMPTY"
    """Bearer token for the upstream (from env.yaml or `${oc.env:...}`; never logged)."""
    model: str = ""
    """Model name sent upstream, replacing the caller's (`${policy_model_name}` in recipes)."""
    return_token_id_information: bool = False
    """Training mode: ask for token ids and logprobs, and put `prompt_token_ids`, `generation_token_ids` and
    `generation_log_probs` on the last output item of every call (NeMo-RL trains on them)."""
    uses_reasoning_parser: bool = False
    """The upstream runs a reasoning parser (vLLM `--reasoning-parser`): reasoning comes back as
    `reasoning_content` and prior turns' reasoning is sent back that way. A reasoning field in an answer while this is
    false is an error: the history would be sent back in a shape the chat template does not expect."""
    uses_interleaved_reasoning: bool = True
    """Send prior turns' reasoning back to the model. False drops it from the history (models trained to forget
    their earlier thinking)."""
    request_prompt_and_generation_token_ids: bool = False
    """Ask vLLM for `return_token_ids` (prompt and generation ids in the answer) instead of calling `/tokenize`:
    one round trip less, on vLLM versions that support it."""
    preserve_reasoning_in_assistant_content: bool = False
    """Send prior reasoning back as `<think>…</think>` inside `content`, even with a reasoning parser: for models
    whose chat template only reads assistant `content`."""
    replace_developer_role_with_system: bool = False
    """Send `developer` messages as `system` (chat templates that reject the developer role)."""
    sequential_reasoning_allowed: bool = True
    """False: a conversation ending with an assistant message that holds only reasoning is not sent upstream (the
    model would reason again); the answer is empty with `incomplete_details.reason: content_filter`."""
    is_responses_native: bool = False
    """NeMo-Gym's switch for upstreams that serve `/v1/responses` themselves; not supported here (use
    `openai_model`)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Sent as `chat_template_kwargs` (e.g. `enable_thinking`); a request's `metadata.chat_template_kwargs` (a JSON
    string) wins key by key."""
    extra_body: dict[str, Any] | None = None
    """Extra upstream body fields (e.g. `top_k`, `seed`); a request's `metadata.extra_body` (a JSON string) and the
    request's own fields win."""
    sampling_overrides: dict[str, Any] | None = None
    """Applied last, over everything the caller sent (e.g. pin `temperature` for an evaluation)."""
    default_headers: dict[str, str] | None = None
    """Extra headers on every upstream call."""
    timeout_s: float = Field(default=900.0, gt=0)
    """Deadline for one upstream attempt: a hung upstream becomes a typed `timeout` (HTTP 502), never a hang."""
    upstream_max_attempts: int = Field(default=5, ge=1)
    """Attempts per upstream call on 429/500/502/503/504 or a refused connection (the first included); then a typed
    502. NeMo-Gym retries some of these forever, which turns a dead upstream into a hung rollout."""
    upstream_backoff_s: float = Field(default=0.5, ge=0)
    """First retry backoff; doubles per attempt (full jitter). A `Retry-After` header wins."""
    upstream_max_backoff_s: float = Field(default=15.0, ge=0)
    """Cap on one backoff, `Retry-After` included."""
    upstream_connect_retry_s: float = Field(default=0.0, ge=0)
    """A refused connection (nothing sent) is retried past `upstream_max_attempts` until this many seconds after the
    first attempt (`gymfleet.http`'s `connect_retry_s`), e.g. to ride over an upstream that restarts in seconds. Off
    by default: a vLLM restart takes minutes, and meanwhile every call (a judge's too) would wait this long to fail."""

    @field_validator("is_responses_native")
    @classmethod
    def _chat_upstreams_only(cls, value: bool) -> bool:
        if value:
            raise ValueError("vllm_model talks to Chat Completions upstreams only; for an upstream that serves "
                             "/v1/responses use openai_model")
        return value

    @field_validator("base_url")
    @classmethod
    def _some_url(cls, value: str | list[str]) -> str | list[str]:
        if not value:
            raise ValueError("give at least one upstream URL (e.g. http://127.0.0.1:8000/v1)")
        return value
