r"""Answer extraction: pure helpers that pull a model's final answer out of its text.

Every helper is a pure function of its arguments: no I/O, no state. Extractors return `str | None`, where None means
"nothing found" and is never replaced by `""`. All of them run in time linear in the input (no regex here can
backtrack catastrophically), so a 1 MB completion cannot stall a server. Final answers sit at the end of an output,
so a caller that only needs the answer should still clip long text with `tail` before extracting.

Contents:
    - `last_boxed`: content of the last `\boxed{...}` / `\fbox{...}`.
    - `strip_think`: the visible answer once `<think>...</think>` reasoning is dropped.
    - `answer_after`, `answer_values`: the value after an `Answer:` label (markdown tolerant).
    - `choice_letter`: the option letter a payload names, rejecting hedges such as "A or B".
    - `option_label`: the option label a payload starts with ("(B) ...", "C: ...").
    - `is_letter_word`: whether a one-letter token is the English word "A" / "I" rather than an option.
    - `match_option_text`: the option letter whose text a payload spells out.
    - `unwrap_latex_text`: drop `\text{...}`-style wrappers.
    - `last_tagged`: content of the last `<answer>...</answer>`-style tag pair.
    - `last_fenced_block`: the lines of the last ```-fenced block (a program to run).
    - `last_number`, `normalize`, `normalize_letter`, `tail`: small building blocks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

__all__ = [
    "answer_after",
    "answer_values",
    "choice_letter",
    "is_letter_word",
    "last_boxed",
    "last_fenced_block",
    "last_number",
    "last_tagged",
    "match_option_text",
    "normalize",
    "normalize_letter",
    "option_label",
    "strip_think",
    "tail",
    "unwrap_latex_text",
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


# Arabic (alef with hamza above, beh, jeem, dal) and Bengali (a, ba, dda, ka) option letters, in A-D order.
_SCRIPT_LETTERS = {"أ": "A", "ب": "B", "ج": "C", "د": "D", "অ": "A", "ব": "B", "ড": "C", "ক": "D"}
_FULLWIDTH_UPPER_A, _FULLWIDTH_UPPER_Z = 0xFF21, 0xFF3A  # "Ａ".."Ｚ"
_FULLWIDTH_LOWER_A, _FULLWIDTH_LOWER_Z = 0xFF41, 0xFF5A  # "ａ".."ｚ"


def normalize_letter(ch: str) -> str:
    """Map an option letter written in another script to its ASCII capital.

    Full-width Latin letters (`Ａ`..`Ｚ`, `ａ`..`ｚ`) map to `A`..`Z`; the Arabic letters `أ ب ج د` and the Bengali
    letters `অ ব ড ক` map to `A B C D` (the order datasets in those languages use for options). Anything else is
    returned uppercased.

    Args:
        ch: Usually a single character; longer strings are only uppercased.

    Returns:
        The ASCII capital for a mapped letter, else `ch.upper()`.

    Examples:
        >>> normalize_letter("Ｃ"), normalize_letter("ｂ")
        ('C', 'B')
        >>> normalize_letter("ب"), normalize_letter("ক")
        ('B', 'D')
        >>> normalize_letter("e")
        'E'
    """
    if len(ch) == 1:
        code = ord(ch)
        if _FULLWIDTH_UPPER_A <= code <= _FULLWIDTH_UPPER_Z:
            return chr(code - _FULLWIDTH_UPPER_A + ord("A"))
        if _FULLWIDTH_LOWER_A <= code <= _FULLWIDTH_LOWER_Z:
            return chr(code - _FULLWIDTH_LOWER_A + ord("A"))
        if ch in _SCRIPT_LETTERS:
            return _SCRIPT_LETTERS[ch]
    return ch.upper()


# ---------------------------------------------------------------------------------------------- boxes

# Where a box starts: `\boxed{` / `\fbox {` (group 1 is the brace) or `\boxed 5` (group 2 is the bare token).
# Matches "\boxed{B}", "\fbox {B}", "\boxed 5"; does not match "\boxedB" or "\boxed $".
BOX_START = re.compile(r"\\(?:boxed|fbox)(?:\s*(\{)|\s+([^\s{}$\\]+))")
# A brace that counts towards nesting. `\{`, `\}` and `\\` match too, so escaped braces are consumed and skipped.
# Matches "{" and "}"; in "\{1,2\}" it matches "\{" and "\}", which do not count.
BRACE_TOKEN = re.compile(r"\\[\\{}]|[{}]")


def _closing_brace(text: str, open_at: int, end: int) -> int | None:
    depth = 0
    for match in BRACE_TOKEN.finditer(text, open_at, end):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return match.start()
    return None


def last_boxed(text: str) -> str | None:
    r"""Return the content of the last `\boxed{...}` or `\fbox{...}` in `text`.

    Rules:
        - Braces are counted, so nested groups such as `\boxed{\frac{1}{2}}` come back whole; escaped braces
          (`\{`, `\}`) do not count.
        - "Last" means the box that starts last; in `\boxed{\boxed{A}}` that is the inner one.
        - A box that never closes (an output cut off mid-answer) is ignored and the box before it is used.
        - `\boxed 5` (no braces, as TeX allows) yields the token after the space, less trailing sentence
          punctuation (`\boxed 5.` gives `5`).
        - The content is stripped; an empty last box gives None.

    Args:
        text: A model output.

    Returns:
        The stripped content of the last complete box, or None if there is none or it is empty.

    Examples:
        >>> last_boxed(r"First guess \boxed{A}. On reflection the answer is \boxed{C}.")
        'C'
        >>> last_boxed(r"\boxed{\frac{1}{2}}")
        '\\frac{1}{2}'
        >>> last_boxed(r"\boxed{\text{B}}")
        '\\text{B}'
        >>> last_boxed(r"so \boxed 5$")
        '5'
        >>> last_boxed(r"so the answer is \boxed 2.5.")
        '2.5'
        >>> last_boxed(r"\boxed{B} then cut off: \boxed{C") # the unclosed box is ignored
        'B'
        >>> last_boxed("no box here") is None
        True
    """
    # A box whose brace never closes bounds the scan of every earlier box: an earlier box that has not closed by
    # then cannot close later, since everything after the unclosed brace stays nested inside it. This keeps the
    # work linear even for "\boxed{" repeated a million times.
    end = len(text)
    next_boxed, next_fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    while next_boxed >= 0 or next_fbox >= 0:
        if next_boxed > next_fbox:
            start, next_boxed = next_boxed, text.rfind("\\boxed", 0, next_boxed)
        else:
            start, next_fbox = next_fbox, text.rfind("\\fbox", 0, next_fbox)
        match = BOX_START.match(text, start)
        if match is None:
            continue
        if match.group(2) is not None:
            return match.group(2).rstrip(".,;:!?") or None
        close = _closing_brace(text, match.start(1), end)
        if close is None:
            end = match.start(1)
            continue
        return text[match.end(1) : close].strip() or None
    return None


# ---------------------------------------------------------------------------------------------- think blocks

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def strip_think(text: str) -> str:
    r"""Drop reasoning wrapped in `<think>...</think>` and return the visible answer.

    Rules, applied left to right (tags are matched exactly, lowercase):
        - A complete `<think>...</think>` block is removed.
        - A `</think>` with no opening tag before it (reasoning parsers often leave the opening tag in the prompt)
          means everything before it was reasoning: all text up to and including it is dropped. With several, the
          last one wins.
        - A `<think>` that never closes (output cut off while reasoning) is dropped together with everything after
          it.

    Args:
        text: A model output.

    Returns:
        The remaining text, stripped of surrounding whitespace (possibly empty).

    Examples:
        >>> strip_think("<think>A looks tempting, but...</think>\n\nAnswer: B")
        'Answer: B'
        >>> strip_think("the opening tag was in the prompt...</think> Answer: C")
        'Answer: C'
        >>> strip_think("Answer: D <think>wait, maybe not")
        'Answer: D'
        >>> strip_think("no reasoning tags")
        'no reasoning tags'
    """
    kept: list[str] = []
    pos = 0
    open_at, close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    while True:
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            kept.clear()
            pos = close_at + len(THINK_CLOSE)
            close_at = text.find(THINK_CLOSE, pos)
            continue
        if open_at == -1:
            kept.append(text[pos:])
            break
        kept.append(text[pos:open_at])
        if close_at == -1:
            break
        pos = close_at + len(THINK_CLOSE)
        open_at, close_at = text.find(THINK_OPEN, pos), text.find(THINK_CLOSE, pos)
    return "".join(kept).strip()


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


# ---------------------------------------------------------------------------------------------- option letters

# A LaTeX text wrapper whose argument holds no braces; it is replaced by its argument (innermost first).
# Matches "\text{B}", "\textbf{ B) PCR }"; does not match "\texttt{B}" or "\text{a{b}}" as a whole.
LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf)\s*\{([^{}]*)\}")
_MAX_WRAPPER_DEPTH = 8  # deeper nesting is not an answer; the bound keeps unwrapping linear

# Strict: a lone capital with only non-letters around it. Matches "B", "(B)", "**B**", "$B$.", "{B}";
# not "B or C", "PCR".
LONE_CAPITAL = re.compile(r"^[^A-Za-z]*([A-Z])[^A-Za-z]*$")
# Strict: a capital used as an option label at the start, followed by anything (usually the option's text).
# Matches "B) PCR", "B: PCR", "B. coli", "B - PCR", "(B) PCR", "[B] PCR", "**B.** PCR"; not "BRCA1", "B PCR",
# "(BRCA1)".
LABELLED_CAPITAL = re.compile(r"^[\s*_]*(?:\(\s*([A-Z])\s*\)|\[\s*([A-Z])\s*\]|([A-Z])[*_]*\s*[:).\-])")
# Lenient: a first character that is a letter on its own. Matches "b because", "C."; not "Because" or "B12".
LEADING_LETTER = re.compile(r"^([a-zA-Z])(?![a-zA-Z0-9])")
# Lenient: a standalone capital anywhere. Matches "C" in "so C is right"; not the "C" in "CRISPR".
STANDALONE_CAPITAL = re.compile(r"\b[A-Z]\b")
# Words that may stand between two option letters of a hedge.
_CONNECTORS = "or|and|nor|either|maybe|possibly|perhaps|probably|vs|versus|then|also|plus|alternatively|otherwise"
# Two option letters in a row: a capital standing alone, then only non-letters (spaces, punctuation, brackets,
# markdown) and connector words, then another capital standing alone, in a lookahead so "A, A, B" still finds the
# pair (A, B). Matches "A or B", "B. or C.", "B, or C", "(A) and (B)", "**B** / **C**", "B (or maybe C)", "A B";
# not "B) PCR", "AB", "B, not C", "B 1 C".
LETTER_PAIR = re.compile(
    r"(?<![A-Za-z0-9])([A-Z])(?![A-Za-z0-9])"
    rf"(?:[^A-Za-z0-9]|(?<![A-Za-z])(?i:{_CONNECTORS})(?![A-Za-z]))+"
    r"(?=([A-Z])(?![A-Za-z0-9]))"
)
# An option label as a prompt writes it. Two distinct ones mean the payload echoes the option list.
# Matches "A:" in "A: PCR B: ELISA", "(B)", "C)"; not "B." or "BRCA:".
OPTION_LABEL = re.compile(r"(?<![A-Za-z0-9])\(?([A-Z])\s*[:)]")
# What follows a letter that is used as a word: a lowercase word (group 1) or a contraction ("I'm", "I'd").
WORD_AFTER_LETTER = re.compile(r"\s+([a-z]+)|['’][a-z]")
# Words after "A" / "I" that show the letter is an option ("A is correct", "I fits", "A or B").
_OPTION_FOLLOWERS = frozenset(
    {"is", "seems", "appears", "fits", "matches", "remains", "looks", "describes", "gives", "because", "since",
     "and", "or"}
)


def is_letter_word(text: str, at: int) -> bool:
    """Whether the one-letter token at `text[at]` is the English word "A" / "I", not an option letter.

    "A" (the article) and "I" (the pronoun) begin sentences: in "A close look shows it is B" the option is B. The
    letter is a word when a lowercase word or a contraction follows it, unless that word is one that follows an
    option letter (`is`, `seems`, `fits`, `because`, `or`, ...; also `was` after "A", not after the pronoun "I").
    Other letters are never words.

    Args:
        text: The text holding the token.
        at: The token's index.

    Returns:
        True when the token reads as a word.

    Examples:
        >>> is_letter_word("A close look shows it is B", 0), is_letter_word("A is correct", 0)
        (True, False)
        >>> is_letter_word("I'd pick C", 0), is_letter_word("I was wrong", 0), is_letter_word("A was right", 0)
        (True, True, False)
        >>> is_letter_word("B because", 0), is_letter_word("A Western blot", 0)
        (False, False)
    """
    letter = text[at].upper()
    if letter not in "AI":
        return False
    after = WORD_AFTER_LETTER.match(text, at + 1)
    if after is None:
        return False
    follower = after.group(1)
    if follower is None:
        return True
    return follower not in _OPTION_FOLLOWERS and not (letter == "A" and follower == "was")


def unwrap_latex_text(text: str) -> str:
    r"""Replace `\text{...}`, `\textbf{...}`, `\textit{...}`, `\mathrm{...}` and `\mathbf{...}` by their argument.

    Wrappers are removed innermost first, up to 8 levels deep, wherever they appear in `text`.

    Args:
        text: Usually the content of a box.

    Returns:
        The unwrapped text, stripped.

    Examples:
        >>> unwrap_latex_text(r"\text{\textbf{B}}")
        'B'
        >>> unwrap_latex_text(r"\text{B}) PCR")
        'B) PCR'
        >>> unwrap_latex_text(r"\frac{1}{2}")
        '\\frac{1}{2}'
    """
    for _ in range(_MAX_WRAPPER_DEPTH):
        text, count = LATEX_TEXT.subn(lambda match: match.group(1), text)
        if not count:
            break
    return text.strip()


def _names_several(payload: str, allowed: frozenset[str]) -> bool:
    for match in LETTER_PAIR.finditer(payload):
        first, second = match.group(1), match.group(2)
        if (
            first != second
            and first in allowed
            and second in allowed
            and not is_letter_word(payload, match.start(1))
            and not is_letter_word(payload, match.start(2))
        ):
            return True
    return len({match.group(1) for match in OPTION_LABEL.finditer(payload)} & allowed) >= 2


def _mentions_other(text: str, letter: str, allowed: frozenset[str]) -> bool:
    return any(
        capital.group() != letter and capital.group() in allowed and not is_letter_word(text, capital.start())
        for capital in STANDALONE_CAPITAL.finditer(text)
    )


def _labelled(text: str) -> tuple[str, str] | None:
    """`(letter, rest)` when `text` starts with an option label (`LABELLED_CAPITAL`), else None."""
    match = LABELLED_CAPITAL.match(text)
    if match is None:
        return None
    letter = match.group(1) or match.group(2) or match.group(3)
    return letter, text[match.end() :].strip().strip("*_").rstrip(".").strip()


def option_label(payload: str | None) -> str | None:
    r"""Return the capital that `payload` starts with as an option label, allowed or not.

    A label is a capital followed by `)`, `:`, `.` or `-`, or one in parentheses or brackets, after optional
    markdown emphasis; LaTeX text wrappers are removed first. A caller that reads option text when `choice_letter`
    finds no letter uses this to tell "no letter" from "a letter that was refused" (a hedge, or the label of one
    option with the text of another).

    Args:
        payload: A box's content or an `Answer:` value; None gives None.

    Returns:
        The label's capital, or None.

    Examples:
        >>> option_label(r"\text{(B) Venus}"), option_label("C: PCR"), option_label("**D.** ELISA")
        ('B', 'C', 'D')
        >>> option_label("Western blot") is None, option_label("BRCA1: a gene") is None
        (True, True)
    """
    if payload is None:
        return None
    labelled = _labelled(unwrap_latex_text(payload))
    return None if labelled is None else labelled[0]


def choice_letter(
    payload: str | None, options: Iterable[str] | Mapping[str, str | None], lenient: bool = False
) -> str | None:
    r"""Return the option letter that `payload` (a box's content, an `Answer:` value) chooses.

    Rules, in order:
        1. LaTeX text wrappers are removed (`unwrap_latex_text`) and the payload is stripped.
        2. With option texts (`options` a mapping): a label followed by exactly its own option's text
           ("(B) Mercury", `\text{B) Mercury}`) is that letter, even if the text holds other letters; a label
           followed by another option's text ("(B) Venus" when Venus is C) names two options and gives None.
        3. A payload that names two or more distinct allowed letters is a hedge or an echo of the options and gives
           None: standalone letters with only punctuation, brackets, markdown, whitespace and connector words ("or",
           "and", "maybe", "vs", ...) between them ("A or B", "B. or C.", "B, or C", "(A) and (B)", "B (or maybe
           C)", "A B"), or two option labels such as "A: ... B: ...".
        4. Strict: a lone capital among non-letters ("B", "(B)", "**B**", "{B}"), or a capital used as a label at
           the start ("B) PCR", "B: PCR", "B.", "(B) PCR", "[B] PCR"). Lowercase letters do not count. A label
           whose text names another allowed letter is a hedge and gives None in both modes ("B) PCR, or else C";
           rule 2 still reads "B: Vitamin D" when that is B's own text).
        5. Lenient only, when 4 finds nothing: a leading letter of either case standing alone ("b because ..."),
           else the last standalone capital ("I think C").
        6. The letter must be in `options`; in the lenient rules a letter outside them lets the next rule try.
    Everywhere, "A" and "I" used as English words ("A close look shows it is B", "I think C") are not letters
    (`is_letter_word`).

    Args:
        payload: The text to read; None gives None, so `choice_letter(last_boxed(text), ...)` composes.
        options: The allowed letters, e.g. `"ABCD"` or `["A", "B", "C", "D"]`, or a mapping of letter to option
            text, which also enables rule 2.
        lenient: Whether to apply rule 5.

    Returns:
        The chosen uppercase letter, or None.

    Examples:
        >>> choice_letter(r"\text{B}", "ABCD")
        'B'
        >>> choice_letter("B) PCR", "ABCD")
        'B'
        >>> choice_letter(r"\text{(B) Mercury}", {"A": "Venus", "B": "Mercury"})
        'B'
        >>> choice_letter("(B) Venus", {"A": "Venus", "B": "Mercury"}) is None
        True
        >>> choice_letter("E", "ABCD") is None
        True
        >>> choice_letter("A or B", "ABCD") is None, choice_letter("B. or C.", "ABCD") is None
        (True, True)
        >>> choice_letter("A: PCR B: ELISA C: qPCR", "ABCD") is None
        True
        >>> choice_letter("I think it is C", "ABCD") is None
        True
        >>> choice_letter("I think it is C", "ABCD", lenient=True)
        'C'
        >>> choice_letter("A close look shows it is B", "ABCD", lenient=True)
        'B'
    """
    if payload is None:
        return None
    allowed = frozenset(option.upper() for option in options)
    text = unwrap_latex_text(payload)
    if not text:
        return None
    labelled = _labelled(text)
    if labelled is not None and isinstance(options, Mapping) and labelled[1]:
        named = match_option_text(labelled[1], options)
        if named is not None:
            return named if named == labelled[0] and named in allowed else None
    if _names_several(text, allowed):
        return None
    lone = LONE_CAPITAL.match(text)
    if lone and lone.group(1) in allowed:
        return lone.group(1)
    if labelled is not None and labelled[0] in allowed:
        return None if _mentions_other(labelled[1], labelled[0], allowed) else labelled[0]
    if not lenient:
        return None
    leading = LEADING_LETTER.match(text)
    if leading and leading.group(1).upper() in allowed and not is_letter_word(text, 0):
        return leading.group(1).upper()
    for capital in reversed(list(STANDALONE_CAPITAL.finditer(text))):
        if capital.group() in allowed and not is_letter_word(text, capital.start()):
            return capital.group()
    return None


def match_option_text(
    payload: str | None, options: Mapping[str, str | None], *, substring: bool = False
) -> str | None:
    r"""Return the letter of the one option whose text `payload` spells out.

    Both sides are compared after `normalize` (casefold, collapsed whitespace); the payload is tried both as given
    and with LaTeX text wrappers removed. Options with empty or null text never match.

    Args:
        payload: The text to read (a box's content, an `Answer:` value); None gives None.
        options: Option letter to option text.
        substring: False: the payload must equal the option text. True: the option text must occur inside the
            payload.

    Returns:
        The uppercase letter when exactly one option matches; None when none or several do.

    Examples:
        >>> options = {"A": "PCR", "B": "RT-PCR", "C": "Western blot"}
        >>> match_option_text(r"\text{western  BLOT}", options)
        'C'
        >>> match_option_text("the answer is western blot", options, substring=True)
        'C'
        >>> match_option_text("RT-PCR", options, substring=True) is None  # "PCR" matches too
        True
    """
    if payload is None:
        return None
    candidates = {normalize(payload), normalize(unwrap_latex_text(payload))} - {""}
    hits = set()
    for letter, option in options.items():
        wanted = normalize(option or "")
        if wanted and any((wanted in candidate) if substring else (wanted == candidate) for candidate in candidates):
            hits.add(letter.upper())
    return hits.pop() if len(hits) == 1 else None


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
