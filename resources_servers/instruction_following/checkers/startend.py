"""`startend:*`: how the response ends, or that it is wrapped in double quotes."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, Text


class EndChecker(Checker):
    """The response ends with `end_phrase`, ignoring case, surrounding whitespace and surrounding `"` characters.

    Quotes are stripped from the response only, so a phrase ending in `"` can never match; an empty phrase always
    matches.
    """

    kwargs = ("end_phrase",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.phrase = kwargs.string("end_phrase", falsy_is_absent=False).lower()

    def check(self, text: Text) -> bool:
        return text.raw.strip().strip('"').lower().endswith(self.phrase)


class Quotation(Checker):
    """The stripped response is at least two characters, opening and closing with an ASCII `"` (not curly quotes)."""

    def check(self, text: Text) -> bool:
        stripped = text.raw.strip()
        return len(stripped) > 1 and stripped[0] == stripped[-1] == '"'
