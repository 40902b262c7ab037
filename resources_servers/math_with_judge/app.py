r"""math_with_judge: math problems graded by math-verify, with an optional LLM judge as a second opinion.

## Task fields
- `question`: the problem (shown to the judge).
- `expected_answer`: the gold answer, bare LaTeX or wrapped in `\(...\)` / `$...$` (a JSON number is accepted).
- `responses_create_params`: the prompt, which should ask for the final answer in `\boxed{}`.
- Any other field (`uuid`, ...) is echoed untouched. NeMo-Gym's math_with_judge rows are accepted as they are.

## Reward
1.0 when the answer is right, else 0.0.
1. The text read is the response's `output_text` (all assistant message text; reasoning items excluded), of which
   only the last `library_verifier_max_chars` characters are read: final answers sit at the end, and a long
   reasoning trace must neither score 0 for its length nor cost seconds of parsing.
2. The answer is the content of the text's last `\boxed{}` (or `\fbox{}`). With no box, or an empty last box, the
   reward is 0.0 with `library_reason: no_boxed_answer`, and the judge is not asked.
3. Library (`gymfleet.grading.mathcheck`, math-verify as NeMo-Gym runs it): the gold, wrapped in `\boxed{}`, against
   the last box's content. A box listing several answers (`\boxed{1, 2}`, `\boxed{x=1 \text{ or } x=2}`) is a set and
   does not match one gold; so is a box math-verify reads only in part (it reads `\boxed{0, 400, true}` as 400
   alone): when the box lists more items (top-level commas or semicolons, `listed_items`) than the answer
   math-verify extracted, the reward is 0.0 (`several_answers`) and the judge is not asked.
   `library_reward` is 1.0 or 0.0 and `library_reason` says why not: `not_equal`, `several_answers`,
   `no_boxed_answer`, `parse_error` (math-verify cannot read the box), `gold_parse_error`, `timeout` (the check
   used its budget and was killed), `crash`, `error`.
4. Without the judge (`should_use_judge: false`), when the library says equal, or when there is no box, reward is
   `library_reward`.
5. Judge: it is asked whether the gold and the answer are equivalent (`judge.txt`), gold as answer A; if it says
   `[[A=B]]` it is asked again with the two swapped, against position bias. Reward 1.0 only when both say
   `[[A=B]]`. The answer shown is the last box's content as written (at most 2,000 characters), never the rest
   of the text. The verdict is the label that occurs first in the text of the judge's last output message.
Response fields: `expected_answer`; `extracted_answer` (the extracted answer that matched the gold, else the first
one extracted, in SymPy's notation, e.g. `1/2`; null when none); `library_reward`; `library_reason` (null when the
library says equal); `judge_evaluations` (null, or each judge call made as `{responses_create_params, response}`).

Failures, kept out of rewards (`_ng_failure_class`): `judge_failed` when the judge cannot be reached, answers an
error after retries, or names neither label (NeMo-Gym scores an unlabelled judge reply 0; here it is not the
policy's fault); `sandbox_failed` when the verification processes cannot be started.

## Library version
math-verify `>=0.9,<0.10`, pinned in pyproject.toml and checked when the server starts (`gymfleet.grading.mathcheck`
refuses another version). Releases read answers differently (0.8 and 0.9 disagree on text holding two boxes), so
rewards are comparable only between runs on the same minor version; moving to another one is a new version of this
environment (below), after its table tests pass on it.

## Departures from NeMo-Gym
- math-verify 0.9, not NeMo-Gym's 0.8.0 (above).
- As in NeMo-Gym, an answer needs a non-empty last box; v1 of this environment let math-verify read the whole
  text instead, which paid unboxed hedges ("x = 1 or x = 2", "Possible answers: 7, 5, 3") whenever one of their
  values was the gold. Departure: only that box's content reaches math-verify. NeMo-Gym passes the text on
  (spec §1.2), and math-verify releases read text with several boxes differently (0.9 joins `\boxed{1} or
  \boxed{2}` into the set {1, 2}); reading one box makes the answer independent of that.
- The judge sees the last box's content as written. NeMo-Gym shows math-verify's extraction (SymPy's rendering, so
  `\text{four hundred}` reaches the judge as `fourhundred`), else the whole text, where words outside the box
  (a hedge, a plea to the judge) would reach it.
- An unlabelled judge reply is a `judge_failed` row, not 0.

## Config
- `should_use_judge` (false): ask the judge when the library says not equal.
- `judge_model_server`: the judge's model server, `{type: responses_api_models, name: ...}` or a plain name.
  Checked at startup when `should_use_judge` is true.
- `judge_responses_create_params` ({input: []}): base `/v1/responses` request for judge calls (`max_output_tokens`,
  `temperature`, ...); `input` is replaced by the prompt.
- `judge_timeout_s` (900), `judge_max_attempts` (3), `judge_max_concurrency` (64): per-attempt deadline, attempts
  per call (connection errors, timeouts, 429 and 5xx are retried), and judge calls in flight at once.
- `library_verifier_timeout_seconds` (10): budget per verification, in CPU seconds (so a busy machine does not
  fail ordinary answers), with a wall-clock backstop of four times that; past it the worker is killed.
- `library_verifier_max_concurrency` (32): verification processes at full priority, never more than the CPUs
  available (per server process: with `num_workers` > 1 each has its own pool).
- `library_verifier_max_chars` (50,000): how much of the text's end the library reads.

## Tools
None.

## Version history
- v1: NeMo-Gym's math_with_judge rules (math-verify, judge in both orders) with a supervised process pool, a hard
  per-verification deadline and `library_reason`; an unlabelled judge reply is a `judge_failed` row, not 0.
- v2: the answer is the last non-empty `\boxed{}` and only it (`no_boxed_answer` otherwise; the judge never sees
  text outside the box); math-verify pinned to `>=0.9,<0.10`.
- v3: a box that math-verify reads only in part (`\boxed{0, 1, 400, t}` parsed as 400) scores 0
  (`several_answers`); found by the reward-hacking probes (`tests/test_reward_probes.py`, every candidate at once).
- v4: several different boxed answers (`\boxed{1} or \boxed{2}`, a first guess boxed then corrected) score 0
  (`several_answers`); the same answer boxed twice does not. Departure: NeMo-Gym lets math-verify read the text.
  The judge is asked through `gymfleet.grading.judge_gate` (screened box, nonce block, last label).
- v5: the shared screen's honest-text revision (`gymfleet.grading.judge_input`, "Screen history").
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from gymfleet.errors import JudgeError
from gymfleet.grading.answers import tail
from gymfleet.grading.judge import load_prompt, prompt_version, render_prompt
from gymfleet.grading.judge_gate import JudgeGate, judge_client, judge_params
from gymfleet.grading.latex import BOX_START, BRACE_TOKEN, last_boxed
from gymfleet.grading.mathcheck import MathChecker, MathResult
from gymfleet.grading.procpool import available_cpus
from gymfleet.serving.judged import JudgeCallConfig
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse

EQUAL, NOT_EQUAL = "[[A=B]]", "[[A!=B]]"
JUDGE_ANSWER_CHARS = 2_000  # a runaway output must not overflow the judge's context
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # "1,000" is one number; "1, 000" and "1,0000" are not
_SET_BRACES = re.compile(r"^(?:\\left)?\\?\{(.*)(?:\\right)?\\?\}$", re.DOTALL)  # \{1, 2\}, {1, 2}, \left\{...\right\}


def listed_items(text: str) -> int:
    r"""How many answers `text` lists: its items separated by top-level commas or semicolons.

    Commas inside brackets (`(1, 2)`, `f(x, y)`), LaTeX's `\,` and thousands separators do not separate; one pair
    of set braces around the whole is ignored.

    Examples:
        >>> listed_items("0, 1, 400, t"), listed_items(r"\{1, 2, 3\}"), listed_items("{1, 2, 3}")
        (4, 3, 3)
        >>> listed_items("(1, 2)"), listed_items("1,000"), listed_items(r"1\,000"), listed_items("Interval.open(1, 2)")
        (1, 1, 1, 1)
    """
    text = _THOUSANDS.sub("", text.strip())
    inner = _SET_BRACES.match(text)
    if inner:
        text = inner.group(1)
    items, depth, previous = 1, 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(depth - 1, 0)
        elif char in ",;" and depth == 0 and previous != "\\":
            items += 1
        previous = char
    return items


def boxed_answers(text: str) -> list[str]:
    r"""The distinct contents of every complete `\boxed{}` / `\fbox{}` in `text`, in order (spaces, `\left`/`\right`
    and a box nested in a box ignored, so the same answer boxed twice is one).

    Examples:
        >>> boxed_answers(r"\boxed{1} or \boxed{2}"), boxed_answers(r"\boxed{ 1 } so \boxed{1}")
        (['1', '2'], ['1'])
        >>> boxed_answers(r"\boxed{\boxed{\frac{1}{2}}} and \boxed 5.")
        ['\\frac{1}{2}', '5']
    """
    found: list[str] = []
    for match in BOX_START.finditer(text):
        if match.group(2) is not None:
            content = match.group(2).rstrip(".,;:!?")
        else:
            depth, close = 0, None
            for token in BRACE_TOKEN.finditer(text, match.start(1)):
                depth += {"{": 1, "}": -1}.get(token.group(), 0)
                if depth == 0:
                    close = token.start()
                    break
            if close is None:
                continue
            content = text[match.end(1):close]
        content = content.strip()
        while content.startswith("\\boxed{") and content.endswith("}"):
            content = content[len("\\boxed{"):-1].strip()
        key = re.sub(r"\s+|\\left|\\right", "", content)
        if key and key not in found:
            found.append(key)
    return found


def _may_hold_several_boxes(text: str) -> bool:
    r"""False when `text` cannot hold two boxes (every box starts with `\boxed` or `\fbox`): most outputs, which
    then skip `boxed_answers`' scan."""
    return text.count("\\boxed") + text.count("\\fbox") > 1


