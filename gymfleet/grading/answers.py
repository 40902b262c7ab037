r"""Answer extraction: pure helpers that pull a model's final answer out of its text.

Every helper is a pure function of its arguments: no I/O, no state. Extractors return `str | None`, where None means
"nothing found" and is never replaced by `""`. All of them run in time linear in the input (no regex here can
backtrack catastrophically), so a 1 MB completion cannot stall a server. Final answers sit at the end of an output,
so a caller that only needs the answer should still clip long text with `tail` before extracting.

Contents:
    - `answer_after`, `answer_values`: the value after an `Answer:` label (markdown tolerant).
    - `last_tagged`: content of the last `<answer>...</answer>`-style tag pair.
    - `last_fenced_block`: the lines of the last ```-fenced block (a program to run).
    - `last_number`, `normalize`, `tail`: small building blocks.

Siblings: `gymfleet.grading.latex` (`last_boxed`, `unwrap_latex_text`), `gymfleet.grading.think` (`strip_think`),
`gymfleet.grading.choices` (`choice_letter`, `option_label`, `is_letter_word`, `match_option_text`,
`normalize_letter`).
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "answer_after",
    "answer_values",
    "last_fenced_block",
    "last_number",
    "last_tagged",
    "normalize",
    "tail",
]

# ---------------------------------------------------------------------------------------------- small blocks


def tail(text: str, max_chars: int) -> str:
    """Return the last `max_chars` characters of `text`.

    Final answers sit at the end of an output, so clipping before regex work bounds the cost on huge outputs without
    losing the answer.

    Args:
        text: Any text.
        max_chars: How many trailing characters to keep; 0 keeps nothing.

    Returns:
        `text` itself when it is short enough, else its last `max_chars` characters.

    Raises:
        ValueError: If `max_chars` is negative.

    Examples:
        >>> tail("reasoning... Answer: B", 9)
        'Answer: B'
        >>> tail("short", 100)
        'short'
        >>> tail("anything", 0)
        ''
    """
    if max_chars < 0:
        raise ValueError(f"max_chars must be >= 0, got {max_chars}")
    return text[len(text) - max_chars :] if len(text) > max_chars else text


def normalize(text: str) -> str:
    r"""Casefold `text`, collapse runs of whitespace to one space and strip the ends.

    Args:
        text: Any text.

    Returns:
        The normalized text, suitable for equality or substring checks between free-form strings.

    Examples:
        >>> normalize("  Polymerase   Chain\nReaction ")
        'polymerase chain reaction'
        >>> normalize("STRASSE") == normalize("straße")
        True
    """
    return " ".join(text.casefold().split())


# ---------------------------------------------------------------------------------------------- fenced blocks


def last_fenced_block(text: str) -> str | None:
    """Return the lines strictly between the last two lines that contain a code fence (```).

    A fence line is any line holding ```: "```python", "```" and "text ``` inline" all count, as LiveCodeBench-style
    graders split on them. The language tag and anything else on the fence lines is dropped.

    Args:
        text: A model output.

    Returns:
        The block's lines joined by newlines (`""` for an empty block), or None with fewer than two fence lines.

    Examples:
        >>> last_fenced_block("Here:\\n```python\\nprint(1)\\n```\\nDone.")
        'print(1)'
        >>> last_fenced_block("one fence only ```python\\nprint(1)") is None
        True
    """
    lines = text.split("\n")
    fences = [index for index, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return None
    return "\n".join(lines[fences[-2] + 1 : fences[-1]])


# ---------------------------------------------------------------------------------------------- tag pairs


def last_tagged(text: str, tag: str = "answer") -> str | None:
    r"""Return the content of the last `<tag>...</tag>` pair in `text`, stripped.

    Pairs are found left to right: an opening tag pairs with the first closing tag after it, and the search goes on
    after that closing tag. This is what the lazy pattern `<tag>(.*?)</tag>` (DOTALL) finds, as used by
    reasoning-gym's `extract_answer`, but in linear time: that regex rescans to the end of the text for every
    unclosed opening tag, so `"<answer>" * 100_000` costs it minutes.

    Rules:
        - Tags match exactly and case-sensitively (`<answer>`, not `<Answer>` or `<answer id=1>`).
        - An opening tag that never closes (an output cut off mid-answer) is ignored; so is every opening tag after
          it, since none of them can close either.
        - A pair that holds only whitespace gives `""`, not None: the tag was found and is empty, which callers may
          need to tell apart from a missing tag (reasoning-gym grades an empty answer, it does not fall back).

    Args:
        text: A model output.
        tag: The tag name, without angle brackets.

    Returns:
        The stripped content of the last complete pair, or None if there is no complete pair.

    Examples:
        >>> last_tagged("<answer>12</answer> on reflection <answer> 13 </answer>")
        '13'
        >>> last_tagged("<answer>Zoey is a sage</answer> then cut off <answer>Zo")
        'Zoey is a sage'
        >>> last_tagged("<answer>\n</answer>")
        ''
        >>> last_tagged("<think>...</think>", tag="answer") is None
        True
    """
    opening, closing = f"<{tag}>", f"</{tag}>"
    found: str | None = None
    pos = 0
    while (start := text.find(opening, pos)) != -1:
        end = text.find(closing, start + len(opening))
        if end == -1:
            break
        found = text[start + len(opening) : end]
        pos = end + len(closing)
    return None if found is None else found.strip()


# ---------------------------------------------------------------------------------------------- "Answer:" lines


@lru_cache(maxsize=32)
def _answer_pattern(label: str, markdown: bool) -> re.Pattern[str]:
    # markdown=True matches "**Answer:** B", "__Answer__: B", "Answer : B", "Answer:\nB"; not "Answer is B".
    # markdown=False matches "answer: B", "Answer :\n\n B"; in "**Answer:** B" it captures "** B".
    if markdown:
        return re.compile(rf"{re.escape(label)}[*_]{{0,2}}\s*:[*_\s]{{0,2}}(.+)", re.IGNORECASE)
    return re.compile(rf"{re.escape(label)}\s*:\s*(.+)", re.IGNORECASE)


def answer_values(text: str, label: str = "Answer", *, markdown: bool = True) -> list[str]:
    r"""Return every non-empty value written after `label:` in `text`, in order of appearance.

    The label matches case-insensitively anywhere (so "Final answer:" counts). A value runs to the end of its line.

    - `markdown=True`: up to two `*`/`_` may follow the label (`**Answer**:`), whitespace may precede the colon, up to
      two `*`/`_`/whitespace characters (a newline included) may precede the value (`**Answer:** B`,
      `Answer:\nB`), and `*`/`_` emphasis is stripped from the value's ends.
    - `markdown=False`: the plain form `label\s*:\s*(.+)`; any whitespace, newlines included, may separate colon
      and value, and only whitespace is stripped from the value.

    Args:
        text: A model output.
        label: The label before the colon.
        markdown: Whether to tolerate markdown emphasis (see above).

    Returns:
        The stripped values; values that are empty after stripping are left out.

    Examples:
        >>> answer_values("Answer: A\nHmm, wait.\n**Answer:** C")
        ['A', 'C']
        >>> answer_values("**Answer:** B", markdown=False)
        ['** B']
        >>> answer_values("Answer is B")
        []
    """
    pattern = _answer_pattern(label, markdown)
    values = (match.group(1).strip() for match in pattern.finditer(text))
    if markdown:
        values = (value.strip("*_").strip() for value in values)
    return [value for value in values if value]


def answer_after(text: str, label: str = "Answer") -> str | None:
    r"""Return the value after the last `label:` in `text` that has one (markdown tolerant, case-insensitive).

    See `answer_values` (`markdown=True`) for what counts as a label and a value.

    Args:
        text: A model output.
        label: The label before the colon.

    Returns:
        The last non-empty value, stripped, or None.

    Examples:
        >>> answer_after("Let me check each option.\n\n**Answer:** B")
        'B'
        >>> answer_after("__Answer__: C")
        'C'
        >>> answer_after("FINAL ANSWER : 42", label="final answer")
        '42'
        >>> answer_after("Answer:   ") is None
        True
    """
    values = answer_values(text, label, markdown=True)
    return values[-1] if values else None


# ---------------------------------------------------------------------------------------------- numbers

# A number: optional sign (only where it cannot be a minus between terms), integer part with or without thousands
# separators, optional decimals, optional "/denominator". The lookahead lets the regex engine skip non-numbers fast.
# Matches "-1,234.5", "3/4", "42"; in "3-4" it matches "3" and "4", not "-4"; in "12,34" it matches "12" and "34".
NUMBER = re.compile(r"(?=[-−\d])(?:(?<![\w)\]])[-−])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+(?:\.\d+)?)?")
# A character no number can contain. Matches "x" and " "; does not match "7", ",", "-".
NON_NUMBER_CHAR = re.compile(r"[^-−\d,./]")
_NUMBER_WINDOW_CHARS = 256


def last_number(text: str) -> str | None:
    """Return the last number in `text`, cleaned for comparison.

    Integers, decimals and negatives are recognised; thousands separators are removed ("1,234" gives "1234"), a
    Unicode minus becomes "-", and a fraction "3/4" is kept as written. A hyphen between two numbers ("3-4") is
    not a sign.

    Args:
        text: A model output.

    Returns:
        The last number as a string, or None if `text` has no digits.

    Examples:
        >>> last_number("12 apples and 30 pears, so 1,234 in all.")
        '1234'
        >>> last_number("The slope is -0.75, i.e. 3/4 steeper")
        '3/4'
        >>> last_number("pages 3-4")
        '4'
        >>> last_number("no digits") is None
        True
    """
    # Scan growing windows from the end so a huge output is not searched in full. A window's matches equal the full
    # text's only after a character that no number contains (before it a match could be cut), so matching restarts
    # there.
    size = _NUMBER_WINDOW_CHARS
    while True:
        start = len(text) - size
        if start <= 0:
            matches = NUMBER.findall(text)
            break
        sync = NON_NUMBER_CHAR.search(text, start)
        matches = NUMBER.findall(text, sync.start()) if sync else []
        if matches:
            break
        size *= 4
    return matches[-1].replace(",", "").replace("−", "-") if matches else None
