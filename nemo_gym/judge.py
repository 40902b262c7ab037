"""NeMo-Gym's `nemo_gym.judge`: judge calls whose failures are `JudgeError` (a `judge_failed` row, never a reward),
re-exported from gymfleet (no code of its own)."""

from gymfleet.errors import JudgeError
from gymfleet.serving.nemo_gym_client import call_judge, judge_failsafe, reraise_judge_errors

__all__ = ["JudgeError", "call_judge", "judge_failsafe", "reraise_judge_errors"]
