"""`letters:*`: how many letters the response has (`letter_counting2` is `keywords:letter_frequency`)."""

from __future__ import annotations

import string

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, Text, compare


class LetterCounting(Checker):
    """The number of ASCII letters (A-Z, a-z) compares by `relation` with `N`."""

    kwargs = ("N", "relation")

    def __init__(self, kwargs: Kwargs) -> None:
        self.letters = kwargs.count("N")
        self.relation = kwargs.relation("relation", validated=False)

    def check(self, text: Text) -> bool:
        return compare(sum(map(text.raw.count, string.ascii_letters)), self.relation, self.letters)
