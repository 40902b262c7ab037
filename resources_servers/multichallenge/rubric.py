r"""Rubric grading by an LLM judge, shared by multichallenge and inverse_if (a candidate for `gymfleet/`).

One judge call per rubric item, all in parallel (bounded by the judge client's concurrency cap), then one number
for the row. What the two environments share lives here:

- `final_message_text` / `clean_response`: the text graded is the last assistant message, with `<think>` and
  `<thinking>` reasoning removed (`gymfleet.grading.think.strip_think`'s rules, for both tag names).
- `delimit` and `injection_reasons`: the answer reaches the judge only between `<model_response>` tags; an answer
  that writes a verdict label, a JSON verdict, a grader-aimed override or the delimiter itself is flagged
  (`gymfleet.grading.judge.injection_signals`) and scored 0 without asking the judge.
- `aggregate`: NeMo-Gym's `aggregation_mode`s (mean, min, max, all, any, weighted); no items score 0.
- `RubricJudgeServer`: the judge client, the start-up check, the early zeros and the fan-out; an environment
  supplies the row's items and its verdict rule.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from gymfleet.grading.judge import JudgeReply
from gymfleet.grading.judge_gate import JudgeGate
from gymfleet.grading.judge_input import judge_text
from gymfleet.grading.judge_verdict import ruling_text
from gymfleet.serving.judged import JudgedConfig, JudgedServer
from gymfleet.serving.resources import VerifyResponse
from gymfleet.wire import Response

log = logging.getLogger(__name__)

T = TypeVar("T")
Aggregation = Literal["mean", "min", "max", "all", "any", "weighted"]
RESPONSE_OPEN, RESPONSE_CLOSE = "<model_response>", "</model_response>"


def final_message_text(response: Response) -> str:
    """The text parts of the last assistant message item, joined by newlines ("" when there is none).

    Earlier messages of a multi-step episode and reasoning items are not read: the last message is the reply.
    """
    for item in reversed(response.output):
        if item.type == "message" and getattr(item, "role", "assistant") == "assistant":
            return "\n".join(part.text for part in item.content if getattr(part, "type", None) == "output_text")
    return ""


def clean_response(text: str) -> str:
    r"""The visible reply, normalised, as a judge is shown it (`gymfleet.grading.judge_input.judge_text`).

    A complete `<think>`/`<thinking>` block goes; text up to an unpaired closing tag (its opening tag was in the
    prompt) goes; a block that never closes goes with everything after it only when nothing visible came before.

    Examples:
        >>> clean_response("<thinking>They said pescatarian.</thinking>\nTry the sushi.")
        'Try the sushi.'
        >>> clean_response("the user is Alex...</think>Hi Alex!")
        'Hi Alex!'
    """
    return judge_text(text)


def delimit(text: str) -> str:
    """The answer as it is placed in a judge prompt: in a block delimited by a fresh nonce
    (`gymfleet.grading.judge_input.quote`)."""
    return JudgeGate.quote(text)


def injection_reasons(text: str, labels: Sequence[str]) -> list[str]:
    """`gymfleet.grading.judge_input.screen` with the judge's labels and this prompt's old `<model_response>` tags."""
    return JudgeGate.prepare(text, labels, (RESPONSE_OPEN, RESPONSE_CLOSE)).reasons


def aggregate(scores: Sequence[float], weights: Sequence[float], mode: Aggregation) -> float:
    """One reward from per-item scores in [0, 1]; no items score 0.0.

    `all`/`any` count an item as passed at 1.0; `weighted` is the weight-averaged score (0.0 when the weights sum
    to 0); the other modes ignore weights.

    Examples:
        >>> aggregate([1.0, 0.0, 1.0], [1, 1, 1], "mean")
        0.6666666666666666
        >>> aggregate([1.0, 0.0], [3, 1], "weighted")
        0.75
        >>> aggregate([], [], "mean")
        0.0
    """
    if not scores:
        return 0.0
    if mode == "mean":
        return sum(scores) / len(scores)
    if mode == "min":
        return float(min(scores))
    if mode == "max":
        return float(max(scores))
    if mode == "all":
        return float(all(score >= 1.0 for score in scores))
    if mode == "any":
        return float(any(score >= 1.0 for score in scores))
    total = sum(weights)
    return sum(score * weight for score, weight in zip(scores, weights, strict=True)) / total if total > 0 else 0.0


async def run_all(calls: Sequence[Callable[[], Awaitable[T]]], *, parallel: bool = True) -> list[T]:
    """Run every call (in parallel, or one after another) and return their results in order.

    The first failure cancels the calls still running and is raised as itself (not an `ExceptionGroup`), so a
    `JudgeError` on one item reaches the resources server's failure boundary and fails the whole row.
    """
    if not parallel:
        return [await call() for call in calls]
    tasks = [asyncio.ensure_future(call()) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def metadata_rubric(item_model: type[BaseModel], rubric: list[Any] | None,
                    metadata: dict[str, Any] | None) -> list[Any] | None:
    """`rubric`, or (when it is empty) the row's `metadata.rubric` read as `item_model` items (dataset-style rows)."""
    if rubric or not (metadata and metadata.get("rubric")):
        return rubric
    try:
        return [item_model.model_validate(item) for item in metadata["rubric"]]
    except (ValidationError, TypeError) as exc:
        raise ValueError(f"metadata.rubric: {exc}") from exc


