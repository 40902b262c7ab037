"""NeMo-Gym's `nemo_gym.rollout_observability` (an agent harness's typed observations of a rollout), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_observability`; no code of its own)."""

from gymfleet.serving.nemo_gym_observability import (
    AgentEpisode,
    AgentInvocation,
    AgentObservationBundle,
    AgentObservationRecord,
    ContextCompactionObservation,
    ModelCallRef,
    ObservationGap,
    ObservationModel,
    SandboxObservation,
    ToolCallObservation,
    TrajectoryModelCall,
    TrajectoryRecord,
    TrajectoryResponseMetadata,
    TrajectoryTokenStats,
    TrajectoryToolCall,
    TrajectoryTurn,
)

__all__ = [
    "AgentEpisode", "AgentInvocation", "AgentObservationBundle", "AgentObservationRecord",
    "ContextCompactionObservation", "ModelCallRef", "ObservationGap", "ObservationModel", "SandboxObservation",
    "ToolCallObservation", "TrajectoryModelCall", "TrajectoryRecord", "TrajectoryResponseMetadata",
    "TrajectoryTokenStats", "TrajectoryToolCall", "TrajectoryTurn",
]
