r"""equivalence_llm_judge: an LLM judge decides whether the policy's answer is equivalent to the reference answer.

Three shipped configs use it: `equivalence_llm_judge` (STEM open questions, `[[A=B]]` / `[[A!=B]]`, per-record answer
regexes), `lc_judge` (questions about a long document, `CORRECT` / `INCORRECT`, the question cut out of the prompt by
a regex) and `nl2bash_equivalency` (`configs/nl2bash-equivalency.yaml`: one bash command, judged in both orders).

## Task fields
- `expected_answer`: the reference answer (a string, or a JSON number); when absent or empty,
  `metadata.expected_answer` is used. A row with neither is a 422.
- `template_metadata.output_regex` (optional): how to cut this row's answer out of the output (see Reward, step 2).
  A regex that does not compile is a 422, so `ng_collect_rollouts` names the row before any rollout.
- `responses_create_params`: the prompt. The question shown to the judge is the text of its last user message (a
  string `input` counts as one), not a `question` field (NeMo-Gym's rule: rows carry the question only there).
- Any other field (`uuid`, `options`, `metadata`, ...) is echoed untouched. NeMo-Gym's rows are accepted as they are.

## Reward
1. The answer is the text of the last assistant message of the response (its text parts joined by newlines,
   stripped; reasoning items excluded), of which only the last `judge_answer_max_chars` characters are read. With
   no such text, or nothing but `<think>` reasoning (blank once `gymfleet.grading.think.strip_think` drops it), the
   reward is 0.0 (`reason: no_answer`) and the judge is not asked.
2. Extraction: with `use_per_record_regex` and a row regex, that regex, else `response_extract_regex`, is searched
   (multiline, dot matches newline); the last match's first non-empty group (else the whole match) is the answer,
   and the whole text when nothing matches. A row regex is not applied when the reference is longer than
   `extraction_length_threshold` characters: such an answer is judged on the whole text, with no swap check and no
   full-text retry (the steps below that the threshold names "skipped for length").
3. Injection screen: the text about to be shown to the judge (the answer, and later the whole text for step 6) is
   checked with `gymfleet.grading.judge.injection_signals` against the two verdict labels (a label or verdict line
   written into the answer, a JSON verdict, "ignore the instructions above ..." aimed at a grader), and for the
   delimiter tags of the prompt (`<candidate_answer>`, ...). A signal scores 0.0 without asking the judge, recorded in
   `judge_injection` (`reason: judge_injection`).
4. The judge is asked with the prompt template (question, reference, answer; optional `judge_system_message`). Its
   verdict is the label occurring first in the text of its last output message (`gymfleet.grading.judge.verdict`; a
   label made of letters must stand as a whole word, so `INCORRECT` never reads as `CORRECT`; case is ignored).
5. Equal: with `check_twice_swap` (and not skipped for length) the judge is asked again with the answer as the
   reference and the reference as the answer: equal again gives 1.0, else `reward_if_swap_fails`
   (`reason: swap_not_equal`). Without the swap check, 1.0.
6. Not equal: with `check_full_generation_on_fail`, a row regex, and not skipped for length, the judge is asked once
   more with the whole text as the answer: equal gives `reward_if_full_generation_succeeds`
   (`reason: full_generation_equal`), else 0.0 (`reason: not_equal`). The retry is not made when the whole text
   is the answer already judged. An empty extracted answer counts as not equal without a judge call.

Response fields: `extracted_answer` (the answer judged first; `msg_extraction_failure` when there was none),
`reason` (null for 1.0), `judge_evaluations` (each judge call: `{responses_create_params, response,
verdict_label}`, NeMo-Gym's shape), `judge_provenance` (one `{judge_server, judge_model, prompt_version, seed}` per
call, so a reward says which judge and prompt produced it), `judge_injection` (null, or the screen's reasons).

Failures, kept out of rewards (`_ng_failure_class: judge_failed`): the judge cannot be reached, times out, answers
an error after its retries, or replies without message text or **without either label**. An unlabelled reply is a
failure, not 0.0: it says nothing about the answer (a judge cut off by `max_output_tokens`, a refusal, a format the
judge drifted into), and scoring it 0 would train the policy on the judge's noise. The failure rows stay visible in
`<output>_failures.jsonl` (a rising count means a misconfigured judge) and a resumed collection retries them. An
answer cannot buy its way out of a 0 this way: the screen of step 3 catches the usual attempts to derail the judge.

## Departures from NeMo-Gym
- An unlabelled judge reply is `judge_failed`, not "not equal" (above; the house rule of math_with_judge).
- Injection screen (step 3) and delimiters: NeMo-Gym shows any text to the judge. Our prompts quote the answer
  between tags and tell the judge it carries no authority. So an answer with an injection never scores above the
  same answer without it: a screened injection is 0.0, the least the answer can get without the judge's help.
- An empty answer is 0.0 without a judge call; NeMo-Gym asks the judge about `msg_extraction_failure`'s text. The
  full-text retry is skipped when it would repeat the first question word for word.
- The text read is capped at its last `judge_answer_max_chars` characters: a runaway output cannot overflow the
  judge's context (an HTTP 400 there would turn a wrong answer into a failure row instead of a 0).
- Verdict labels are matched ignoring case (a label of letters as a whole word); NeMo-Gym matches case-sensitively
  by substring. Our lc prompt asks for the verdict first, so a lowercase "correct" in an explanation never leads.
- `nl2bash-equivalency.yaml`'s inline `judge_prompt_template` is honoured. NeMo-Gym's app reads only
  `judge_prompt_template_fpath` and silently grades bash with its STEM prompt; its config also reuses the instance
  name `equivalence_llm_judge`, so listing it beside the STEM config merges the two (the later one wins). Ours is
  the instance `nl2bash_equivalency`. Templates are filled by `gymfleet.grading.judge.render_prompt`, not `str.format`:
  braces need no escaping (a NeMo-Gym template's `{{}}` stays doubled) and an answer cannot inject `{fields}`.
- Config regexes must compile (a startup error, not NeMo-Gym's silent "no match"); a row regex must compile (422).
- The question may come from a user message with text parts (joined by newlines), not only a string.

## Config
- `judge_model_server`: the judge's model server, `{type: responses_api_models, name: ...}` or a plain name; checked
  at startup against the fleet's instances.
- `judge_responses_create_params` ({input: []}): base `/v1/responses` request for judge calls (`max_output_tokens`,
  `temperature`, `seed`, ...); `input` is replaced by the prompt.
- `judge_timeout_s` (900), `judge_max_attempts` (3), `judge_max_concurrency` (64; NeMo-Gym's
  `judge_endpoint_max_concurrency` is accepted as its other name, null meaning no cap): deadline per attempt,
  attempts per call (connection failures, 429 with `Retry-After`, 5xx are retried), judge calls in flight.
- `judge_prompt_template_fpath` ("prompt_templates/equivalence_llm_judge.txt", relative to this folder) or an
  inline `judge_prompt_template` (not both): placeholders `{question}`, `{expected_answer}`, `{generated_answer}`
  (the last two required). `judge_system_message` (null): an optional system message.
- `judge_equal_label` ("[[A=B]]"), `judge_not_equal_label` ("[[A!=B]]"): the verdicts the prompt asks for.
- `question_extract_regex` (null): cuts the question out of the last user message (last match, first non-empty
  group, else the whole match; the whole message when nothing matches).
- `response_extract_regex` (null), `use_per_record_regex` (true), `extraction_length_threshold` (120; null: no
  threshold): answer extraction (Reward, step 2).
- `check_twice_swap` (false), `reward_if_swap_fails` (0.0), `check_full_generation_on_fail` (true),
  `reward_if_full_generation_succeeds` (0.5): steps 5 and 6.
- `msg_extraction_failure` ("[NO VALID ANSWER EXTRACTED]"): recorded as `extracted_answer` when there is no answer.
- `judge_answer_max_chars` (20,000): how much of the output's end is read.

## Tools
None.

## Version history
- v1: NeMo-Gym's equivalence_llm_judge rules (question from the last user message, answer regexes with the length
  threshold, first-label verdict, swap check, full-text retry) with our own prompts; unlabelled replies are
  `judge_failed`; injection screen; empty answers scored without the judge; judge provenance on every reward.
- v2: an answer that is nothing but a `<think>` block is `no_answer` (0.0, unjudged); the judge had read the
  hidden reasoning as the answer (found by `tests/test_reward_probes.py`).
- v3: the shared judge rules (`gymfleet.grading.judge_gate`): visible, normalised answer in a nonce block; the
  shared screen; the verdict is the judge's *last* label (NeMo-Gym's rule; v1-v2 read the first, so a judge
  quoting the answer's label before ruling against it paid 1.0); the lc prompt asks for the verdict last.
- v4: the shared screen's honest-text revision (`gymfleet.grading.judge_input`, "Screen history").
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, StrictFloat, StrictInt, StrictStr, field_validator, model_validator

from gymfleet.errors import JudgeError
from gymfleet.grading.answers import tail
from gymfleet.grading.judge import load_prompt, prompt_version, render_prompt
from gymfleet.grading.judge_gate import JudgeGate
from gymfleet.grading.judge_input import judge_text
from gymfleet.serving.judged import JudgedConfig, JudgedServer
from gymfleet.serving.resources import VerifyRequest, VerifyResponse
from gymfleet.wire import Response, ResponseCreateParams

log = logging.getLogger(__name__)

REGEX_FLAGS = re.MULTILINE | re.DOTALL
# The tags our prompts quote each part in; an answer that writes one tries to end its quotation early.
# "<candidate_answer>" and "</question >" match; "<candidate>" and "the candidate_answer tag" do not.
DELIMITER_TAG = re.compile(r"</?\s*(question|reference_answer|candidate_answer)\s*>", re.IGNORECASE)
UNCAPPED = 1 << 20  # judge_max_concurrency: null


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, REGEX_FLAGS)


def last_match_text(pattern: re.Pattern[str], text: str) -> str | None:
    r"""The last match's first non-empty group, else the whole match, stripped; None when nothing matches.

    Examples:
        >>> last_match_text(_compiled(r"<final_answer>\s*(.+?)\s*</final_answer>"),
        ...                 "<final_answer>3</final_answer> no, <final_answer> 25 </final_answer>")
        '25'
        >>> last_match_text(_compiled(r"^QUESTION:\s*(.*)$|</text>\n\n(.*)$"), "<text>...</text>\n\nWho wrote it?")
        'Who wrote it?'
        >>> last_match_text(_compiled(r"\*\*(.*?)\*\*"), "no bold here") is None
        True
    """
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - the last match is wanted
        pass
    if last is None:
        return None
    for group in last.groups():
        if group and group.strip():
            return group.strip()
    return last.group(0).strip()


def _item_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = [part.get("text") for part in content if isinstance(part, dict)]
    return "\n".join(part for part in parts if isinstance(part, str))


def question_text(params: ResponseCreateParams, pattern: re.Pattern[str] | None) -> str:
    """The last user message's text, cut by `pattern` when it matches (see the module docstring)."""
    if isinstance(params.input, str):
        text = params.input
    else:
        users = [item for item in params.input if getattr(item, "role", None) == "user"]
        text = _item_text(users[-1].content) if users else ""
    text = text.strip()
    if text and pattern is not None:
        return last_match_text(pattern, text) or text
    return text