def _number_as_text(value: Any) -> Any:
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


class MathWithJudgeConfig(JudgeCallConfig):
    """math_with_judge's fields (the module docstring explains each; the judge's come from `JudgeCallConfig`)."""

    should_use_judge: bool = False
    """Ask the judge when the library says the answer is not equal to the gold."""
    library_verifier_timeout_seconds: float = Field(default=10.0, gt=0)
    """CPU-time budget for one math-verify check, with a 4x wall-clock backstop (NeMo-Gym's key)."""
    library_verifier_max_concurrency: int = Field(default=32, ge=1)
    """Verification processes at full priority, capped at the CPUs available (NeMo-Gym's key)."""
    library_verifier_max_chars: int = Field(default=50_000, ge=1)
    """How many characters at the end of the text the library reads."""

    @model_validator(mode="after")
    def _judge_needs_a_server(self):
        if self.should_use_judge and not self.judge_model_server:
            raise ValueError("should_use_judge is true but judge_model_server is not set")
        return self


class MathWithJudgeRequest(VerifyRequest):
    """A row to grade."""

    question: str
    expected_answer: Annotated[str, BeforeValidator(_number_as_text)]


class MathWithJudgeResponse(VerifyResponse):
    """The graded row."""

    expected_answer: str
    extracted_answer: str | None = None
    library_reward: float
    library_reason: str | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


