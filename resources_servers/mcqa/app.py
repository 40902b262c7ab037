"""mcqa: multiple-choice questions graded by the letter the model chose.

## Task fields
- `options`: list of single-key dicts `{letter: option text}` (null values ignored); the letters are the allowed
  answers.
- `expected_answer`: the correct letter.
- `grading_mode` (default `strict_single_letter_boxed`): how the letter is read from the answer (below). The server
  config's `grading_mode`, when set, overrides every row's.
- `template_metadata.output_regex` (optional, str or list): regexes tried before the mode; the last match of the
  first regex that matches gives the letter (or an option's exact text). When no regex yields a letter, the mode
  reads the text (a template asking for `Answer: \\boxed{{X}}` is often answered `\\boxed{{B}}`, which its own
  regex misses and the strict mode reads).
- Any other field (`uuid`, `metadata`, ...) is echoed untouched.

## Reward
1.0 when the extracted letter equals `expected_answer`, else 0.0. The text read is the response's `output_text`
(all assistant message text; reasoning items excluded), stripped; empty text scores 0. Modes:
- `strict_single_letter_boxed`: the last `\\boxed{}` must hold just one allowed letter (`B`, `(B)`, `{B}`,
  `B) PCR`, `\\text{(B) Mercury}`).
- `lenient_boxed`: strict first; else the box content may be the text of exactly one option.
- `lenient_answer_colon`: the first `Answer: X` line, a letter or an option's exact text.
- `lenient_answer_colon_md`: the last markdown-tolerant `**Answer:** X` line that names one letter; "A" and "I"
  used as words ("A close look shows it is B") are not letters.
In every mode an answer naming several letters scores 0: joined by punctuation, markdown or connector words
(`B or C`, `B. or C.`, `B, or C`, `**B** / **C**`, `B (or maybe C)`), as option labels (`A: ... B: ...`), or as a
label whose text is another option's (`(B) Venus` when Venus is C) or names another letter (`B) PCR, or else C`,
unless that is B's own option text). `resources_servers/mcqa/scoring.py` has the full rules.
The response adds `expected_answer` and `extracted_answer` (null when no letter could be read).

## Departures from NeMo-Gym
NeMo-Gym accepts these; each pays a policy for an answer that does not commit to one option, or refuses a clear
one:
- Hedges joined by label punctuation or markdown (`B. or C.`, `**B** or **C**`) or filler words (`B (or maybe C)`,
  `B vs. D`) score 0. NeMo-Gym's strict mode reads `B. or C.` as the label B, and its `lenient_answer_colon_md`
  rejects only letters joined directly by `/ | & , ;`, "or", "and" or spaces.
- A label whose text names another allowed letter or is another option's text scores 0 (NeMo-Gym reads the label).
- `(B) Mercury` and `[B] Mercury` are choice B (NeMo-Gym's strict mode reads no letter in them).
- In `lenient_answer_colon_md`, "A" / "I" leading a sentence as a word are skipped (NeMo-Gym reads "A close look
  shows it is B" as A, and "I think C" as I when I is an option).
- In `lenient_boxed`, a box starting with an allowed label that strict refused is not read as option text.

## Config
- `grading_mode`: null (each row's own mode) or one of the modes above, forced for every row.

## Tools
None.

## Version history
- v1: the four NeMo-Gym grading modes and `template_metadata.output_regex`.
- v2: an `output_regex` that yields no letter falls back to the mode (as NeMo-Gym); hedges in any separator form,
  labels with another option's text, and "A"/"I" used as words are not choices; `(B) text` is choice B.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.mcqa.scoring import GradingMode, score


class MCQAConfig(ResourcesServerConfig):
    """mcqa's fields."""

    grading_mode: GradingMode | None = None
    """Force this grading mode for every row (null: use each row's `grading_mode`)."""


class TemplateMetadata(BaseModel):
    """Prompt-template details some datasets carry; only `output_regex` affects grading."""

    model_config = ConfigDict(extra="allow")
    output_regex: str | list[str] | None = None


class MCQARequest(VerifyRequest):
    """A row to grade."""

    options: list[dict[str, str | None]]
    expected_answer: str
    grading_mode: GradingMode = "strict_single_letter_boxed"
    template_metadata: TemplateMetadata | None = None


class MCQAResponse(VerifyResponse):
    """The graded row."""

    expected_answer: str
    extracted_answer: str | None = None


class MCQAServer(ResourcesServer):
    """Grades multiple-choice answers."""

    config: MCQAConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    async def verify(self, body: MCQARequest) -> MCQAResponse:
        regex: Any = body.template_metadata.output_regex if body.template_metadata else None
        reward, letter = score(
            body.response.output_text,
            body.options,
            body.expected_answer,
            self.config.grading_mode or body.grading_mode,
            output_regex=regex,
        )
        return MCQAResponse.echo(body, reward=reward, extracted_answer=letter)