def assistant_text(response: Response) -> str:
    """The text parts of the response's last assistant message, joined by newlines and stripped ("" when none)."""
    for item in reversed(response.output):
        if item.type == "message" and getattr(item, "role", None) == "assistant":
            texts = [getattr(part, "text", None) for part in item.content]
            return "\n".join(text for text in texts if isinstance(text, str)).strip()
    return ""


def _regex(value: str | None) -> str | None:
    if value is not None:
        try:
            _compiled(value)
        except re.error as exc:
            raise ValueError(f"not a valid regex ({exc}): {value!r}") from None
    return value


class EquivalenceLlmJudgeConfig(JudgedConfig):
    """equivalence_llm_judge's fields (the module docstring explains each)."""

    judge_max_concurrency: int | None = Field(
        default=64, ge=1, validation_alias=AliasChoices("judge_max_concurrency", "judge_endpoint_max_concurrency")
    )
    """Judge calls in flight at once from this server process (null: no cap). NeMo-Gym's name is accepted."""
    judge_prompt_template_fpath: str | None = None
    """Prompt file, relative to this folder (default `prompt_templates/equivalence_llm_judge.txt`)."""
    judge_prompt_template: str | None = None
    """Inline prompt template (instead of a file)."""
    judge_system_message: str | None = None
    """Optional system message before the prompt."""
    judge_equal_label: str = Field(default="[[A=B]]", min_length=1)
    judge_not_equal_label: str = Field(default="[[A!=B]]", min_length=1)
    question_extract_regex: str | None = None
    """Cuts the question out of the last user message."""
    response_extract_regex: str | None = None
    """Cuts the answer out of the output when the row has no regex of its own."""
    msg_extraction_failure: str = "[NO VALID ANSWER EXTRACTED]"
    """Recorded as `extracted_answer` when the output has no answer."""
    check_twice_swap: bool = False
    """Ask again with the two answers swapped when the judge says equal (against position bias)."""
    reward_if_swap_fails: float = 0.0
    use_per_record_regex: bool = True
    """Use the row's `template_metadata.output_regex` when it has one."""
    extraction_length_threshold: int | None = Field(default=120, ge=0)
    """References longer than this are judged on the whole output (row regexes only); null: no threshold."""
    check_full_generation_on_fail: bool = True
    """When the extracted answer is judged not equal, judge the whole output (rows with a regex only)."""
    reward_if_full_generation_succeeds: float = 0.5
    judge_answer_max_chars: int = Field(default=20_000, ge=1)
    """How many characters at the end of the output are read (and at most shown to the judge)."""

    _check_regexes = field_validator("question_extract_regex", "response_extract_regex")(_regex)

    @model_validator(mode="after")
    def _one_template(self):
        if self.judge_prompt_template is not None and self.judge_prompt_template_fpath is not None:
            raise ValueError("set judge_prompt_template (inline) or judge_prompt_template_fpath, not both")
        if self.judge_equal_label.casefold() == self.judge_not_equal_label.casefold():
            raise ValueError("judge_equal_label and judge_not_equal_label must differ")
        return self