class MathWithJudgeServer(ResourcesServer):
    """Grades math answers with math-verify and, optionally, an LLM judge."""

    config: MathWithJudgeConfig
    reverify_mode = "stateless"
    reward_libraries = ("math-verify", "sympy", "latex2sympy2_extended")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = self.config
        self.checker = MathChecker(workers=min(config.library_verifier_max_concurrency, available_cpus()))
        self.gate = None
        if config.should_use_judge:
            self.gate = JudgeGate(judge_client(config, self.client), params=judge_params(config))
        self.judge = self.gate.judge if self.gate else None  # what `gymfleet.serving.provenance` records
        self.judge_prompt = load_prompt(__file__, "judge.txt")
        self.prompt_version = prompt_version(self.judge_prompt, "judge.txt")

    async def startup(self) -> None:
        await super().startup()
        if self.gate is not None:
            self.gate.judge.url()  # an unknown judge name fails here, at launch, not on the first wrong answer

    async def shutdown(self) -> None:
        self.checker.close()
        await super().shutdown()

    async def verify(self, body: MathWithJudgeRequest) -> MathWithJudgeResponse:
        max_chars = self.config.library_verifier_max_chars
        text = tail(body.response.output_text, max_chars)
        box = last_boxed(text)
        result: MathResult = await self.checker.check(
            body.expected_answer, text, timeout_s=self.config.library_verifier_timeout_seconds, max_chars=max_chars,
            box=box,
        )
        fields = {"extracted_answer": result.extracted, "library_reward": result.reward,
                  "library_reason": result.reason}
        if box is not None and _may_hold_several_boxes(text) and await self._several(boxed_answers(text)):
            # "\boxed{1} or \boxed{2}": different answers offered as alternatives are a hedge.
            fields = {**fields, "library_reward": 0.0, "library_reason": "several_answers"}
            return MathWithJudgeResponse.echo(body, reward=0.0, judge_evaluations=None, **fields)
        if result.equal and box is not None and listed_items(box) > listed_items(result.extracted or ""):
            # math-verify read only part of the box: "\boxed{0, 400, true}" parses as 400 alone.
            fields = {**fields, "library_reward": 0.0, "library_reason": "several_answers"}
            return MathWithJudgeResponse.echo(body, reward=0.0, judge_evaluations=None, **fields)
        if self.gate is None or result.equal or box is None:
            return MathWithJudgeResponse.echo(body, reward=result.reward, judge_evaluations=None, **fields)
        reward, evaluations = await self._ask_judge(body.question, body.expected_answer, box[:JUDGE_ANSWER_CHARS])
        return MathWithJudgeResponse.echo(body, reward=reward, judge_evaluations=evaluations, **fields)

    async def _several(self, boxes: list[str]) -> bool:
        """True when the boxes hold answers that math-verify does not find equal to the last one."""
        for other in boxes[:-1]:
            check = await self.checker.check(boxes[-1], f"\\boxed{{{other}}}",
                                             timeout_s=self.config.library_verifier_timeout_seconds)
            if not check.equal:
                return True
        return False

    async def _ask_judge(self, question: str, expected: str, answer: str) -> tuple[float, list[dict[str, Any]]]:
        """Ask in both orders (the second only if the first says equal); 1.0 only when both say equal.

        The answer is screened first (`gymfleet.grading.judge_input`): a box that tries to steer the judge is 0.0
        without asking it."""
        assert self.gate is not None
        prepared = JudgeGate.prepare(answer, (EQUAL, NOT_EQUAL))
        if prepared.reasons:
            return 0.0, []
        evaluations = []
        for first, second in ((expected, prepared.shown), (prepared.shown, expected)):
            quoted = (self.gate.quote(first, "ANSWER A") if first is prepared.shown else first,
                      self.gate.quote(second, "ANSWER B") if second is prepared.shown else second)
            prompt = render_prompt(self.judge_prompt, question=question, first_answer=quoted[0],
                                   second_answer=quoted[1])
            ruling = await self.gate.ask(prompt, labels=(EQUAL, NOT_EQUAL), answer=prepared.shown,
                                         version=self.prompt_version)
            evaluations.append({"responses_create_params": ruling.params, "response": ruling.response})
            if ruling.label is None:
                raise JudgeError(f"judge reply names none of {[EQUAL, NOT_EQUAL]}: {ruling.reply.text[-300:]!r}")
            if ruling.label != EQUAL:
                return 0.0, evaluations
        return 1.0, evaluations
