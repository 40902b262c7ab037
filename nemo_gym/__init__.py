"""NeMo-Gym's import names over gymfleet, for callers that import Gym as a library (NeMo-RL) and environment folders.

This package holds no code of its own: each module re-exports gymfleet's implementation under the name NeMo-Gym
gives it (`nemo_gym.cli.RunHelper`, `nemo_gym.rollout_collection.RolloutCollectionHelper`,
`nemo_gym.server_utils.HEAD_SERVER_KEY_NAME` / `BaseServerConfig`, `nemo_gym.PARENT_DIR` / `CACHE_DIR` /
`_resolve_under_cwd_or_install`, ...), and
nothing else.
"""

from gymfleet.serving.nemo_gym_paths import CACHE_DIR, PARENT_DIR
from gymfleet.serving.nemo_gym_paths import resolve_under_cwd_or_install as _resolve_under_cwd_or_install

__all__ = ["CACHE_DIR", "PARENT_DIR", "_resolve_under_cwd_or_install"]
