"""`count:*`: counts over words and sentences (lower-case words, composition, uniqueness, increments)."""

from __future__ import annotations

import re

from gymfleet.grading import text as textlib
from resources_servers.instruction_following.checkers.base import (
    DIVIDER,
    Checker,
    Kwargs,
    Text,
    compile_pattern,
    count_matches,
)

_LOWERCASE_WORD = re.compile(r"\b[a-z]+\b")  # "don't" holds two ("don", "t"); "café" holds none


class LowercaseCounting(Checker):
    """At most `N` all-lowercase ASCII words **in total** (not per word, as the instruction text suggests)."""

    kwargs = ("N",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.limit = kwargs.count("N")

    def check(self, text: Text) -> bool:
        return count_matches(_LOWERCASE_WORD, text.raw) <= self.limit


class CountingComposition(Checker):
    """Three paragraphs divided by `***`, each of `n_sent` sentences of `n_words` words.

    Sentences come from the rule splitter; words are NLTK tokens, so punctuation counts (`The cat sat.` has 4). A
    leading or trailing divider fails, and the spaced `* * *` the instruction text shows does not divide.
    """

    kwargs = ("n_sent", "n_words")

    def __init__(self, kwargs: Kwargs) -> None:
        self.sentences = kwargs.count("n_sent")
        self.words = kwargs.count("n_words")

    def _paragraph_ok(self, paragraph: str) -> bool:
        sentences = textlib.rule_sentences(paragraph)
        return len(sentences) == self.sentences and all(
            len(textlib.nltk_words(sentence)) == self.words for sentence in sentences
        )

    def check(self, text: Text) -> bool:
        paragraphs = DIVIDER.split(text.raw)
        return len(paragraphs) == 3 and all(self._paragraph_ok(paragraph) for paragraph in paragraphs)


class CountUnique(Checker):
    """No NLTK token repeats (exact comparison: two commas repeat, `Hello hello` does not)."""

    def check(self, text: Text) -> bool:
        seen: set[str] = set()
        for word in text.nltk_words:
            if word in seen:
                return False
            seen.add(word)
        return True


class CountIncrementWord(Checker):
    """`keyword1` matches exactly once and `keyword2` exactly twice (case-insensitive patterns)."""

    kwargs = ("keyword1", "keyword2")

    def __init__(self, kwargs: Kwargs) -> None:
        self.once = compile_pattern(kwargs.string("keyword1"), re.IGNORECASE)
        self.twice = compile_pattern(kwargs.string("keyword2"), re.IGNORECASE)

    def check(self, text: Text) -> bool:
        return count_matches(self.once, text.raw) == 1 and count_matches(self.twice, text.raw) == 2
