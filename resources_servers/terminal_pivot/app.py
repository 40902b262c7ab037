"""terminal_pivot: the next turn of a terminal agent, graded by how closely its keystrokes match a gold turn.

Each row is one step ("pivot") of a recorded Terminus episode: the prompt holds the task and the terminal screen,
and the model answers with one JSON object giving the next batch of keystrokes, in the format of the row's harness.
One model call, no tools: the agent runs with `max_steps: 1`.

## Task fields
- `expected_answer`: the gold turn, a JSON object written as a string. It must hold a `commands` list of objects
  with a string `keystrokes` each; anything else is a 422 naming the field.
- `metadata.harness`: `terminus_1` or `terminus_2`, which fixes the reply's schema (below). `metadata` is required;
  its other keys (`category`, ...) are echoed untouched.
- `threshold` (optional, 0 to 1): a similarity below it scores 0.
- Any other field (`uuid`, `agent_ref`, ...) is echoed untouched.

## Reward
The text graded is every text part of every assistant message joined by line feeds, stripped, then cut to what
follows the last `</think>`. Checks in order; the first that fails gives reward 0 and names itself in
`failure_reason`:
1. `JSON_PARSING_FAILED`: the text is not one JSON value (prose or a code fence around it is not accepted).
2. `UNKNOWN_HARNESS`: `metadata.harness` is missing or not one of the two.
3. `SCHEMA_CHECK_FAILED`: the reply does not validate (JSON Schema) under its harness's schema.
   - `terminus_1`: exactly `state_analysis` (string), `explanation` (string), `commands`, `is_task_complete`
     (boolean); each command exactly `keystrokes` (string), `is_blocking` (boolean), `timeout_sec` (number).
   - `terminus_2`: `analysis` (string), `plan` (string), `commands`; optional `task_complete` (boolean); each
     command `keystrokes` (string) and optional `duration` (number); other keys are allowed.
4. `TASK_COMPLETE_CHECK_FAILED`: the gold declares the task complete (`task_complete`, else `is_task_complete`,
   true) and the reply does not, under the same key. A reply declaring completion when the gold does not passes
   this check unless `require_matching_completion` is on.
5. `KEYSTROKES_TOO_LONG`: the reply's keystrokes, joined, exceed `max_keystroke_chars`.
6. `COMMAND_CORRECTNESS_FAILED`: the similarity is below the row's `threshold`.
Otherwise **the reward is the similarity**: difflib's `SequenceMatcher` ratio of the gold's keystrokes joined (no
separator) against the reply's (`gymfleet.grading.text.sequence_similarity`, gold first). Both turns without commands
score 1.0; one without commands scores 0.0 (a command with empty keystrokes is a command). The response adds
`model_output` (the text graded), `similarity` (null when not computed) and `failure_reason` (null on success).
`/aggregate_metrics` adds `mean/failure_<code>`: the share of rows failing each way.

## Departures from NeMo-Gym
- NeMo-Gym's README calls the reward binary; its code returns the similarity, as here.
- A gold turn that is not JSON, not an object, or lacks string keystrokes is a 422 (NeMo-Gym scores every reply
  0). A `threshold` outside [0, 1] is a 422 (NeMo-Gym accepts it: above 1 every reply scores 0).
- `NaN` / `Infinity` in a reply are a `JSON_PARSING_FAILED` (Python's parser, which NeMo-Gym uses, accepts them);
  so are nesting too deep for the parser and integers over 4,300 digits (NeMo-Gym: `UNKNOWN_ERROR`).
- `similarity` is null when it was not computed (NeMo-Gym writes -1.0, which would drag its mean down).
- `KEYSTROKES_TOO_LONG` is new: comparing a megabyte of keystrokes costs seconds to minutes, and such a reply
  could score at most 2 * gold length / (gold length + reply length) anyway.
- The harness schemas are written from the Terminus prompts (NeMo-Gym keeps its own copies) and checked with
  `jsonschema` (Draft 2020-12) rather than `openapi-schema-validator`; these schemas use nothing the two read
  differently.

## Config
- `require_matching_completion` (default false, NeMo-Gym's one-way gate): when true, a reply that declares the
  task complete (its harness's key) when the gold does not scores 0. With the one-way gate a policy loses nothing
  by always declaring completion, which in a real Terminus episode ends the run early.
- `max_keystroke_chars` (default 50000): the longest joined reply keystrokes compared; longer scores 0.

## Tools
None.

## Version history
- v1: NeMo-Gym `super-v3` behaviour (JSON, harness schema, completion gate, keystroke similarity, threshold), with
  the departures above and the opt-in two-way completion gate.
"""

from __future__ import annotations

import asyncio
from statistics import fmean
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.terminal_pivot.scoring import FailureCode, Rules, gold_problem, grade, reply_text


class TerminalPivotConfig(ResourcesServerConfig):
    """terminal_pivot's fields."""

    require_matching_completion: bool = False
    """Also score 0 a reply that declares the task complete when the gold turn does not (NeMo-Gym: one-way)."""
    max_keystroke_chars: int = Field(50_000, gt=0)
    """Replies with more joined keystrokes score 0 uncompared: similarity costs grow with the product of lengths."""


class TerminalPivotMetadata(BaseModel):
    """The row's `metadata`; only `harness` is read."""

    model_config = ConfigDict(extra="allow")
    harness: str | None = None


class TerminalPivotRequest(VerifyRequest):
    """A row to grade."""

    expected_answer: str
    metadata: TerminalPivotMetadata
    threshold: float | None = Field(None, ge=0.0, le=1.0)

    @field_validator("expected_answer")
    @classmethod
    def _gold_is_a_turn(cls, value: str) -> str:
        problem = gold_problem(value)
        if problem is not None:
            raise ValueError(f"expected_answer {problem}, e.g. '{{\"commands\": [{{\"keystrokes\": \"ls\\\\n\"}}]}}'")
        return value


class TerminalPivotResponse(VerifyResponse):
    """The graded row."""

    model_output: str
    similarity: float | None = None
    failure_reason: FailureCode | None = None


class TerminalPivotServer(ResourcesServer):
    """Grades one Terminus turn by keystroke similarity to the gold turn."""

    config: TerminalPivotConfig
    reverify_mode = "stateless"
    reward_libraries = ("jsonschema",)

    async def verify(self, body: TerminalPivotRequest) -> TerminalPivotResponse:
        rules = Rules(self.config.require_matching_completion, self.config.max_keystroke_chars)
        text = reply_text(body.response)
        # Schema validation and SequenceMatcher are CPU work of up to a second on big replies: off the event loop.
        result = await asyncio.to_thread(grade, text, body.expected_answer, body.metadata.harness, body.threshold,
                                         rules)
        return TerminalPivotResponse.echo(
            body,
            reward=result.reward,
            model_output=result.model_output,
            similarity=result.similarity,
            failure_reason=result.failure_reason,
        )

    def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        metrics = super().aggregate_metrics(verify_responses)
        rows = [row for row in verify_responses if not row.get("_ng_failure_class")]
        extra = {
            f"mean/failure_{code}": fmean(row.get("failure_reason") == code for row in rows)
            for code in sorted({row["failure_reason"] for row in rows if isinstance(row.get("failure_reason"), str)})
        }
        metrics["agent_metrics"].update(extra)
        metrics["key_metrics"].update(extra)
        return metrics
