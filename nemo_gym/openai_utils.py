"""NeMo-Gym's `nemo_gym.openai_utils` Responses and Chat Completions types, re-exported from gymfleet
(`gymfleet.serving.nemo_gym_types`, `gymfleet.serving.nemo_gym_training`; no code of its own)."""

from gymfleet.serving import nemo_gym_training
from gymfleet.serving.nemo_gym_client import MAX_NUM_TRIES, RATE_LIMIT_ERROR_CODES, RETRY_ERROR_CODES
from gymfleet.serving.nemo_gym_openai import (
    NeMoGymAsyncOpenAI,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
    PermanentEndpointError,
    accumulate_response_usage,
)
from gymfleet.serving.nemo_gym_training import *  # noqa: F403  (nemo_gym_training.__all__: the ForTraining variants)
from gymfleet.serving.nemo_gym_types import (
    NeMoGymChatCompletion,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymChatCompletionMessage,
    NeMoGymChoice,
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymMessage,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionCallOutput,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputItem,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputRefusal,
    NeMoGymResponseOutputText,
    NeMoGymResponseReasoningItem,
    NeMoGymSummary,
)

__all__ = [
    "RATE_LIMIT_ERROR_CODES", "RETRY_ERROR_CODES", "NeMoGymAsyncOpenAI", "PermanentEndpointError",
    "NeMoGymChatCompletion", "NeMoGymChatCompletionCreateParamsNonStreaming", "NeMoGymChatCompletionMessage",
    "NeMoGymChoice", "NeMoGymEasyInputMessage", "NeMoGymFunctionCallOutput", "NeMoGymMessage", "NeMoGymResponse",
    "NeMoGymResponseCreateParamsNonStreaming", "NeMoGymResponseFunctionCallOutput",
    "NeMoGymResponseFunctionToolCall", "NeMoGymResponseOutputItem", "NeMoGymResponseOutputMessage",
    "NeMoGymResponseOutputRefusal", "NeMoGymResponseOutputText", "NeMoGymResponseReasoningItem", "NeMoGymSummary",
    "NeMoGymResponseInputTokensDetails", "NeMoGymResponseOutputTokensDetails", "NeMoGymResponseUsage",
    "accumulate_response_usage", "MAX_NUM_TRIES", *nemo_gym_training.__all__,
]
