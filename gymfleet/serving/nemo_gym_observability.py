"""NeMo-Gym 0.7.0's `nemo_gym.rollout_observability`: the typed records an agent harness reports about one rollout.

An `AgentObservationBundle{source, records, gaps}` holds, in no particular order, records discriminated by `kind`:
`AgentInvocation` (one root agent or subagent conversation: status, duration, its model calls as `ModelCallRef`s,
its conversation items), `ToolCallObservation` (one tool call's timing and status), `ContextCompactionObservation`
(a context compaction: trigger, tokens before and after, the model calls around it) and `SandboxObservation` (a
sandbox's outcome and measured lifetime usage); `ObservationGap`s name what the harness could not observe. A bundle's
invocation ids are unique and their parent links form no cycle (a missing parent is allowed: a harness may see only
part of the tree). `TrajectoryRecord` is one rollout's trajectory (invocations, turns, model calls, tool calls) with
unique invocation and model-call ids and turns that belong to it. All records refuse unknown fields and re-validate
on assignment. NeMo-Gym's `join_model_call_observations` (matching a bundle against its model server's captured calls)
is not here: gymfleet's model servers keep no per-rollout capture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymfleet.serving.nemo_gym_types import ModelServerRef, NeMoGymResponse, NeMoGymResponseInputItem

__all__ = [
    "AgentEpisode", "AgentInvocation", "AgentObservationBundle", "AgentObservationRecord",
    "ContextCompactionObservation", "ModelCallRef", "ObservationGap", "ObservationModel", "SandboxObservation",
    "ToolCallObservation", "TrajectoryModelCall", "TrajectoryRecord", "TrajectoryResponseMetadata",
    "TrajectoryTokenStats", "TrajectoryToolCall", "TrajectoryTurn",
]

_NonNegative = Annotated[float | None, Field(default=None, ge=0)]
_Count = Annotated[int | None, Field(default=None, ge=0)]


class ObservationModel(BaseModel):
    """Every observation record: strict (unknown fields refused) and re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelCallRef(ObservationModel):
    """How a harness names one model call: its `model_call_id`, or its model server and `response_id`."""

    model_call_id: str | None = None
    model_ref: ModelServerRef | None = None
    response_id: str | None = None

    @model_validator(mode="after")
    def _joinable(self) -> ModelCallRef:
        if not self.model_call_id and (self.model_ref is None or not self.response_id):
            raise ValueError("model_call_id or both model_ref and response_id are required")
        return self


class TrajectoryTokenStats(ObservationModel):
    prompt_tokens: _Count = None
    completion_tokens: _Count = None
    reasoning_tokens: _Count = None
    total_tokens: _Count = None
    cached_tokens: _Count = None


class TrajectoryResponseMetadata(ObservationModel):
    response_id: str | None = None
    model_ref: ModelServerRef | None = None
    model: str | None = None
    dialect: str | None = None
    status_code: int | None = None
    response_status: str | None = None
    finish_reason: str | None = None
    upstream_attempted: bool | None = None
    response_source: Literal["upstream", "local"] | None = None
    upstream_status_code: int | None = None
    local_response_reason: str | None = None
    error_category: str | None = None
    latency_ttft_ms: _NonNegative = None


class TrajectoryModelCall(ObservationModel):
    model_call_id: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: _NonNegative = None
    request: Any | None = None
    response: Any | None = None
    response_metadata: TrajectoryResponseMetadata = Field(default_factory=TrajectoryResponseMetadata)
    token_stats: TrajectoryTokenStats = Field(default_factory=TrajectoryTokenStats)


class TrajectoryTurn(ObservationModel):
    invocation_id: str
    task_id: str
    rollout_id: str
    turn_no: int = Field(ge=1, description="Turn number within this invocation.")
    timestamp: float
    question: Any | None = None
    answer: Any | None = None
    reasoning_content: Any | None = None
    resolved: bool | None = None
    step_count: int = Field(ge=0, description="Producer-reported cumulative step count within this invocation.")
    model_calls: list[ModelCallRef] = []


class AgentInvocation(ObservationModel):
    """One root agent or subagent conversation a harness observed."""

    kind: Literal["agent_invocation"] = "agent_invocation"
    invocation_id: str
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: Literal["completed", "failed", "incomplete", "unknown"] = "unknown"
    duration_ms: _NonNegative = None
    error_type: str | None = None
    model_calls: list[ModelCallRef] = []
    conversation: list[NeMoGymResponseInputItem] = []


