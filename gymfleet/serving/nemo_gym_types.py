"""The pydantic types NeMo-Gym environment folders import, with NeMo-Gym 0.7.0's shapes, on gymfleet's wire types.

What folders import from `nemo_gym.base_resources_server`, `nemo_gym.config_types` and `nemo_gym.openai_utils`:

- the verify contract: `BaseRunRequest{responses_create_params}` -> `BaseVerifyRequest{+response}` ->
  `BaseVerifyResponse{+reward, mask_sample, failure_kind, failure_reason}`; NeMo-Gym's models ignore undeclared
  fields (pydantic's default), so a folder's `/verify` answer holds exactly its response model's fields;
- `BaseSeedSessionRequest/Response`, `AggregateMetricsRequest`, `AggregateMetrics`, `ReverifyMode`;
- the server configs (`BaseServerConfig` -> `BaseRunServerConfig` -> `BaseRunServerInstanceConfig` ->
  `BaseResourcesServerConfig`, with `REVERIFY_MODE` as a class variable) and `{type, name}` references
  (`ModelServerRef`, `ResourcesServerRef`, `AgentServerRef`);
- the `NeMoGym*` Responses types: subclasses of gymfleet's wire models (`NeMoGymResponse` of
  `gymfleet.wire.Response`, `NeMoGymResponseCreateParamsNonStreaming` of `gymfleet.wire.ResponseCreateParams`: typed
  where gymfleet reads, lenient elsewhere, the token fields included) whose items validate into the `NeMoGym*` item
  classes, themselves gymfleet's item models with NeMo-Gym's defaults (`type`, `role`, `status`). So
  `NeMoGymResponseOutputMessage(id=..., content=[...])` builds as under NeMo-Gym, equals the item a dict validates
  into (pydantic compares classes), and is what gymfleet expects wherever it reads an output message. Chat
  Completions types are the `openai` package's.

Where NeMo-Gym main differs from 0.7.0 here: nothing a folder of the 0.7.0 corpus reads (main has no
`failure_kind` validator vocabulary beyond 0.7.0's).
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.responses import Response as OpenAIResponse
from openai.types.responses import ResponseOutputRefusal, ResponseOutputText
from openai.types.responses.response import IncompleteDetails
from openai.types.responses.response_reasoning_item import Summary
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from gymfleet.serving.nemo_gym_paths import CACHE_DIR, PARENT_DIR  # noqa: F401 - also importable from here
from gymfleet.wire import (
    FunctionCall,
    FunctionCallOutput,
    InputFunctionCall,
    InputMessage,
    InputReasoning,
    OutputMessage,
    Reasoning,
    Response,
    ResponseCreateParams,
    item_union,
)

# ---------------------------------------------------------------------------------------------- Responses types

_ATTEMPT_SUFFIX = re.compile(r"-a[1-9][0-9]*$")
VerificationInputT = TypeVar("VerificationInputT")

NeMoGymFunctionCallOutput = FunctionCallOutput
NeMoGymResponseFunctionCallOutput = FunctionCallOutput
OPENAI_RESPONSE_FIELDS = frozenset(OpenAIResponse.model_fields)


class NeMoGymResponseOutputText(ResponseOutputText):
    """An `output_text` content part (`type` defaults as in NeMo-Gym)."""

    type: Literal["output_text"] = "output_text"


class NeMoGymResponseOutputRefusal(ResponseOutputRefusal):
    """A `refusal` content part."""

    type: Literal["refusal"] = "refusal"


def _part_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "refusal" if kind == "refusal" else "output_text"


NeMoGymContent = Annotated[
    Annotated[NeMoGymResponseOutputText, Tag("output_text")] | Annotated[NeMoGymResponseOutputRefusal, Tag("refusal")],
    Discriminator(_part_tag),
]


class NeMoGymResponseOutputMessage(OutputMessage):
    """An assistant message item; `role`, `status` and `type` default as in NeMo-Gym."""

    content: list[NeMoGymContent]
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    type: Literal["message"] = "message"


class NeMoGymResponseFunctionToolCall(FunctionCall):
    """A tool call item (`type` defaults to `function_call`). The `openai` release gymfleet runs on declares `async_`
    (sent as `async`), which 0.7.0's pin (openai 2.44) lacks: its field name is accepted too, so a `model_dump()`
    validates back into an equal item (as folders' tests compare a verify's echo with what they sent)."""

    model_config = ConfigDict(populate_by_name=True)
    type: Literal["function_call"] = "function_call"


class NeMoGymSummary(Summary):
    """One summary part of a reasoning item."""

    type: Literal["summary_text"] = "summary_text"


class NeMoGymResponseReasoningItem(Reasoning):
    """A reasoning item (`type` defaults to `reasoning`)."""

    summary: list[NeMoGymSummary]
    type: Literal["reasoning"] = "reasoning"


class NeMoGymEasyInputMessage(InputMessage):
    """An input message `{role, content}` (`type` defaults to `message`, as NeMo-Gym writes it)."""

    type: Literal["message"] | None = "message"


class NeMoGymMessage(NeMoGymEasyInputMessage):
    """An input message item with a `status` (NeMo-Gym's `NeMoGymMessage`)."""

    status: str | None = "completed"


NeMoGymResponseOutputItem = item_union(NeMoGymResponseOutputMessage, NeMoGymResponseFunctionToolCall,
                                       NeMoGymResponseReasoningItem, prompt_message=NeMoGymEasyInputMessage)
"""A response's `output` item; as under NeMo-Gym 0.7.0, a prompt message there (a local agent's trajectory holds
them) is a `NeMoGymEasyInputMessage`, not a refused assistant message."""
NeMoGymResponseInputItem = item_union(NeMoGymEasyInputMessage, InputFunctionCall, InputReasoning)


class NeMoGymResponse(Response):
    """A Responses API response whose items validate into the `NeMoGym*` item classes (gymfleet's `Response`).

    Every other field of OpenAI's `Response` reads as under NeMo-Gym (`response.error`, `response.tools`, ...): the
    value sent, else None; an unsent field is not added to the dump, so the row's echo stays as sent. A field that
    OpenAI's `Response` types as an object reads as that object (`response.incomplete_details.reason`,
    `response.error.message`, `response.reasoning.effort`), as folders written against NeMo-Gym read it; a value
    OpenAI's type refuses reads as sent.
    """

    output: Annotated[list[NeMoGymResponseOutputItem], Field(fail_fast=True)]
    incomplete_details: IncompleteDetails | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            value = super().__getattr__(name)
        except AttributeError:
            if name in OPENAI_RESPONSE_FIELDS:
                return None
            raise
        if isinstance(value, (dict, list)) and name in OPENAI_RESPONSE_FIELDS:
            try:
                return _openai_field(name).validate_python(value)
            except ValidationError:
                return value
        return value


@cache
def _openai_field(name: str) -> TypeAdapter:
    """A validator for OpenAI's `Response.<name>` (what `NeMoGymResponse.<name>` reads as when sent as JSON)."""
    return TypeAdapter(OpenAIResponse.model_fields[name].annotation)


class NeMoGymResponseCreateParamsNonStreaming(ResponseCreateParams):
    """A Responses request whose input items validate into the `NeMoGym*` item classes (gymfleet's
    `ResponseCreateParams`)."""

    input: str | Annotated[list[NeMoGymResponseInputItem], Field(fail_fast=True)]


class NeMoGymChatCompletionCreateParamsNonStreaming(BaseModel):
    """A Chat Completions request body (a judge's): `messages` plus every parameter NeMo-Gym 0.7.0 declares, unset
    ones reading as its defaults (`params.temperature is None`; `parallel_tool_calls` True, OpenAI's), and any other
    parameter kept as given. Values are not checked against OpenAI's types here: the model server checks them.
    Sent with `ServerClient`, only the fields set are sent (`exclude_unset`), as under NeMo-Gym."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]]
    model: str | None = None
    audio: Any = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, int] | None = None
    logprobs: bool | None = None
    max_completion_tokens: int | None = None
    max_tokens: int | None = None
    metadata: dict[str, str] | None = None
    moderation: Any = None
    modalities: list[str] | None = None
    n: int | None = None
    parallel_tool_calls: bool = True
    prediction: Any = None
    presence_penalty: float | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    reasoning_effort: str | None = None
    response_format: Any = None
    seed: int | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    stop: str | list[str] | None = None
    store: bool | None = None
    stream_options: Any = None
    temperature: float | None = None
    tool_choice: Any = None
    tools: list[Any] | None = None
    top_logprobs: int | None = None
    top_p: float | None = None
    user: str | None = None
    verbosity: str | None = None
    web_search_options: Any = None
    stream: Literal[False] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


NeMoGymChatCompletion = ChatCompletion
NeMoGymChatCompletionMessage = ChatCompletionMessage
NeMoGymChoice = Choice

# ---------------------------------------------------------------------------------------------- server references


class ModelServerRef(BaseModel):
    """`{type: responses_api_models, name}`: a model server instance."""

    type: Literal["responses_api_models"]
    name: str


class ResourcesServerRef(BaseModel):
    """`{type: resources_servers, name}`: a resources server instance."""

    type: Literal["resources_servers"]
    name: str


class AgentServerRef(BaseModel):
    """`{type: responses_api_agents, name}`: an agent server instance."""

    type: Literal["responses_api_agents"]
    name: str


class Domain(StrEnum):
    """The capability a resources server evaluates (NeMo-Gym's `Domain`)."""

    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


# ---------------------------------------------------------------------------------------------- server configs


class ReverifyMode(StrEnum):
    """Whether `/verify` can be re-run on a stored rollout without its session."""

    STATELESS = "stateless"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


class NeMoGymServerConfig(BaseModel):
    """Where a server listens (NeMo-Gym's `config_types.BaseServerConfig`)."""

    host: str
    port: int
    num_workers: int | None = None


class BaseRunServerConfig(NeMoGymServerConfig):
    entrypoint: str
    domain: Domain | None = None


class BaseRunServerInstanceConfig(BaseRunServerConfig):
    name: str


class BaseResourcesServerConfig(BaseRunServerInstanceConfig):
    """Every NeMo-Gym resources server's config; folders subclass it. Unknown keys are ignored, as in NeMo-Gym."""

    expose_tools_over_mcp: bool = False
    REVERIFY_MODE: ClassVar[ReverifyMode] = ReverifyMode.UNKNOWN


# ---------------------------------------------------------------------------------------------- the verify contract


class BaseRunRequest(BaseModel):
    """A dataset row: `responses_create_params` (other fields are the subclass's to declare)."""

    model_config = ConfigDict(populate_by_name=True)
    responses_create_params: NeMoGymResponseCreateParamsNonStreaming
    capture_rollout_id: str | None = Field(default=None, alias="_ng_rollout_id", exclude=True)


class BaseVerifyRequest(BaseRunRequest):
    """A row plus the model's `response`."""

    response: NeMoGymResponse


class BaseVerifyResponse(BaseVerifyRequest):
    """The verify request echoed with its `reward` (and whether the sample is a valid measurement)."""

    reward: float
    mask_sample: bool = False
    """True when the reward is not a measurement of the model (the environment or its infrastructure failed)."""
    failure_kind: str | None = None
    failure_reason: str | None = None


class BaseMultiRewardVerifyResponse(BaseVerifyResponse):
    """A verify response with one reward per objective; `reward` is their scalar aggregate."""

    reward_components: dict[str, float]


class BaseSeedSessionRequest(BaseModel):
    """`/seed_session` body; folders subclass it with the row fields they seed from (others are ignored)."""


class BaseSeedSessionResponse(BaseModel):
    """`/seed_session` answer."""


class _Strict(BaseModel):
    """The Environment Server protocol's contracts refuse fields they do not declare."""

    model_config = ConfigDict(extra="forbid")


class EpisodeId(_Strict):
    """One attempt of a logical rollout (NeMo-Gym's Environment Server protocol)."""

    model_config = ConfigDict(frozen=True)
    rollout_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    attempt: int = Field(default=0, ge=0)

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, rollout_id: str) -> str:
        # `capture_key` appends `-a<N>` for retries; an id already ending so could collide with another's retry.
        if _ATTEMPT_SUFFIX.search(rollout_id):
            raise ValueError("rollout_id must not end with '-a<N>' (reserved for attempt capture keys)")
        return rollout_id

    @property
    def capture_key(self) -> str:
        """The key model captures are filed under: the rollout id, with `-a<attempt>` for a retry."""
        return f"{self.rollout_id}-a{self.attempt}" if self.attempt else self.rollout_id


class TaskId(_Strict):
    """One task of a run's taskset."""

    model_config = ConfigDict(frozen=True)
    taskset: str = Field(min_length=1)
    task_id: str = Field(min_length=1)


class ResourcesSeedSessionRequest(_Strict):
    """An Environment Server's `/seed_session`: state under a caller-chosen id (seeding twice returns it again)."""

    resources_session_id: str = Field(min_length=1)
    episode_id: EpisodeId
    task_id: TaskId
    task_data: dict[str, Any]


class MCPServerMetadata(BaseModel):
    """Where a server's MCP tools are, and the rollout's token header (`/seed_session`'s `mcp` block)."""

    server_name: str
    url_path: str = "/mcp"
    transport: str = "http"
    headers: dict[str, str]


class DirectSandboxConnection(_Strict):
    """Reconnect to a sandbox through the named top-level provider configuration and the provider's descriptor."""

    kind: Literal["direct"] = "direct"
    provider_config_ref: str
    descriptor: dict[str, JsonValue]


class SandboxAccess(_Strict):
    """A sandbox its owner (a resources server) lends to the agent: how to reach it and where to work."""

    connection: DirectSandboxConnection
    workdir: str


class ResourcesSeedSessionResponse(_Strict):
    """The seeded session's id (and, for servers that give them, tool and sandbox access)."""

    resources_session_id: str
    resources_tools: MCPServerMetadata | None = None
    sandbox_access: SandboxAccess | None = None


class ResourcesVerifyRequest(_Strict, Generic[VerificationInputT]):
    """An Environment Server's `/verify`: the episode's ids and its typed output."""

    episode_id: EpisodeId
    task_id: TaskId
    verification_input: VerificationInputT


class ResourcesCloseSessionRequest(_Strict):
    """`/close_session`: release the state seeded under `resources_session_id`."""

    resources_session_id: str
    episode_id: EpisodeId


class ResourcesCloseSessionResponse(_Strict):
    """`/close_session` answer."""

    resources_session_id: str


class AggregateMetricsRequest(BaseModel):
    """`/aggregate_metrics` body: stripped verify responses (at least `_ng_task_index` and `reward`)."""

    verify_responses: list[dict[str, Any]]


class AggregateMetrics(BaseModel):
    """`/aggregate_metrics` answer: flat string keys, ready for a metrics logger."""

    group_level_metrics: list[dict[str, Any]] = Field(default_factory=list)
    agent_metrics: dict[str, Any] = Field(default_factory=dict)
    key_metrics: dict[str, Any] = Field(default_factory=dict)
    repeat_level_metrics: list[dict[str, Any]] = Field(default_factory=list)


# ---------------------------------------------------------------------------------------------- global config keys

TASK_INDEX_KEY_NAME = "_ng_task_index"
TASK_SOURCE_KEY_NAME = "task_source"
SKILLS_REF_KEY_NAME = "skills_ref"
ROLLOUT_INDEX_KEY_NAME = "_ng_rollout_index"
ATTEMPT_INDEX_KEY_NAME = "_ng_attempt_index"
AGENT_REF_KEY_NAME = "agent_ref"
CACHE_DIR_KEY_NAME = "cache_dir"


