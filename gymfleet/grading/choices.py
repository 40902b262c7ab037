r"""Multiple-choice answers: which option letter a payload (a box's content, an `Answer:` value) names.

Every helper is a pure function of its arguments: no I/O, no state. Extractors return `str | None`, where None means
"nothing found" and is never replaced by `""`. All of them run in time linear in the input (no regex here can
backtrack catastrophically), so a 1 MB completion cannot stall a server.

Contents:
    - `choice_letter`: the option letter a payload names, rejecting hedges such as "A or B".
    - `option_label`: the option label a payload starts with ("(B) ...", "C: ...").
    - `is_letter_word`: whether a one-letter token is the English word "A" / "I" rather than an option.
    - `match_option_text`: the option letter whose text a payload spells out.
    - `normalize_letter`: an option letter in another script (full-width, Arabic, Bengali) as its ASCII capital.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from gymfleet.grading.answers import normalize
from gymfleet.grading.latex import unwrap_latex_text

__all__ = [
    "choice_letter",
    "is_letter_word",
    "match_option_text",
    "normalize_letter",
    "option_label",
]

# ---------------------------------------------------------------------------------------------- script letters

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


# ---------------------------------------------------------------------------------------------- option letters

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