class ToolCallObservation(ObservationModel):
    """One tool call's timing, seen where the agent runs it."""

    kind: Literal["tool_call"] = "tool_call"
    invocation_id: str
    tool_call_id: str
    sandbox_id: str | None = Field(default=None, description="The sandbox the call ran in (shared by concurrent "
                                   "calls: not a per-call resource attribution).")
    tool_name: str | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: _NonNegative = None
    timing_source: Literal["executor", "artifact", "harness"] | None = None
    status: Literal["completed", "failed", "timeout", "cancelled", "incomplete", "unknown"] = "unknown"
    error_type: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> ToolCallObservation:
        if self.started_at is not None and self.completed_at is not None and self.completed_at < self.started_at:
            raise ValueError("completed_at must not precede started_at")
        return self


class TrajectoryToolCall(ToolCallObservation):
    """A tool call in a trajectory, with the output the model saw."""

    output: Any | None = None


class SandboxObservation(ObservationModel):
    """A sandbox's outcome and its measured lifetime usage, reported by whoever owned it."""

    kind: Literal["sandbox"] = "sandbox"
    role: Literal["agent", "verifier", "environment"]
    provider: str | None = None
    sandbox_id: str | None = None
    outcome: Literal["completed", "failed", "timeout", "oom", "sandbox_error", "cancelled", "unknown"] = "unknown"
    exit_code: int | None = None
    wall_time_s: _NonNegative = None
    cpu_time_s: float | None = Field(default=None, ge=0, description="Measured cumulative CPU time, not a quota.")
    peak_memory_mib: float | None = Field(default=None, ge=0, description="Measured high-water mark, not the limit.")
    resource_usage_source: str | None = None
    error_type: str | None = None


class ContextCompactionObservation(ObservationModel):
    """A context compaction the harness reported."""

    kind: Literal["context_compaction"] = "context_compaction"
    invocation_id: str
    observed_at: float | None = None
    trigger: str | None = None
    tokens_before: _Count = None
    tokens_after: _Count = None
    outcome: Literal["completed", "failed", "aborted", "unknown"] = "unknown"
    summary: str | None = None
    first_kept_item_id: str | None = None
    before_model_call: ModelCallRef | None = None
    model_calls: list[ModelCallRef] = []
    after_model_call: ModelCallRef | None = None


class ObservationGap(ObservationModel):
    """Something the harness could not observe or join exactly (`code`, and where and what)."""

    code: str
    invocation_id: str | None = None
    detail: str | None = None


AgentObservationRecord = Annotated[
    AgentInvocation | ToolCallObservation | ContextCompactionObservation | SandboxObservation,
    Field(discriminator="kind"),
]


def _acyclic(parents: dict[str, str | None]) -> bool:
    settled: set[str] = set()
    for start in parents:
        path: set[str] = set()
        node: str | None = start
        while node in parents and node not in settled:
            if node in path:
                return False
            path.add(node)
            node = parents[node]
        settled |= path
    return True


class AgentObservationBundle(ObservationModel):
    """What one agent server observed about one rollout (module docstring)."""

    source: str
    records: list[AgentObservationRecord] = Field(default_factory=list,
                                                  description="Unordered: position is not execution order.")
    gaps: list[ObservationGap] = []

    @model_validator(mode="after")
    def _invocation_tree(self) -> AgentObservationBundle:
        invocations = [record for record in self.records if isinstance(record, AgentInvocation)]
        parents = {record.invocation_id: record.parent_invocation_id for record in invocations}
        if len(parents) != len(invocations):
            raise ValueError("invocation_id must be unique within an observation bundle")
        if not _acyclic(parents):
            raise ValueError("parent_invocation_id must not form a cycle")
        return self


class TrajectoryRecord(ObservationModel):
    """One rollout's trajectory."""

    schema_version: Literal["1.0"] = "1.0"
    task_id: str
    rollout_id: str
    invocations: list[AgentInvocation] = []
    turns: list[TrajectoryTurn] = []
    model_calls: list[TrajectoryModelCall] = []
    tool_calls: list[TrajectoryToolCall] = []
    gaps: list[ObservationGap] = []

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryRecord:
        invocation_ids = [invocation.invocation_id for invocation in self.invocations]
        if len(set(invocation_ids)) != len(invocation_ids):
            raise ValueError("invocation_id must be unique within a trajectory")
        call_ids = [call.model_call_id for call in self.model_calls if call.model_call_id]
        if len(set(call_ids)) != len(call_ids):
            raise ValueError("model_call_id must be unique within a trajectory")
        if any((turn.task_id, turn.rollout_id) != (self.task_id, self.rollout_id) for turn in self.turns):
            raise ValueError("turn identity must match the trajectory")
        numbers = [(turn.invocation_id, turn.turn_no) for turn in self.turns]
        if len(set(numbers)) != len(numbers):
            raise ValueError("turn number must be unique within an invocation")
        return self


@dataclass(frozen=True, slots=True)
class AgentEpisode:
    """An agent's response and what was observed while it ran."""

    response: NeMoGymResponse
    observations: AgentObservationBundle
