"""NeMo-Gym's `nemo_gym.base_environment_server` (an Environment Server's episode lifecycle), re-exported from
gymfleet (`gymfleet.serving.nemo_gym_environment`; no code of its own)."""

from gymfleet.serving.nemo_gym_environment import (
    BaseEnvironmentServer,
    BaseEnvironmentServerConfig,
    CleanupCallback,
    CleanupContext,
    CleanupHandle,
    EpisodeRequestT,
    EpisodeResponseT,
    HandledEpisodeError,
)

__all__ = [
    "BaseEnvironmentServer", "BaseEnvironmentServerConfig", "CleanupCallback", "CleanupContext", "CleanupHandle",
    "EpisodeRequestT", "EpisodeResponseT", "HandledEpisodeError",
]
