r"""inverse_if: counter-intuitive instructions, each rubric criterion graded PASS/FAIL by an LLM judge.

## Task fields
- `responses_create_params`: the instruction (one user turn).
- `prompt`: the instruction as shown to the judge (else `metadata.prompt`, else the last user message).
- `rubric`: `[{id, criteria}]`, one requirement per item (else `metadata.rubric`).
- `reference_response`: a response that meets the instruction, shown to the judge (else
  `metadata.reference_response`, else empty).
- `judge_prompt_template` (placeholders `{prompt}`, `{model_response}`, `{standard_response}`, `{criteria}`) and
  `judge_system_prompt`: the row's own judge prompts; null or empty falls back to the config's defaults. A row
  template without `{model_response}` and `{criteria}` is a 422.
- `task_id`, `uuid`, `metadata` and any other field are echoed untouched. NeMo-Gym's rows are accepted as they are.

## Reward
The reward is in [0, 1]: the share of criteria the judge passes (`mean`).
1. The reply is the text of the response's last assistant message, with `<think>`/`<thinking>` blocks removed as
   in multichallenge (`resources_servers/multichallenge/rubric.py`).
2. Scored 0.0 without asking the judge, with `reason`: `empty_rubric`, `empty_response`, `response_too_long`
   (over `max_response_chars`), `judge_injection` (below).
3. Each criterion is one judge call, all in parallel: the row's system prompt and template (else the config's,
   else `judge_system.txt` / `judge_prompt.txt`), with `{model_response}` filled by the reply between
   `<model_response>` tags. The verdict is JSON first: the `"result"` of the first fenced ```json block, else of
   the first `{...}` object, holding "PASS" or "FAIL" (any case); else the last five lines of the judge's reply
   (its own `<think>` blocks removed) are read bottom-up, and the first line naming PASS or FAIL (whole words;
   PASSED/FAILED count; the later one in the line wins) decides; else FAIL (`verdict_source`: `json`,
   `last_lines`, `default`). PASS scores 1.0, FAIL 0.0.
4. The reward aggregates the scores by `aggregation_mode` (`mean` as shipped).
Response fields: `generated_response`, `rubric_evaluations` (per item: `criterion_id`, `criteria`, `weight`,
`verdict`, `verdict_source`, `score`, `judge_prompt`, `judge_response`), `aggregation_mode`, `num_passed`,
`num_total`, `reason`, `judge_injection`, `judge_provenance` (per item; the prompt version names `row` when the
row's own prompts were used).

Failures, kept out of rewards (`_ng_failure_class`): `judge_failed` when any criterion's judge call cannot be
made (unreachable, deadline, 429/5xx after retries, no message text); no criterion is scored 0 for it. An
unparseable verdict is not a failure: rule 3 makes it FAIL, as NeMo-Gym does.

## Departures from NeMo-Gym
- Injection guard: the reply reaches the judge only between `<model_response>` tags, and a reply that writes a
  JSON verdict (`{"result": "PASS"}`), a verdict line (`Result: PASS`, a line holding only PASS), a grader-aimed
  instruction override or the tags themselves scores 0.0 (`reason: judge_injection`) without asking the judge,
  so an answer with an injection never scores above the same answer without it.
- An empty reply or one over `max_response_chars` scores 0 unjudged; a failed judge call is `judge_failed`.
- The PASS/FAIL fallback matches whole words (NeMo-Gym's substring test reads "BYPASS" as a pass) and within one
  line the later label wins (NeMo-Gym prefers PASS).
- Templates are filled with `{name}` placeholders in one pass (`gymfleet.grading.judge.render_prompt`), not
  `str.format`.
- A missing `prompt` falls back to the last user message (NeMo-Gym shows the judge an empty one).
- The echoed row keeps its fields as sent (NeMo-Gym drops the prompts and the rubric).
- Our own default prompt texts (NeMo-Gym's rows carry theirs and are used as sent).

## Config
- `judge_model_server`, `judge_responses_create_params`, `judge_timeout_s` (900), `judge_max_attempts` (3),
  `judge_max_concurrency` (64), `aggregation_mode` (mean), `parallel_evaluation` (true), `max_response_chars`
  (60,000): as in multichallenge. The shipped judge is `policy_model`.
- `default_judge_prompt_template` (null: `judge_prompt.txt`): fallback template; must hold `{model_response}` and
  `{criteria}`.
- `default_judge_system_prompt` (null: `judge_system.txt`; "" for none): fallback system prompt.

## Tools
None.

## Version history
- v1: NeMo-Gym's inverse_if rules (per-row judge prompts with config fallbacks, JSON-first PASS/FAIL verdict with
  the last-five-lines fallback, parallel per-criterion calls, configurable aggregation), with the injection guard,
  early zeros and `judge_failed` rows.
- v2: the shared judge rules (`gymfleet.grading.judge_gate`), as multichallenge v2.
- v3: the shared screen's honest-text revision (`gymfleet.grading.judge_input`, "Screen history").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from gymfleet.grading.judge import configured_prompts, find_verdict, json_verdict, prompt_version, render_prompt
from gymfleet.serving.resources import VerifyRequest
from resources_servers.multichallenge import rubric as rubrics  # the plumbing both rubric environments share

PASS, FAIL = "PASS", "FAIL"
_LINE_LABELS = {"PASS": PASS, "PASSED": PASS, "PASSES": PASS, "FAIL": FAIL, "FAILED": FAIL, "FAILS": FAIL}
FALLBACK_LINES = 5


class Criterion(BaseModel):
    """One rubric criterion."""

    model_config = ConfigDict(extra="allow")
    id: str | int = ""
    criteria: str


class InverseIfConfig(rubrics.RubricJudgeConfig):
    """inverse_if's fields (the module docstring explains each)."""

    default_judge_prompt_template: str | None = None
    """Fallback judge template; null: `judge_prompt.txt`."""
    default_judge_system_prompt: str | None = None
    """Fallback judge system prompt; null: `judge_system.txt`; empty: none."""

    @model_validator(mode="after")
    def _check_prompt(self):
        rubrics.config_check(self.default_judge_prompt_template, "model_response", "criteria",
                     field="default_judge_prompt_template")
        return self


