"""What every checker shares: the graded `Text`, the `Kwargs` reader, and the two ways a row can be unusable.

A checker reads its kwargs in `__init__` (through `Kwargs`, which applies the reference's rules for absent, null and
invalid values) and decides in `check(text)`. Two outcomes besides a verdict:

- `RowError`: the reference would draw the value at random (absent kwargs, and the values it treats as absent), or
  the instruction id is unknown. We refuse to guess: the row is rejected with a 422 naming the instruction and
  kwarg.
- `NotFollowed`: the reference rejects the kwargs whatever the response (an unexpected key, a relation other than
  "less than"/"at least", a string where a number belongs, an invalid regex): the instruction counts as not
  followed, as there.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, ClassVar

from gymfleet.grading import text as textlib

LESS_THAN, AT_LEAST = "less than", "at least"
RELATIONS = (LESS_THAN, AT_LEAST)


class RowError(ValueError):
    """The row cannot be graded deterministically; answered with a 422."""


class NotFollowed(Exception):
    """These kwargs make the instruction unfollowable whatever the response."""


class Text:
    """The response text under grading, with each analysis computed once and shared by all its checkers."""

    def __init__(self, raw: str) -> None:
        self.raw = raw

    @cached_property
    def tokens(self) -> list[str]:
        """Whitespace-separated tokens (`str.split()`)."""
        return self.raw.split()

    @cached_property
    def lower(self) -> str:
        return self.raw.lower()

    @cached_property
    def rule_sentences(self) -> list[str]:
        """IFEval's regex-rule sentences (`gymfleet.grading.text.rule_sentences`)."""
        return textlib.rule_sentences(self.raw)

    @cached_property
    def punkt_sentences(self) -> list[str]:
        """NLTK Punkt sentences (`gymfleet.grading.text.punkt_sentences`)."""
        return textlib.punkt_sentences(self.raw)

    @cached_property
    def nltk_words(self) -> list[str]:
        """NLTK `word_tokenize` tokens (`gymfleet.grading.text.nltk_words`)."""
        return [word for sentence in self.punkt_sentences for word in textlib.treebank_words(sentence)]

    @cached_property
    def word_count(self) -> int:
        return textlib.word_count(self.raw)

    @cached_property
    def language(self) -> str | None:
        """langdetect's code, or None when it finds no features (the reference then counts the check followed)."""
        return textlib.detect_language(self.raw)


def is_number(value: Any) -> bool:
    """Whether `value` compares as a number (bool included, as in Python)."""
    return isinstance(value, int | float)


def compare(actual: float, relation: str, threshold: float) -> bool:
    """`actual < threshold` for "less than", else `actual >= threshold`."""
    return actual < threshold if relation == LESS_THAN else actual >= threshold


def compile_pattern(pattern: Any, flags: int = 0) -> re.Pattern[str]:
    """Compile a kwarg used as a regular expression; an invalid or non-string one makes the instruction fail."""
    try:
        return re.compile(pattern, flags)
    except (re.error, TypeError) as exc:
        raise NotFollowed(f"invalid pattern {pattern!r}: {exc}") from exc


def count_matches(pattern: re.Pattern[str], text: str) -> int:
    """Non-overlapping matches, left to right (`aa` occurs once in `aaa`)."""
    return sum(1 for _ in pattern.finditer(text))


# A markdown divider: three asterisks, each side optionally one whitespace character. "a *** b" splits; "* * *",
# "---" and "___" do not; "****" splits and leaves a "*" at the start of the next piece.
DIVIDER = re.compile(r"\s?\*\*\*\s?")


def count_pieces(pieces: list[str]) -> int | None:
    """Count the non-blank pieces of a split text; None if a blank piece sits between two others.

    A blank (empty or whitespace-only) first or last piece is not counted: a divider may open or close the text.
    """
    last = len(pieces) - 1
    count = 0
    for index, piece in enumerate(pieces):
        if piece.strip():
            count += 1
        elif index not in (0, last):
            return None
    return count


