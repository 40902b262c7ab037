"""NeMo-Gym's `nemo_gym.testing`: helpers for environment folders' own tests, re-exported from gymfleet."""
