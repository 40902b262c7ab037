r"""MCQA grading: which option letter a model's answer names, and whether it is the gold one.

A pure function of (output text, row), so it is table-tested without a server; `app.py` only adapts it to /verify.

Reward: 1.0 iff the extracted letter equals `expected_answer` (stripped, uppercased), else 0.0. An empty output, no
answer, an answer naming several options ("A or B") or a letter outside the options all give 0.0 with no letter.

Extraction, in priority order:
    1. `output_regex` (the row's `template_metadata.output_regex`, one pattern or a list): for each pattern in
       order, take the last `re.findall` match (IGNORECASE; the first group if the pattern has groups), stripped.
       A single character is mapped with `normalize_letter` (full-width, Arabic, Bengali letters) and accepted if
       alphabetic, even when it is not one of the options (it then simply scores 0). Otherwise it must equal one
       option's text (after `normalize`). The first pattern that yields a letter wins.
    2. When no pattern yields a letter (none matches, or what matches is neither a letter nor an option's text),
       the grading mode reads the text, as in NeMo-Gym. A template asking for `Answer: \boxed{{X}}` (doubled
       braces, from a format string) is often answered `\boxed{{B}}`, which its own regex misses and the strict
       mode reads.
       - `strict_single_letter_boxed`: the last `\boxed{...}` must hold one allowed capital, alone among non-letters
         ("B", "(B)", "{B}", `\text{B}`) or as a leading label ("B) PCR", "B: PCR", "B.", "(B) PCR", "[B] PCR").
       - `lenient_boxed`: strict first; else, unless the box starts with an allowed option label that strict
         refused, the option whose text occurs inside the last box, if exactly one does.
       - `lenient_answer_colon`: the first `answer:` value (`answer\s*:\s*(.+)`, no markdown handling); a single
         allowed letter, or exactly one option's text.
       - `lenient_answer_colon_md`: every markdown-tolerant `Answer:` value, last to first; the first that names a
         letter wins, by the strict rules, then a leading letter of either case, then the last standalone allowed
         capital. "A" and "I" used as words ("A close look shows it is B", "I think C") are not letters.

Before any extraction the text is stripped and clipped to its last `MAX_SCAN_CHARS` characters. Answers sit at the
end, so the clip loses nothing a grader should read, and it bounds the regex work (including a row's own
`output_regex`) on pathological outputs. On outputs longer than the clip, "first `answer:`" means the first one
inside the clipped tail.

Every mode reads letters with `gymfleet.grading.choices.choice_letter`, given the option texts, so it rejects a payload
naming two or more distinct allowed letters, joined by punctuation, markdown or connector words ("A or B", "B. or
C.", "B, or C", "**B** / **C**", "B (or maybe C)") or as option labels ("A: PCR B: ELISA", an echo of the prompt's
option list); a label followed by another option's text ("(B) Venus" when Venus is option C); and a label whose text
names another allowed letter ("B) PCR, or else C") unless that text is the label's own option text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Literal

from gymfleet.grading import answers, choices, latex

GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon", "lenient_answer_colon_md"]

MAX_SCAN_CHARS = 20_000


def options_letters(options: list[dict[str, str | None]]) -> list[str]:
    """Return the allowed option letters, uppercased, in row order.

    Each option is a dict keyed by its letter (`{"A": "PCR"}`). Keys whose text is null are ignored: datasets stored
    in Arrow give every option dict every key, with null for the letters it does not hold. Keys that are not a single
    letter are ignored too.

    Examples:
        >>> options_letters([{"A": "PCR", "B": None}, {"A": None, "B": "ELISA"}, {"c": "qPCR"}])
        ['A', 'B', 'C']
    """
    return list(_option_texts(options))


def _option_texts(options: list[dict[str, str | None]]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for option in options:
        for key, text in option.items():
            if text is not None and len(key) == 1 and key.isalpha():
                texts.setdefault(key.upper(), text)
    return texts


def _by_regex(text: str, patterns: list[str], texts: Mapping[str, str]) -> str | None:
    for pattern in patterns:
        matches = re.findall(pattern, text, re.IGNORECASE)
        if not matches:
            continue
        last = matches[-1]
        candidate = (last[0] if isinstance(last, tuple) else last).strip()
        if len(candidate) == 1:
            letter = choices.normalize_letter(candidate)
            if letter.isalpha():
                return letter
        letter = choices.match_option_text(candidate, texts)
        if letter is not None:
            return letter
    return None


def _strict_boxed(text: str, texts: Mapping[str, str]) -> str | None:
    return choices.choice_letter(latex.last_boxed(text), texts)


def _lenient_boxed(text: str, texts: Mapping[str, str]) -> str | None:
    box = latex.last_boxed(text)
    letter = choices.choice_letter(box, texts)
    if letter is not None or choices.option_label(box) in texts:
        return letter  # a label strict refused (a hedge, or another option's text) is not read as text
    return choices.match_option_text(box, texts, substring=True)


def _lenient_answer_colon(text: str, texts: Mapping[str, str]) -> str | None:
    values = answers.answer_values(text, markdown=False)
    if not values:
        return None
    candidate = latex.unwrap_latex_text(values[0])
    if len(candidate) == 1 and candidate.upper() in texts:
        return candidate.upper()
    return choices.match_option_text(candidate, texts)


def _lenient_answer_colon_md(text: str, texts: Mapping[str, str]) -> str | None:
    for value in reversed(answers.answer_values(text, markdown=True)):
        letter = choices.choice_letter(value, texts, lenient=True)
        if letter is not None:
            return letter
    return None


_BY_MODE: dict[str, Callable[[str, Mapping[str, str]], str | None]] = {
    "strict_single_letter_boxed": _strict_boxed,
    "lenient_boxed": _lenient_boxed,
    "lenient_answer_colon": _lenient_answer_colon,
    "lenient_answer_colon_md": _lenient_answer_colon_md,
}


def score(
    text: str,
    options: list[dict[str, str | None]],
    expected_answer: str,
    grading_mode: GradingMode = "strict_single_letter_boxed",
    output_regex: str | list[str] | None = None,
) -> tuple[float, str | None]:
    r"""Grade one MCQA answer (rules in the module docstring).

    Args:
        text: The model's `output_text` (all output_text parts of its message items, concatenated).
        options: The row's options, single-key dicts `{letter: text}`; null texts are ignored.
        expected_answer: The gold letter.
        grading_mode: How to find the letter when no `output_regex` pattern yields one.
        output_regex: The row's `template_metadata.output_regex`; an empty string or list counts as absent.

    Returns:
        `(reward, extracted_letter)`: reward is 1.0 or 0.0; the letter is None when none was found.

    Raises:
        ValueError: If `grading_mode` is not a known mode.
        re.error: If an `output_regex` pattern does not compile (bad data, not a model fault).

    Examples:
        >>> options = [{"A": "PCR"}, {"B": "ELISA"}, {"C": "Western blot"}]
        >>> score(r"ELISA detects antigens... \boxed{B}", options, "B")
        (1.0, 'B')
        >>> score(r"\boxed{A or B}", options, "B")
        (0.0, None)
        >>> score("**Answer:** C", options, "C", grading_mode="lenient_answer_colon_md")
        (1.0, 'C')
        >>> score("Answer: western blot", options, "C", grading_mode="lenient_answer_colon")
        (1.0, 'C')
    """
    by_mode = _BY_MODE.get(grading_mode)
    if by_mode is None:
        raise ValueError(f"unknown grading_mode {grading_mode!r}; known: {sorted(_BY_MODE)}")
    text = answers.tail(text.strip(), MAX_SCAN_CHARS)
    if not text:
        return 0.0, None
    texts = _option_texts(options)
    letter = None
    if output_regex:
        patterns = [output_regex] if isinstance(output_regex, str) else list(output_regex)
        letter = _by_regex(text, patterns, texts)
    if letter is None:
        letter = by_mode(text, texts)
    expected = expected_answer.strip().upper()
    return float(letter is not None and letter == expected), letter
