"""`change_case:*`: capital letters, as words or as the whole response."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, Text, compare


class CapitalWordFrequency(Checker):
    """The count of all-capital NLTK tokens compares by `capital_relation` with `capital_frequency`.

    All-capital means Python's `isupper()`: `I`, `OK`, `U.S.`, `COVID-19`. A negative frequency is kept.
    """

    kwargs = ("capital_frequency", "capital_relation")

    def __init__(self, kwargs: Kwargs) -> None:
        self.frequency = kwargs.number("capital_frequency")
        self.relation = kwargs.relation("capital_relation")

    def check(self, text: Text) -> bool:
        capitals = sum(1 for word in text.nltk_words if word.isupper())
        return compare(capitals, self.relation, self.frequency)


class EnglishCapital(Checker):
    """The whole response is upper case and langdetect says English (or cannot tell).

    Upper case means Python's `isupper()`: at least one cased letter, none lower case, so `123` fails.
    """

    def check(self, text: Text) -> bool:
        return text.raw.isupper() and text.language in (None, "en")


class EnglishLowercase(Checker):
    """The whole response is lower case (`islower()`) and langdetect says English (or cannot tell)."""

    def check(self, text: Text) -> bool:
        return text.raw.islower() and text.language in (None, "en")
