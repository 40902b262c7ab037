"""NeMo-Gym's import names over gymfleet, for callers that import Gym as a library (NeMo-RL).

This package holds no code of its own: each module re-exports gymfleet's implementation under the name NeMo-Gym
gives it (`nemo_gym.cli.RunHelper`, `nemo_gym.rollout_collection.RolloutCollectionHelper`,
`nemo_gym.server_utils.HEAD_SERVER_KEY_NAME` / `BaseServerConfig`, ...), and nothing else.
"""
