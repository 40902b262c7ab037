"""NeMo-Gym's `nemo_gym.responses_converter` (Responses ⇄ Chat Completions), re-exported from gymfleet
(`gymfleet.serving.nemo_gym_converter`; no code of its own)."""

from gymfleet.serving.nemo_gym_converter import ResponsesConverter, split_responses_input_output_items

__all__ = ["ResponsesConverter", "split_responses_input_output_items"]
