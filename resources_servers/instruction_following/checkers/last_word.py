"""`last_word:*`: the last word of every sentence, or of the response.

The last whitespace token loses every character that is neither a word character nor whitespace (`**cat**.` gives
`cat`, `cat's` gives `cats`), then is compared with the expected word ignoring case.
"""

from __future__ import annotations

import re

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text

_NOT_WORD = re.compile(r"[^\w\s]")  # "cat." -> "cat"; the expected word itself is not cleaned


def _cleaned(token: str) -> str:
    return _NOT_WORD.sub("", token).lower()


class LastWordSent(Checker):
    """Every rule-splitter sentence ends with `last_word` (a list gives its first element); no sentence passes."""

    kwargs = ("last_word",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.last_word = kwargs.string_or_first("last_word").lower()

    def check(self, text: Text) -> bool:
        for sentence in text.rule_sentences:
            words = sentence.split()
            if not words or _cleaned(words[-1]) != self.last_word:
                return False
        return True


class LastWordAnswer(Checker):
    """The response's last whitespace token is `last_word`; an empty response fails."""

    kwargs = ("last_word",)

    def __init__(self, kwargs: Kwargs) -> None:
        value = kwargs.values.get("last_word")
        if value and not isinstance(value, str):
            raise NotFollowed(f"last_word must be a string, got {value!r}")
        self.last_word = kwargs.string("last_word").lower()

    def check(self, text: Text) -> bool:
        return bool(text.tokens) and _cleaned(text.tokens[-1]) == self.last_word