class Kwargs:
    """One instruction's kwargs, read with the reference's rules.

    Null values count as absent. A key the checker does not accept makes the instruction not followed. The readers
    raise `RowError` where the reference would draw a random value and `NotFollowed` where it always fails.
    """

    def __init__(self, instruction_id: str, values: dict[str, Any], accepted: tuple[str, ...]) -> None:
        self.instruction_id = instruction_id
        self.values = {key: value for key, value in values.items() if value is not None}
        unexpected = sorted(set(self.values) - set(accepted))
        if unexpected:
            raise NotFollowed(f"unexpected kwargs {unexpected}; {instruction_id!r} accepts {list(accepted)}")

    def missing(self, name: str, why: str = "absent") -> RowError:
        """The error for a kwarg the row must give (the reference would draw it at random, or fail)."""
        return RowError(
            f"instruction {self.instruction_id!r}: kwarg {name!r} is {why}; the row must give it (the reference "
            f"would draw a random value or fail, so the reward would mean nothing)"
        )

    def _number(self, name: str) -> float:
        value = self.values.get(name)
        if value is None:
            raise self.missing(name)
        if not is_number(value):
            raise NotFollowed(f"kwarg {name!r} must be a number, got {value!r}")
        return value

    def number(self, name: str) -> float:
        """A number; absent is random."""
        return self._number(name)

    def threshold(self, name: str) -> float:
        """A number; absent or negative is random, 0 is kept."""
        value = self._number(name)
        if value < 0:
            raise self.missing(name, f"negative ({value})")
        return value

    def count(self, name: str) -> float:
        """A number; absent or 0 is random (the reference tests it for truth)."""
        value = self._number(name)
        if not value:
            raise self.missing(name, "0")
        return value

    def index(self, name: str, *, zero_ok: bool = False) -> int:
        """An integer used as a position; absent (or 0 unless `zero_ok`) is random, a float always fails."""
        value = self._number(name)
        if not value and not zero_ok:
            raise self.missing(name, "0")
        if not isinstance(value, int):
            raise NotFollowed(f"kwarg {name!r} is used as an index and must be an integer, got {value!r}")
        return value

    def relation(self, name: str, *, validated: bool = True) -> str:
        """One of the two relations; absent (or falsy, when not `validated`) is random, anything else fails."""
        value = self.values.get(name)
        if value is None or (not validated and not value):
            raise self.missing(name)
        if value not in RELATIONS:
            raise NotFollowed(f"kwarg {name!r} must be one of {list(RELATIONS)}, got {value!r}")
        return value

    def string(self, name: str, *, strip: bool = True, falsy_is_absent: bool = True) -> str:
        """A string, stripped unless `strip` is false; absent (or falsy, by default) is random."""
        value = self.values.get(name)
        if value is None or (falsy_is_absent and not value):
            raise self.missing(name, "absent" if value is None else f"empty ({value!r})")
        if not isinstance(value, str):
            raise NotFollowed(f"kwarg {name!r} must be a string, got {value!r}")
        return value.strip() if strip else value

    def string_or_first(self, name: str) -> str:
        """A string, or the first element of a list of strings; stripped; falsy is random."""
        value = self.values.get(name)
        if not value:
            raise self.missing(name, "absent" if value is None else f"empty ({value!r})")
        if not isinstance(value, str):
            try:
                value = value[0]
            except (TypeError, KeyError, IndexError) as exc:
                raise NotFollowed(f"kwarg {name!r} must be a string or a list of strings, got {value!r}") from exc
            if not isinstance(value, str):
                raise NotFollowed(f"kwarg {name!r} must be a string or a list of strings, got {value!r}")
        return value.strip()

    def strings(self, name: str) -> list[Any]:
        """A list of strings; falsy is random; a plain string is taken character by character (reference quirk)."""
        value = self.values.get(name)
        if not value:
            raise self.missing(name, "absent" if value is None else f"empty ({value!r})")
        try:
            return list(value)
        except TypeError as exc:
            raise NotFollowed(f"kwarg {name!r} must be a list of strings, got {value!r}") from exc


class Checker:
    """One instruction: `kwargs` names what it accepts, `__init__` reads them, `check` decides."""

    kwargs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kwargs: Kwargs) -> None:
        """Read this checker's kwargs (none by default)."""

    def check(self, text: Text) -> bool:
        """Whether `text` follows the instruction."""
        raise NotImplementedError


class CountChecker(Checker):
    """A count of the response (`count`) compares by the relation kwarg `relation_kwarg` with the threshold kwarg
    `threshold_kwarg`."""

    threshold_kwarg: ClassVar[str]
    relation_kwarg: ClassVar[str] = "relation"

    def __init__(self, kwargs: Kwargs) -> None:
        self.threshold = kwargs.threshold(self.threshold_kwarg)
        self.relation = kwargs.relation(self.relation_kwarg)

    def count(self, text: Text) -> int:
        raise NotImplementedError

    def check(self, text: Text) -> bool:
        return compare(self.count(text), self.relation, self.threshold)
