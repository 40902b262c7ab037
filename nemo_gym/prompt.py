"""NeMo-Gym's `nemo_gym.prompt`: prompt files filled from rows, re-exported from gymfleet (no code of its own)."""

from gymfleet.serving.nemo_gym_prompt import PromptConfig, apply_prompt_to_row, fill_prompt, load_prompt_config

__all__ = ["PromptConfig", "apply_prompt_to_row", "fill_prompt", "load_prompt_config"]