class EquivalenceLlmJudgeRequest(VerifyRequest):
    """A row to grade."""

    expected_answer: StrictStr | StrictInt | StrictFloat | None = None
    metadata: dict[str, Any] | None = None
    template_metadata: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_row(self):
        if self.reference() is None:
            raise ValueError("the row has no expected_answer (nor metadata.expected_answer)")
        pattern = (self.template_metadata or {}).get("output_regex")
        if pattern is not None and not isinstance(pattern, str):
            raise ValueError(f"template_metadata.output_regex must be a string, got {type(pattern).__name__}")
        _regex(pattern)
        return self

    def reference(self) -> str | None:
        """`expected_answer`, else `metadata.expected_answer`, as text; None when neither is a non-empty value."""
        value = self.expected_answer
        if value is None or value == "":
            value = (self.metadata or {}).get("expected_answer")
        if value is None or isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
            return None
        return str(value)

    def output_regex(self) -> str | None:
        """The row's own answer regex, if any."""
        return (self.template_metadata or {}).get("output_regex") or None


class EquivalenceLlmJudgeResponse(VerifyResponse):
    """The graded row."""

    extracted_answer: str | None = None
    reason: str | None = None
    judge_evaluations: list[dict[str, Any]]
    judge_provenance: list[dict[str, Any]]
    judge_injection: list[str] | None = None


