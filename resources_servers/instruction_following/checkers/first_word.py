"""`first_word:*`: the first word of every sentence, or of the response.

Words are whitespace tokens compared ignoring case, with punctuation kept (`Cat,` is not `cat`).
"""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text


def _first_word(kwargs: Kwargs) -> str:
    value = kwargs.values.get("first_word")
    if value and not isinstance(value, str):
        # The reference mishandles a non-string first word (it never unwraps it) and then always fails.
        raise NotFollowed(f"first_word must be a string, got {value!r}")
    return kwargs.string("first_word").lower()


class FirstWordSent(Checker):
    """Every rule-splitter sentence starts with `first_word`; an empty sentence fails, no sentence at all passes."""

    kwargs = ("first_word",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.first_word = _first_word(kwargs)

    def check(self, text: Text) -> bool:
        for sentence in text.rule_sentences:
            words = sentence.split()
            if not words or words[0].lower() != self.first_word:
                return False
        return True


class FirstWordAnswer(Checker):
    """The response's first whitespace token is `first_word`; a blank response fails."""

    kwargs = ("first_word",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.first_word = _first_word(kwargs)

    def check(self, text: Text) -> bool:
        return bool(text.tokens) and text.tokens[0].lower() == self.first_word
