"""reasoning_gym: procedurally generated reasoning tasks (100+), each graded by reasoning-gym's own scorer.

Rows come from `reasoning_gym.create_dataset(task, ...)` entries, wrapped in NeMo-Gym's row format.

## Task fields
- `question`: the task text (the prompt itself lives in `responses_create_params`).
- `answer` (nullable): the gold answer; some tasks grade from `metadata` alone.
- `metadata`: the entry's metadata; `metadata.source_dataset` names the reasoning-gym task (e.g. `knights_knaves`)
  and must be a registered task (a row naming an unknown one is a 422 that suggests the closest name).
- Any other field is echoed untouched.

## Reward
The task scorer's score of the extracted answer: usually 1.0 or 0.0, but task-defined and possibly partial (e.g.
`countdown` gives 0.01 for a well-formed wrong expression). The text read is the response's `output_text` (all
assistant message text, reasoning excluded). The answer is the last `<answer>...</answer>` pair, else the first
`\\boxed{...}` without nested braces, else the whole text, stripped (see `scoring.py`). It is scored with
`reasoning_gym.get_score_answer_fn(task)(answer=..., entry={question, answer, metadata})`; a scorer that raises
gives 0.0. An empty answer is scored like any other, as NeMo-Gym does (most scorers give it 0.0; `countdown` grants
it its 0.01 format credit, as it does any unreadable answer). An answer longer than the cap (below) scores 0.0
without calling the scorer. The response adds `task_name`, `score` (= reward) and `extracted_answer`.

## Config
- `max_answer_chars` (default 10000): answers longer than this, and longer than twice the gold answer, score 0.0
  unscored. Scorers are CPU-bound Python (some parse with sympy) and cannot be interrupted once started, so the cap
  is what bounds their cost; they run in a worker thread (`asyncio.to_thread`) so the event loop stays free, and a
  scorer that still outlives `verify_timeout_s` turns the row into a `verify_timeout` failure.

## Tools
None.

## Version history
- v1: NeMo-Gym's extraction order and scoring through reasoning-gym's per-task scorers (the empty answer included).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import field_validator

from gymfleet.errors import did_you_mean
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.reasoning_gym.scoring import extract_answer, load, score, tasks


class ReasoningGymConfig(ResourcesServerConfig):
    """reasoning_gym's fields."""

    max_answer_chars: int = 10_000
    """Longer answers (unless the gold answer is over half this long) score 0 unscored: scorers cannot be stopped."""


class ReasoningGymRequest(VerifyRequest):
    """A row to grade."""

    question: str
    answer: str | None
    metadata: dict[str, Any]

    @field_validator("metadata")
    @classmethod
    def _names_a_task(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        task = metadata.get("source_dataset")
        if task not in tasks():
            hint = did_you_mean(task, tasks()) if isinstance(task, str) else ""
            raise ValueError(f"metadata.source_dataset must name a reasoning-gym task, got {task!r}.{hint}")
        return metadata


class ReasoningGymResponse(VerifyResponse):
    """The graded row."""

    task_name: str
    score: float
    extracted_answer: str | None = None


class ReasoningGymServer(ResourcesServer):
    """Grades answers with reasoning-gym's task scorers."""

    config: ReasoningGymConfig
    reverify_mode = "stateless"
    reward_libraries = ("reasoning-gym", "sympy")

    @classmethod
    def preload(cls) -> None:
        tasks()  # the cached task names (the first start on a machine imports reasoning-gym here instead)

    def warm_up(self) -> None:
        load()  # reasoning-gym's import, once the server is up; `/verify` waits for it

    async def verify(self, body: ReasoningGymRequest) -> ReasoningGymResponse:
        task = body.metadata["source_dataset"]
        answer = extract_answer(body.response.output_text)
        cap = max(self.config.max_answer_chars, 2 * len(body.answer or ""))
        reward = 0.0
        if len(answer) <= cap:
            entry = {"question": body.question, "answer": body.answer, "metadata": body.metadata}
            reward = await asyncio.to_thread(score, task, answer, entry)
        return ReasoningGymResponse.echo(body, reward=reward, task_name=task, score=reward, extracted_answer=answer)
