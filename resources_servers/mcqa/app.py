"""mcqa: multiple-choice questions graded by the letter the model chose.

## Task fields
- `options`: list of single-key dicts `{letter: option text}` (null values ignored); the letters are the allowed
  answers.
- `expected_answer`: the correct letter.
- `grading_mode` (default `strict_single_letter_boxed`): how the letter is read from the answer (below). The server
  config's `grading_mode`, when set, overrides every row's.
- `template_metadata.output_regex` (optional, str or list): regexes tried before the mode; the last match of the
  first regex that matches gives the letter (or an option's exact text).
- Any other field (`uuid`, `metadata`, ...) is echoed untouched.

## Reward
1.0 when the extracted letter equals `expected_answer`, else 0.0. The text read is the response's `output_text`
(all assistant message text; reasoning items excluded), stripped; empty text scores 0. Modes:
- `strict_single_letter_boxed`: the last `\\boxed{}` must hold just one allowed letter (`B`, `(B)`, `B) PCR`,
  `\\text{B}`); a box listing several letters scores 0.
- `lenient_boxed`: strict first; else the box content may be the text of exactly one option.
- `lenient_answer_colon`: the first `Answer: X` line, a letter or an option's exact text.
- `lenient_answer_colon_md`: the last markdown-tolerant `**Answer:** X` line that names one letter.
The response adds `expected_answer` and `extracted_answer` (null when no letter could be read).

## Config
- `grading_mode`: null (each row's own mode) or one of the modes above, forced for every row.

## Tools
None.

## Version history
- v1: the four NeMo-Gym grading modes and `template_metadata.output_regex`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from gymfleet.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
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
