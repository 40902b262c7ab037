"""NeMo-Gym's `nemo_gym.deliverables` (which of an agent's files are its output), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_records`; no code of its own)."""

from gymfleet.serving.nemo_gym_records import IGNORE_FILES, is_deliverable

__all__ = ["IGNORE_FILES", "is_deliverable"]