def has_placeholders(template: str, *names: str) -> list[str]:
    """The `{name}` placeholders of `names` that `template` lacks."""
    return [name for name in names if "{" + name + "}" not in template]


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    """One rubric item's judge call: the prompt, what identifies it, and what its evaluation records."""

    prompt: str
    system: str | None
    prompt_version: str
    weight: float = 1.0
    record: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ItemVerdict:
    """A judge reply read by the environment's rule: the verdict, where it was found, and the item's score."""

    verdict: str
    source: str
    score: float


class RubricJudgeConfig(JudgedConfig):
    """Fields both rubric environments share (their module docstrings explain each)."""

    judge_max_concurrency: int = Field(default=64, ge=1)
    """Judge calls in flight at once from this server process (all rows and items together)."""
    aggregation_mode: Aggregation = "mean"
    """How item scores become the reward: mean, min, max, all, any or weighted (NeMo-Gym's key)."""
    parallel_evaluation: bool = True
    """Judge a row's items at once (true) or one after another (NeMo-Gym's key)."""
    max_response_chars: int = Field(default=60_000, ge=1)
    """A cleaned reply longer than this scores 0 (`response_too_long`) without asking the judge."""


class RubricJudgeResponse(VerifyResponse):
    """Fields both rubric environments add to the row."""

    generated_response: str
    rubric_evaluations: list[dict[str, Any]]
    aggregation_mode: str
    num_passed: int
    num_total: int
    reason: str | None = None
    judge_injection: list[str] | None = None
    judge_provenance: list[dict[str, Any]] | None = None


class RubricJudgeServer(JudgedServer):
    """Grades a reply against rubric items, one judge call per item; subclasses give the items and the rule."""

    config: RubricJudgeConfig
    labels: ClassVar[tuple[str, ...]] = ()
    """Verdict labels of the judge prompts, looked for in the answer (`injection_reasons`)."""

    def read_verdict(self, item: JudgeItem, text: str) -> ItemVerdict:
        raise NotImplementedError

    async def grade(self, text: str, items: Sequence[JudgeItem]) -> dict[str, Any]:
        """The response fields (`reward` included) for the cleaned reply `text` judged on `items`."""
        fields: dict[str, Any] = {"generated_response": text, "aggregation_mode": self.config.aggregation_mode,
                                  "num_total": len(items), "num_passed": 0, "rubric_evaluations": [],
                                  "reward": 0.0, "reason": None, "judge_injection": None, "judge_provenance": None}
        if not items:
            return {**fields, "reason": "empty_rubric"}
        if not text.strip():
            return {**fields, "reason": "empty_response"}
        if len(text) > self.config.max_response_chars:
            return {**fields, "reason": "response_too_long",
                    "generated_response": text[: self.config.max_response_chars]}
        reasons = injection_reasons(text, self.labels)
        if reasons:
            log.info("judge injection in a reply, scored 0 unjudged: %s", reasons)
            return {**fields, "reason": "judge_injection", "judge_injection": reasons}
        replies = await run_all([_ask(self.gate, item) for item in items], parallel=self.config.parallel_evaluation)
        evaluations, scores, provenance = [], [], []
        for item, reply in zip(items, replies, strict=True):
            provenance.append(reply.provenance(item.prompt_version))
            judged = self.read_verdict(item, ruling_text(reply.text, text))
            scores.append(judged.score)
            evaluations.append({**item.record, "weight": item.weight, "verdict": judged.verdict,
                                "verdict_source": judged.source, "score": judged.score,
                                "judge_prompt": item.prompt, "judge_response": reply.text})
        reward = aggregate(scores, [item.weight for item in items], self.config.aggregation_mode)
        return {**fields, "reward": reward, "rubric_evaluations": evaluations,
                "num_passed": sum(score >= 1.0 for score in scores), "judge_provenance": provenance}


def _ask(gate: JudgeGate, item: JudgeItem) -> Callable[[], Awaitable[JudgeReply]]:
    messages = ([{"role": "system", "content": item.system}] if item.system else []) + [
        {"role": "user", "content": item.prompt}]
    return lambda: gate.judge.call(messages, **gate.params)


def distinct_labels(labels: Sequence[str]) -> None:
    """Raise ValueError unless the labels are non-empty and distinct ignoring case."""
    folded = [label.casefold() for label in labels]
    if "" in folded or len(set(folded)) != len(folded):
        raise ValueError(f"verdict labels must be distinct and non-empty (ignoring case), got {list(labels)}")


def config_check(template: str | None, *names: str, field: str) -> None:
    """Raise ValueError when a configured template lacks a placeholder the judge needs."""
    if template is not None:
        missing = has_placeholders(template, *names)
        if missing:
            raise ValueError(f"{field} lacks the placeholder(s) {['{' + name + '}' for name in missing]}")


__all__ = [
    "Aggregation",
    "ItemVerdict",
    "JudgeItem",
    "RESPONSE_CLOSE",
    "RESPONSE_OPEN",
    "RubricJudgeConfig",
    "RubricJudgeResponse",
    "RubricJudgeServer",
    "aggregate",
    "clean_response",
    "config_check",
    "delimit",
    "distinct_labels",
    "final_message_text",
    "has_placeholders",
    "injection_reasons",
    "run_all",
]
