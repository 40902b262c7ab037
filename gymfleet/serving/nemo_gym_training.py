"""NeMo-Gym 0.7.0's training variants of its Responses items (`nemo_gym.openai_utils`' `*ForTraining` classes), so
the modules that build training rows import: NeMo-Gym's own agents do (harbor_agent's utils, which
legal_agent_bench's tests import), and so may a folder of one's own.

A `*ForTraining` item is its `NeMoGym*` item with the token fields required: `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs` (all three), and `routed_experts` (optional: per-token expert
indices as nested lists, or the training framework's opaque string). `RESPONSES_TO_TRAIN` maps each item class to
its variant and `training_variant_of` looks one up, naming the class when it has none, as 0.7.0's do.

Where this differs from 0.7.0: gymfleet's own item classes already carry the token fields (optional, all or none:
`gymfleet.wire.TokenFields`), so a response whose output items carry token IDs validates into the plain `NeMoGym*`
classes here, not into these variants; the fields and their values are the same either way.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from pydantic import BaseModel

from gymfleet.serving.nemo_gym_types import (
    NeMoGymEasyInputMessage,
    NeMoGymMessage,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseReasoningItem,
)

__all__ = [
    "REQUIRED_TOKEN_METADATA_FIELDS", "RESPONSES_TO_TRAIN", "TOKEN_METADATA_FIELDS",
    "NeMoGymEasyInputMessageForTraining", "NeMoGymMessageForTraining", "NeMoGymResponseFunctionToolCallForTraining",
    "NeMoGymResponseOutputMessageForTraining", "NeMoGymResponseReasoningItemForTraining", "RoutedExperts",
    "TokenIDLogProbMixin", "TokenIDLogProbTypedDictMixin", "training_variant_of",
]

RoutedExperts = str | list[list[list[int]]]
"""Per-token routed expert indices `[tokens, moe layers, top-k]`, or the training framework's string envelope."""

REQUIRED_TOKEN_METADATA_FIELDS = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})
TOKEN_METADATA_FIELDS = REQUIRED_TOKEN_METADATA_FIELDS | {"routed_experts"}


class TokenIDLogProbMixin(BaseModel):
    """The token fields a training row's item must carry."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: RoutedExperts | None = None


# The mixin comes first in each variant's bases (0.7.0 lists it second): gymfleet's items declare the same fields as
# optional, and pydantic takes a field from the first base that declares it.


class TokenIDLogProbTypedDictMixin(TypedDict):
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: NotRequired[RoutedExperts]


class NeMoGymEasyInputMessageForTraining(TokenIDLogProbMixin, NeMoGymEasyInputMessage):
    pass


class NeMoGymMessageForTraining(TokenIDLogProbMixin, NeMoGymMessage):
    pass


class NeMoGymResponseOutputMessageForTraining(TokenIDLogProbMixin, NeMoGymResponseOutputMessage):
    pass


class NeMoGymResponseFunctionToolCallForTraining(TokenIDLogProbMixin, NeMoGymResponseFunctionToolCall):
    pass


class NeMoGymResponseReasoningItemForTraining(TokenIDLogProbMixin, NeMoGymResponseReasoningItem):
    pass


RESPONSES_TO_TRAIN: dict[type[BaseModel], type[BaseModel]] = {
    NeMoGymEasyInputMessage: NeMoGymEasyInputMessageForTraining,
    NeMoGymMessage: NeMoGymMessageForTraining,
    NeMoGymResponseOutputMessage: NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseFunctionToolCall: NeMoGymResponseFunctionToolCallForTraining,
    NeMoGymResponseReasoningItem: NeMoGymResponseReasoningItemForTraining,
}


def training_variant_of(item_cls: type) -> type:
    """The `*ForTraining` class of `item_cls`.

    Raises:
        NotImplementedError: `item_cls` has none (a hosted tool call, say): its name and what to do.
    """
    try:
        return RESPONSES_TO_TRAIN[item_cls]
    except KeyError:
        raise NotImplementedError(
            f"{item_cls.__name__} has no ForTraining variant, so token IDs and log-probs cannot be attached to it: "
            "register one in RESPONSES_TO_TRAIN if the policy samples this item's tokens, or attach none") from None
