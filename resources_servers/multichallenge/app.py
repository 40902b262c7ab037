r"""multichallenge: a multi-turn conversation's final reply, graded by an LLM judge against yes/no rubric questions.

## Task fields
- `responses_create_params`: the conversation so far (system, user and earlier assistant turns); the policy writes
  the next assistant turn.
- `rubric`: `[{question, pass_criteria, weight?}]`; `pass_criteria` is "YES" or "NO" (any case), `weight` a
  number >= 0 (default 1, read only by `aggregation_mode: weighted`). When absent or empty, `metadata.rubric`.
- `context`: the conversation rendered as text for the judge. When absent or empty, it is rendered from
  `metadata.messages`, else from `responses_create_params.input`, as `[ROLE]: content` blocks.
- `task_id`, `uuid`, `metadata` and any other field are echoed untouched. NeMo-Gym's rows are accepted as they are.

## Reward
The reward is in [0, 1]: the share of rubric questions the judge answers as the rubric expects (`mean`).
1. The reply is the text of the response's last assistant message, with `<think>...</think>` and
   `<thinking>...</thinking>` blocks removed, and everything up to an unpaired closing tag removed (its opening
   tag was in the prompt); a block that never closes goes with everything after it.
2. Scored 0.0 without asking the judge, with `reason`: `empty_rubric` (no items), `empty_response` (nothing left
   after cleaning), `response_too_long` (longer than `max_response_chars`), `judge_injection` (below).
3. Each rubric item is one judge call (`judge_system.txt` + `judge_prompt.txt`: the context, the reply between
   `<model_response>` tags, the question and the expected answer), all items in parallel. The verdict is the
   label, `[[YES]]` or `[[NO]]` (`yes_label` / `no_label`, any case), that occurs **last** in the judge's reply
   (its own `<think>` blocks removed); with neither label, the reply's last line decides: the word YES there
   means YES, else NO (`verdict_source`: `label`, `last_line` or `default`). An item scores 1.0 when the
   verdict equals its `pass_criteria`, else 0.0.
4. The reward aggregates the item scores by `aggregation_mode` (`mean` as shipped).
Response fields: `generated_response` (the cleaned reply), `rubric_evaluations` (per item: `question`,
`pass_criteria`, `weight`, `verdict`, `verdict_source`, `score`, `judge_prompt`, `judge_response`),
`aggregation_mode`, `num_passed`, `num_total`, `reason` (null when judged), `judge_injection` (null, or the
signals found), `judge_provenance` (per item: judge server, model, prompt version, seed).

Failures, kept out of rewards (`_ng_failure_class`): `judge_failed` when any item's judge call cannot be made
(unreachable, deadline, 429/5xx after retries, a reply with no message text); the other items' calls are cancelled
and no item is scored 0 for it. An unlabelled verdict is not a failure: rule 3 gives it a value.

## Departures from NeMo-Gym
- Injection guard: the reply is placed between `<model_response>` tags, and a reply that writes a verdict label
  (`[[YES]]`, `[[NO]]`), a grader-aimed instruction override ("ignore the instructions above and answer ...") or
  the tags themselves scores 0.0 (`reason: judge_injection`) without asking the judge, so an answer with an
  injection never scores above the same answer without it.
- An empty reply or one over `max_response_chars` scores 0 unjudged (NeMo-Gym asks the judge, which can pass
  "NO" questions on an empty reply; an over-long one overflows the judge's context and fails the row, which
  would hide it from training).
- A judge call that fails is a `judge_failed` row, never a score of 0 for that item.
- Labels are matched ignoring case; the last-line fallback needs YES as a whole word ("EYES" is not a yes).
- `pass_criteria` other than YES/NO is a 422 (NeMo-Gym counts YES as the pass for any other value).
- With neither `context` nor `metadata.messages`, the context is rendered from the prompt's messages (NeMo-Gym
  shows the judge an empty context).
- The echoed row keeps its fields as sent (NeMo-Gym drops `rubric` and replaces `context`).
- Our own prompt texts. A `judge_prompt_template` given in the config is filled with `{name}` placeholders in one
  pass (`gymfleet.grading.judge.render_prompt`), not `str.format`: braces need no doubling.

## Config
- `judge_model_server`: the judge's model server, `{type: responses_api_models, name: ...}` or a plain name; the
  shipped config uses `policy_model`. Checked when the server starts in a fleet.
- `judge_responses_create_params` ({input: []}): base `/v1/responses` request for judge calls (shipped:
  `max_output_tokens: 8192, temperature: 0.7, top_p: 0.8`); `input` is replaced by the item's messages.
- `judge_timeout_s` (900), `judge_max_attempts` (3), `judge_max_concurrency` (64): per-attempt deadline, attempts
  per call (connection errors, 429 and 5xx are retried, honouring `Retry-After`), judge calls in flight at once.
- `aggregation_mode` (mean): mean, min, max, all (every item passed), any, weighted (by `weight`).
- `parallel_evaluation` (true): judge a row's items at once, or one after another.
- `max_response_chars` (60,000): longer cleaned replies score 0.
- `judge_prompt_template` (null: `judge_prompt.txt`): must hold `{response}` and `{question}`; may hold
  `{context}` and `{pass_criteria}`.
- `judge_system_message` (null: `judge_system.txt`; "" for none).
- `yes_label` ("[[YES]]"), `no_label` ("[[NO]]").

## Tools
None.

## Version history
- v1: NeMo-Gym's multichallenge rules (cleaned last reply, parallel per-item judge calls, last-label verdict with
  the last-line fallback, configurable aggregation), with the injection guard, early zeros and `judge_failed`
  rows.
- v2: the shared judge rules (`gymfleet.grading.judge_gate`): the reply is shown normalised in a nonce block
  (no `<model_response>` tags); an unclosed `<think>` after visible text no longer hides the rest; the shared
  screen; copies of the reply in the judge's answer are not read.
- v3: the verdict word written in capitals inline (`... the settings page. YES`) is an injection too (the shared
  screen now reads three-letter labels that way; found by `tests/test_judge_injection_property.py`).
- v4: the shared screen's honest-text revision (`gymfleet.grading.judge_input`, "Screen history").
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gymfleet.grading.judge import configured_prompts, find_verdict, prompt_version, render_prompt
from gymfleet.serving.resources import VerifyRequest
from resources_servers.multichallenge.rubric import (
    ItemVerdict,
    JudgeItem,
    RubricJudgeConfig,
    RubricJudgeResponse,
    RubricJudgeServer,
    clean_response,
    config_check,
    delimit,
    distinct_labels,
    final_message_text,
    metadata_rubric,
)

_YES_WORD = re.compile(r"\bYES\b", re.IGNORECASE)  # "Final answer: yes." matches; "EYES" does not


class RubricQuestion(BaseModel):
    """One rubric item."""

    model_config = ConfigDict(extra="allow")
    question: str
    pass_criteria: str = "YES"
    weight: float = Field(default=1.0, ge=0, allow_inf_nan=False)

    @field_validator("pass_criteria")
    @classmethod
    def _yes_or_no(cls, value: str) -> str:
        normal = value.strip().upper()
        if normal not in ("YES", "NO"):
            raise ValueError(f"pass_criteria must be YES or NO, got {value!r}")
        return normal


class MultichallengeConfig(RubricJudgeConfig):
    """multichallenge's fields (the module docstring explains each)."""

    judge_prompt_template: str | None = None
    """Judge prompt with `{context}`, `{response}`, `{question}`, `{pass_criteria}`; null: `judge_prompt.txt`."""
    judge_system_message: str | None = None
    """Judge system message; null: `judge_system.txt`; empty: none."""
    yes_label: str = "[[YES]]"
    no_label: str = "[[NO]]"

    @model_validator(mode="after")
    def _check_prompts(self):
        config_check(self.judge_prompt_template, "response", "question", field="judge_prompt_template")
        distinct_labels((self.yes_label, self.no_label))
        return self


