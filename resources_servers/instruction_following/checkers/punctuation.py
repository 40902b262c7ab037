"""`punctuation:*`: a punctuation mark must not appear at all (ASCII marks only; `，` is not a comma here)."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Text


class NoComma(Checker):
    """No ASCII comma (U+002C) anywhere."""

    def check(self, text: Text) -> bool:
        return "," not in text.raw


class NoDot(Checker):
    """No ASCII full stop (U+002E) anywhere, decimals, URLs and ellipses included."""

    def check(self, text: Text) -> bool:
        return "." not in text.raw


class NoExclamation(Checker):
    """No ASCII exclamation mark (U+0021) anywhere."""

    def check(self, text: Text) -> bool:
        return "!" not in text.raw
