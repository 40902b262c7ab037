"""`detectable_content:*`: placeholders in square brackets, and a postscript."""

from __future__ import annotations

import re

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text


def count_bracket_groups(text: str) -> int:
    """Non-overlapping `[...]` groups on one line, each closed by the first `]` after its `[` (`[]` counts).

    Equivalent to counting the regex `\\[.*?\\]`, in linear time: the regex rescans to the end of the line from every
    unmatched `[`, which is quadratic on a long line of `[`.
    """
    count = 0
    for line in text.split("\n"):
        position = 0
        while (start := line.find("[", position)) != -1:
            end = line.find("]", start + 1)
            if end == -1:
                break
            count += 1
            position = end + 1
    return count


class NumberPlaceholders(Checker):
    """At least `num_placeholders` bracket groups such as `[address]` (markdown link text counts too)."""

    kwargs = ("num_placeholders",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.num_placeholders = kwargs.threshold("num_placeholders")

    def check(self, text: Text) -> bool:
        return count_bracket_groups(text.raw) >= self.num_placeholders


# "P.S." accepts "p.s." and "p. s." anywhere (not only at a line start; "P.S" without its final dot fails);
# "P.P.S" accepts "p.p.s", "p. p. s".
_STANDARD_MARKERS = {"P.P.S": re.compile(r"p\.\s?p\.\s?s"), "P.S.": re.compile(r"p\.\s?s\.")}


class Postscript(Checker):
    """The lower-cased response contains the postscript marker anywhere (it need not end the response).

    `P.S.` and `P.P.S` tolerate one whitespace character after each dot; any other marker is searched as a
    lower-cased regular expression (`.` matches any character), and an empty marker always matches.
    """

    kwargs = ("postscript_marker",)

    def __init__(self, kwargs: Kwargs) -> None:
        marker = kwargs.string("postscript_marker", falsy_is_absent=False)
        if marker in _STANDARD_MARKERS:
            self.pattern = _STANDARD_MARKERS[marker]
        else:
            try:
                self.pattern = re.compile(marker.lower(), re.MULTILINE)
            except re.error as exc:
                raise NotFollowed(f"invalid postscript_marker {marker!r}: {exc}") from exc

    def check(self, text: Text) -> bool:
        return self.pattern.search(text.lower) is not None