class _Screened(Exception):
    """The text about to reach the judge tries to steer it."""

    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


class EquivalenceLlmJudgeServer(JudgedServer):
    """Grades an answer by asking an LLM judge whether it is equivalent to the reference."""

    config: EquivalenceLlmJudgeConfig
    reward_libraries = ()  # the judge decides; its model is in the provenance's `judge`
    judge_uncapped = UNCAPPED
    warn_unchecked = True

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = self.config
        if config.judge_prompt_template is not None:
            self.template, source = config.judge_prompt_template.strip(), "judge_prompt_template"
        else:
            source = config.judge_prompt_template_fpath or "prompt_templates/equivalence_llm_judge.txt"
            try:
                self.template = load_prompt(__file__, source).strip()
            except FileNotFoundError:
                raise ValueError(f"judge_prompt_template_fpath {source!r}: no such file in "
                                 f"{Path(__file__).parent} (nor at that absolute path)") from None
        missing = [field for field in ("{expected_answer}", "{generated_answer}") if field not in self.template]
        if missing:
            raise ValueError(f"the judge prompt template ({source}) lacks {', '.join(missing)}")
        self.prompt_version = prompt_version(self.template, Path(source).name)
        self.labels = (config.judge_equal_label, config.judge_not_equal_label)
        self.question_pattern = _compiled(config.question_extract_regex) if config.question_extract_regex else None

    async def verify(self, body: EquivalenceLlmJudgeRequest) -> EquivalenceLlmJudgeResponse:
        config = self.config
        reference = body.reference()
        assert reference is not None  # the request model refuses rows without one
        question = question_text(body.responses_create_params, self.question_pattern)
        row_regex = body.output_regex() if config.use_per_record_regex else None
        threshold = config.extraction_length_threshold
        skipped_for_length = row_regex is not None and threshold is not None and len(reference) > threshold
        regex = None if skipped_for_length else (row_regex or config.response_extract_regex)

        whole = judge_text(tail(assistant_text(body.response), config.judge_answer_max_chars))
        evaluations: list[dict[str, Any]] = []
        provenance: list[dict[str, Any]] = []

        def result(reward: float, reason: str | None, answer: str | None, injection: list[str] | None = None):
            return EquivalenceLlmJudgeResponse.echo(
                body, reward=reward, reason=reason, extracted_answer=answer, judge_evaluations=evaluations,
                judge_provenance=provenance, judge_injection=injection,
            )

        if not whole:
            return result(0.0, "no_answer", config.msg_extraction_failure)
        answer = whole
        if regex and (extracted := last_match_text(_compiled(regex), whole)) is not None:
            answer = extracted  # "" when the match is empty: not equal, but the whole-text retry still applies
        ask = functools.partial(self._ask, question, evaluations=evaluations, provenance=provenance)
        try:
            if answer and await ask(reference, answer, untrusted=answer):
                if not config.check_twice_swap or skipped_for_length:
                    return result(1.0, None, answer)
                if await ask(answer, reference, untrusted=answer):
                    return result(1.0, None, answer)
                return result(config.reward_if_swap_fails, "swap_not_equal", answer)
            retry = (config.check_full_generation_on_fail and row_regex is not None and not skipped_for_length
                     and whole != answer)
            if retry and await ask(reference, whole, untrusted=whole):
                return result(config.reward_if_full_generation_succeeds, "full_generation_equal", answer)
        except _Screened as screened:
            return result(0.0, "judge_injection", answer, screened.reasons)
        return result(0.0, "not_equal" if answer else "no_answer", answer)

    def screen(self, text: str) -> list[str]:
        """Why `text` (bound for the judge prompt) looks like it tries to steer the judge; [] when it does not."""
        return JudgeGate.prepare(text, self.labels, (DELIMITER_TAG,)).reasons

    async def _ask(self, question: str, reference: str, candidate: str, *, untrusted: str,
                   evaluations: list[dict[str, Any]], provenance: list[dict[str, Any]]) -> bool:
        """One judge call on (reference, candidate); True when it says equal.

        `untrusted` (the policy's text in this prompt) is screened first.

        Raises:
            _Screened: `untrusted` carries an injection signal (the judge is not asked).
            JudgeError: the call failed, or the reply names neither label.
        """
        if reasons := self.screen(untrusted):
            raise _Screened(reasons)
        prompt = render_prompt(self.template, question=question, expected_answer=reference,
                               generated_answer=self.gate.quote(candidate, "CANDIDATE ANSWER"))
        ruling = await self.gate.ask(prompt, labels=self.labels, answer=untrusted, version=self.prompt_version,
                                     system=self.config.judge_system_message)
        if ruling.label is None:
            shown = ruling.reply.text[-300:]
            raise JudgeError(f"judge reply names none of {list(self.labels)}: {shown!r}")
        evaluations.append({"responses_create_params": ruling.params, "response": ruling.response,
                            "verdict_label": ruling.label})
        provenance.append(ruling.provenance)
        label = ruling.label
        return label == self.labels[0]