class InverseIfRequest(VerifyRequest):
    """A row to grade."""

    prompt: str | None = None
    rubric: list[Criterion] | None = None
    reference_response: str | None = None
    judge_prompt_template: str | None = None
    judge_system_prompt: str | None = None
    metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _resolve(self):
        if self.judge_prompt_template:
            missing = rubrics.has_placeholders(self.judge_prompt_template, "model_response", "criteria")
            if missing:
                raise ValueError(f"judge_prompt_template lacks {['{' + name + '}' for name in missing]}")
        self.rubric = rubrics.metadata_rubric(Criterion, self.rubric, self.metadata)
        return self


class InverseIfResponse(rubrics.RubricJudgeResponse, InverseIfRequest):
    """The graded row."""


def read_pass_fail(text: str) -> tuple[str, str]:
    r"""The judge's PASS/FAIL and where it was found: JSON first, then the last five lines, else FAIL.

    Examples:
        >>> read_pass_fail('The list has five items.\n```json\n{"result": "PASS", "explanation": "five"}\n```')
        ('PASS', 'json')
        >>> read_pass_fail("Three lines, not four.\nVerdict: FAILED")
        ('FAIL', 'last_lines')
        >>> read_pass_fail("Hard to say.")
        ('FAIL', 'default')
    """
    found = json_verdict(text, "result", (PASS, FAIL))
    if found is not None:
        return found, "json"
    for line in reversed(text.strip().splitlines()[-FALLBACK_LINES:]):
        label = find_verdict(line, tuple(_LINE_LABELS), occurrence="last")
        if label is not None:
            return _LINE_LABELS[label], "last_lines"
    return FAIL, "default"


def _last_user_text(body: InverseIfRequest) -> str:
    for item in reversed(body.responses_create_params.input_items()):
        if item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, list):
                return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content or ""
    return ""


class InverseIfServer(rubrics.RubricJudgeServer):
    """Grades a reply against per-criterion PASS/FAIL judgements with per-row judge prompts."""

    config: InverseIfConfig
    reward_libraries = ()
    labels = ('result=PASS', 'result=FAIL', PASS, FAIL)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = self.config
        self.template, self.system, self.template_name = configured_prompts(
            __file__, config.default_judge_prompt_template, config.default_judge_system_prompt)

    def read_verdict(self, item: rubrics.JudgeItem, text: str) -> rubrics.ItemVerdict:
        verdict, source = read_pass_fail(text)
        return rubrics.ItemVerdict(verdict, source, 1.0 if verdict == PASS else 0.0)

    async def verify(self, body: InverseIfRequest) -> InverseIfResponse:
        text = rubrics.clean_response(rubrics.final_message_text(body.response))
        metadata = body.metadata or {}
        prompt = body.prompt or metadata.get("prompt") or _last_user_text(body)
        reference = body.reference_response or metadata.get("reference_response") or ""
        template = body.judge_prompt_template or self.template
        system = body.judge_system_prompt or self.system
        own = bool(body.judge_prompt_template or body.judge_system_prompt)
        version = prompt_version(f"{system or ''}\n\n{template}", "row" if own else self.template_name)
        shown = rubrics.delimit(text)
        items = [
            rubrics.JudgeItem(
                prompt=render_prompt(template, prompt=str(prompt), model_response=shown,
                                     standard_response=str(reference), criteria=criterion.criteria),
                system=system,
                prompt_version=version,
                record={"criterion_id": str(criterion.id), "criteria": criterion.criteria},
            )
            for criterion in body.rubric or []
        ]
        return InverseIfResponse.echo(body, **await self.grade(text, items))
