"""`keywords:*`: words that must, must not, or must so often appear.

Keywords are regular expressions searched case-insensitively with substring semantics (`cat` is found in
`concatenate`, `a.b` matches `axb`), as in the reference; only `forbidden_words` adds word boundaries.
"""

from __future__ import annotations

import re

from gymfleet.grading import text as textlib
from resources_servers.instruction_following.checkers.base import (
    Checker,
    CountChecker,
    Kwargs,
    NotFollowed,
    Text,
    compile_pattern,
    count_matches,
)


class Existence(Checker):
    """`keywords`: every keyword occurs. A plain string is taken letter by letter (reference quirk)."""

    kwargs = ("keywords",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.patterns = [compile_pattern(keyword, re.IGNORECASE) for keyword in kwargs.strings("keywords")]

    def check(self, text: Text) -> bool:
        return all(pattern.search(text.raw) for pattern in self.patterns)


class Frequency(CountChecker):
    """`keyword` occurs (matches counted) `relation` ("less than" / "at least") `frequency` times."""

    kwargs = ("keyword", "frequency", "relation")
    threshold_kwarg = "frequency"

    def __init__(self, kwargs: Kwargs) -> None:
        self.pattern = compile_pattern(kwargs.string("keyword"), re.IGNORECASE)
        super().__init__(kwargs)

    def count(self, text: Text) -> int:
        return count_matches(self.pattern, text.raw)


class ForbiddenWords(Checker):
    """None of `forbidden_words` occurs between word boundaries (`cat` is not found in `concatenate`)."""

    kwargs = ("forbidden_words",)

    def __init__(self, kwargs: Kwargs) -> None:
        words = kwargs.strings("forbidden_words")
        if not all(isinstance(word, str) for word in words):
            raise NotFollowed(f"forbidden_words must be strings, got {words!r}")
        self.patterns = [compile_pattern(rf"\b{word}\b", re.IGNORECASE) for word in dict.fromkeys(words)]

    def check(self, text: Text) -> bool:
        return not any(pattern.search(text.raw) for pattern in self.patterns)


class LetterFrequency(CountChecker):
    """The lower-cased response holds `letter` `let_relation` `let_frequency` times (letters inside words count)."""

    kwargs = ("letter", "let_frequency", "let_relation")
    threshold_kwarg = "let_frequency"
    relation_kwarg = "let_relation"

    def __init__(self, kwargs: Kwargs) -> None:
        letter = kwargs.values.get("letter")
        if letter is not None and not isinstance(letter, str):
            raise NotFollowed(f"kwarg 'letter' must be a string, got {letter!r}")
        if not letter or len(letter) != 1:
            raise kwargs.missing("letter", "not a single letter" if letter else "absent")
        self.letter = letter.lower()
        if len(self.letter) != 1:  # "İ" lower-cases to two characters: the reference fails on it
            raise NotFollowed(f"letter {letter!r} lower-cases to {self.letter!r}")
        if not "a" <= self.letter <= "z":
            raise kwargs.missing("letter", f"not an ASCII letter ({letter!r})")
        super().__init__(kwargs)

    def count(self, text: Text) -> int:
        return text.lower.count(self.letter)


class WordOnce(Checker):
    """`keyword` matches exactly once."""

    kwargs = ("keyword",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.pattern = compile_pattern(kwargs.string("keyword"), re.IGNORECASE)

    def check(self, text: Text) -> bool:
        return count_matches(self.pattern, text.raw) == 1


class ExcludeWordHarder(Checker):
    """`keyword` never appears as " keyword " (space-delimited, case-sensitive: `cat.` or `Cat` go undetected).

    `instruction` is accepted only because the reference draws the keyword from it when `keyword` is absent; we
    require `keyword`.
    """

    kwargs = ("keyword", "instruction")

    def __init__(self, kwargs: Kwargs) -> None:
        self.needle = f" {kwargs.string('keyword')} "

    def check(self, text: Text) -> bool:
        return self.needle not in text.raw


class NoAdjacentConsecutive(Checker):
    """No two adjacent whitespace tokens start with consecutive characters (`a` then `b`, also `1` then `2`).

    Only the forward direction counts (`b a` passes); a first character that lower-cases to two characters fails.
    """

    def check(self, text: Text) -> bool:
        firsts = [token[0].lower() for token in text.tokens]
        if any(len(first) != 1 for first in firsts):
            return False
        return not any(ord(second) - ord(first) == 1 for first, second in zip(firsts, firsts[1:], strict=False))


class Palindrome(Checker):
    """Some whitespace token reads the same reversed (case and punctuation kept; any one-character token counts)."""

    def check(self, text: Text) -> bool:
        return any(token == token[::-1] for token in text.tokens)


class KeywordSpecificPosition(Checker):
    """Word `m` of sentence `n` is exactly `keyword` (1-based, case-sensitive).

    Sentences come from the rule splitter; words are NLTK tokens of that sentence, so punctuation and contraction
    pieces count (`I don't know.` has `n't` as word 3).
    """

    kwargs = ("keyword", "n", "m")

    def __init__(self, kwargs: Kwargs) -> None:
        self.keyword = kwargs.string_or_first("keyword")
        self.n = kwargs.index("n")
        self.m = kwargs.index("m")

    def check(self, text: Text) -> bool:
        sentences = text.rule_sentences
        if len(sentences) < self.n:
            return False
        try:
            words = textlib.nltk_words(sentences[self.n - 1])
            return len(words) >= self.m and words[self.m - 1] == self.keyword
        except IndexError:  # a negative position past the start
            return False


class StartEnd(Checker):
    """The first and last NLTK tokens are equal ignoring case (a final period is its own last token)."""

    def check(self, text: Text) -> bool:
        words = text.nltk_words
        return len(words) >= 2 and words[0].lower() == words[-1].lower()