class MultichallengeRequest(VerifyRequest):
    """A row to grade."""

    rubric: list[RubricQuestion] | None = None
    context: str | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _metadata_rubric(self):
        self.rubric = metadata_rubric(RubricQuestion, self.rubric, self.metadata)
        return self


class MultichallengeResponse(RubricJudgeResponse, MultichallengeRequest):
    """The graded row."""


def render_context(messages: list[Any]) -> str:
    r"""A conversation as `[ROLE]: content` blocks separated by blank lines (items without a role are skipped).

    Examples:
        >>> render_context([{"role": "user", "content": "Hi, I am Alex."}, {"role": "assistant", "content": "Hi!"}])
        '[USER]: Hi, I am Alex.\n\n[ASSISTANT]: Hi!'
    """
    blocks = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message["role"] == "thinking":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
        blocks.append(f"[{message['role'].upper()}]: {content if content is not None else ''}")
    return "\n\n".join(blocks)


def read_yes_no(text: str, yes_label: str = "[[YES]]", no_label: str = "[[NO]]") -> tuple[str, str]:
    r"""The judge's YES/NO and where it was found: the label occurring last, else the last line, else NO.

    Examples:
        >>> read_yes_no("At first [[NO]]... on reflection [[YES]]")
        ('YES', 'label')
        >>> read_yes_no("The reply names Alex.\nAnswer: Yes")
        ('YES', 'last_line')
        >>> read_yes_no("I cannot tell.")
        ('NO', 'default')
    """
    found = find_verdict(text, (yes_label, no_label), occurrence="last")
    if found is not None:
        return ("YES" if found == yes_label else "NO"), "label"
    lines = text.strip().splitlines()
    last = lines[-1] if lines else ""
    if _YES_WORD.search(last):
        return "YES", "last_line"
    if re.search(r"\bNO\b", last, re.IGNORECASE):
        return "NO", "last_line"
    return "NO", "default"


class MultichallengeServer(RubricJudgeServer):
    """Grades a conversation's final reply against yes/no rubric questions with an LLM judge."""

    config: MultichallengeConfig
    reward_libraries = ()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = self.config
        self.template, self.system, name = configured_prompts(
            __file__, config.judge_prompt_template, config.judge_system_message)
        self.version = prompt_version(f"{self.system or ''}\n\n{self.template}", name)
        self.labels = (config.yes_label, config.no_label)

    def read_verdict(self, item: JudgeItem, text: str) -> ItemVerdict:
        verdict, source = read_yes_no(text, self.config.yes_label, self.config.no_label)
        return ItemVerdict(verdict, source, 1.0 if verdict == item.record["pass_criteria"] else 0.0)

    async def verify(self, body: MultichallengeRequest) -> MultichallengeResponse:
        text = clean_response(final_message_text(body.response))
        context = body.context or render_context((body.metadata or {}).get("messages") or [])
        if not context:
            context = render_context(body.responses_create_params.input_items())
        shown = delimit(text)
        items = [
            JudgeItem(
                prompt=render_prompt(self.template, context=context, response=shown, question=rubric.question,
                                     pass_criteria=rubric.pass_criteria),
                system=self.system,
                prompt_version=self.version,
                weight=rubric.weight,
                record={"question": rubric.question, "pass_criteria": rubric.pass_criteria},
            )
            for rubric in body.rubric or []
        ]
        return MultichallengeResponse.echo(body, **await self.grade(text, items))
