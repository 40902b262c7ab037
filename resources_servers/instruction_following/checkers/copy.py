"""`copy:*`: repeat a text verbatim, several times, or repeat a phrase with one word changed."""

from __future__ import annotations

import bisect
import re

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text, compile_pattern

SEPARATOR = "******"
_NEWLINE = re.compile("\n")


class Copy(Checker):
    """The response is `prompt_to_repeat` (both stripped and lower-cased), nothing more."""

    kwargs = ("prompt_to_repeat",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.prompt = kwargs.string("prompt_to_repeat").lower()

    def check(self, text: Text) -> bool:
        return text.raw.strip().lower() == self.prompt


class CopyingMultiple(Checker):
    """`N` copies of `prompt_to_repeat` separated by `******` (a trailing separator adds an empty copy and fails)."""

    kwargs = ("prompt_to_repeat", "N")

    def __init__(self, kwargs: Kwargs) -> None:
        self.prompt = kwargs.string("prompt_to_repeat").lower()
        self.copies = kwargs.count("N")

    def check(self, text: Text) -> bool:
        pieces = text.raw.split(SEPARATOR)
        return len(pieces) == self.copies and all(piece.strip().lower() == self.prompt for piece in pieces)


class RepeatPhrase(Checker):
    """`phrase` is repeated `small_n` times, each repetition changing one word.

    A repetition is a stretch on one line from the phrase's first word to the nearest following occurrence of its
    last word (both case-sensitive, used as patterns, each separated by a space from the stretch between). There
    must be exactly `small_n` non-overlapping stretches, each with the phrase's number of whitespace tokens and at
    most one token different; the **last** one must differ in exactly one (reference quirk: an unchanged earlier
    copy passes, an unchanged last copy fails). Unrelated text can be swallowed into a stretch (a preceding sentence
    that starts with `The`), which then fails the token count.
    """

    kwargs = ("phrase", "small_n")

    def __init__(self, kwargs: Kwargs) -> None:
        self.words = kwargs.string("phrase").split()
        if not self.words:
            raise NotFollowed("phrase is blank")
        self.small_n = kwargs.count("small_n")
        # Zero-width lookaheads report every position where the first word (followed by a space) or a space and the
        # last word start; _stretches pairs them in O(n log n), where the reference's `first .*? last` regex would
        # rescan the line from every start.
        self.starts = compile_pattern(f"(?=({self.words[0]}) )")
        self.ends = compile_pattern(f"(?= ({self.words[-1]}))")

    def _stretches(self, raw: str) -> list[str]:
        ends = [(match.start(), match.start() + 1 + len(match.group(1))) for match in self.ends.finditer(raw)]
        end_starts = [start for start, _ in ends]
        newlines = [match.start() for match in _NEWLINE.finditer(raw)]
        found, resume = [], 0
        for match in self.starts.finditer(raw):
            start = match.start()
            if start < resume:
                continue
            middle = start + len(match.group(1)) + 1
            index = bisect.bisect_left(end_starts, middle)
            if index == len(ends):
                continue
            space, end = ends[index]
            newline = bisect.bisect_left(newlines, middle)
            if newline < len(newlines) and newlines[newline] < space:
                continue  # the stretch would cross a line feed
            found.append(raw[start:end])
            resume = end
        return found

    def check(self, text: Text) -> bool:
        stretches = self._stretches(text.raw)
        if len(stretches) != self.small_n:
            return False
        changed = 0
        for stretch in stretches:
            tokens = stretch.split()
            if len(tokens) != len(self.words):
                return False
            changed = sum(1 for token, word in zip(tokens, self.words, strict=True) if token != word)
            if changed > 1:
                return False
        return changed == 1
