"""`detectable_format:*`: markdown and layout conventions (bullets, highlights, sections, JSON, titles, wrappers)."""

from __future__ import annotations

import json
import re

from gymfleet.grading import text as textlib
from resources_servers.instruction_following.checkers.base import Checker, Kwargs, NotFollowed, Text

_SPACE_RUN = re.compile(r"\s*")


def _count_line_items(text: str, marker: str) -> int:
    """Count the lines that start (after optional whitespace) with a bullet `marker`, as the reference's regexes do.

    The reference counts non-overlapping matches of `^\\s*\\*[^*].*$` (star bullets) and `^\\s*-.*$` (dash bullets) in
    multi-line mode. Their leading `\\s*` may run across blank lines, and a star's one non-star character may be a
    line feed, so a match can end on the next line. This scan reproduces those matches in linear time: the regexes
    rescan a whitespace run from every line start inside it, which is quadratic on a megabyte of line feeds.
    """
    count, start, size = 0, 0, len(text)
    while start < size:
        first = _SPACE_RUN.match(text, start).end()  # every line start inside this run reaches the same character
        if marker == "*":
            matched = text.startswith("*", first) and first + 1 < size and text[first + 1] != "*"
            rest = first + 2
        else:
            matched = text.startswith("-", first)
            rest = first + 1
        if matched:
            count += 1
            end = text.find("\n", rest)
            if end == -1:
                break
            # The match stops before this line feed; if it consumed one just before (a lone "*" line followed by an
            # empty line), the next line already starts here.
            start = end if text[end - 1] == "\n" else end + 1
        else:
            newline = text.find("\n", first)
            if newline == -1:
                break
            start = newline + 1
    return count


class NumberBulletLists(Checker):
    """Exactly `num_bullets` bullet lines: `*` then a non-`*` character, or `-` (so `---` rules count too).

    `+`, `•` and numbered items do not count; neither does a line starting with `**bold**`.
    """

    kwargs = ("num_bullets",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.num_bullets = kwargs.threshold("num_bullets")

    def check(self, text: Text) -> bool:
        return _count_line_items(text.raw, "*") + _count_line_items(text.raw, "-") == self.num_bullets


_ANSWERS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


class ConstrainedResponse(Checker):
    """The response contains one of `My answer is yes.` / `no.` / `maybe.` (case-sensitive, period included)."""

    def check(self, text: Text) -> bool:
        stripped = text.raw.strip()
        return any(answer in stripped for answer in _ANSWERS)


# Linear: each "*" (or "**") start scans only to the next "*" or line feed.
_ITALIC = re.compile(r"\*[^\n*]*\*")  # "*word*"; "* a\n* b" never matches across the line feed
_BOLD = re.compile(r"\*\*[^\n*]*\*\*")  # "**word**"


class NumberHighlightedSections(Checker):
    """At least `num_highlights` highlighted spans.

    Spans are counted twice over: every `*text*` (non-empty once asterisks and spaces are stripped) plus every
    `**text**`. So `*x*` and `**x**` count 1, `***x***` counts 2, and two star bullets on one line count 1.
    """

    kwargs = ("num_highlights",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.num_highlights = kwargs.threshold("num_highlights")

    def check(self, text: Text) -> bool:
        italic = sum(1 for match in _ITALIC.finditer(text.raw) if match.group().strip("*").strip())
        bold = sum(1 for match in _BOLD.finditer(text.raw) if match.group()[2:-2].strip())
        return italic + bold >= self.num_highlights


class MultipleSections(Checker):
    """At least `num_sections` section headers: `section_spliter` (a case-sensitive pattern) then a number.

    `SECTION X` does not count, `Section 1` does not satisfy `SECTION`, `SUBSECTION 2` does.
    """

    kwargs = ("section_spliter", "num_sections")

    def __init__(self, kwargs: Kwargs) -> None:
        spliter = kwargs.string("section_spliter", falsy_is_absent=False)
        try:
            self.pattern = re.compile(rf"\s?{spliter}\s?\d+\s?")
        except re.error as exc:
            raise NotFollowed(f"invalid section_spliter {spliter!r}: {exc}") from exc
        self.num_sections = kwargs.threshold("num_sections")

    def check(self, text: Text) -> bool:
        return len(self.pattern.split(text.raw)) - 1 >= self.num_sections


class JsonFormat(Checker):
    """The response, once stripped of one optional code fence (plain, json, Json or JSON), parses as JSON.

    Any JSON value passes, including a bare string, a number or `NaN`; a ```python fence or leading prose fails.
    """

    def check(self, text: Text) -> bool:
        value = text.raw.strip()
        for fence in ("```json", "```Json", "```JSON", "```"):
            value = value.removeprefix(fence)
        value = value.removesuffix("```").strip()
        try:
            json.loads(value)
        except (ValueError, RecursionError):
            return False
        return True


class Title(Checker):
    """Some line holds a title: `<<`, text, `>>` on one line (`<< >>` and a title broken across lines fail).

    The title is everything from the line's first `<<` to its last `>>`; it counts if anything besides `<`, `>` and
    whitespace is left once those are stripped from its ends.
    """

    def check(self, text: Text) -> bool:
        # Per line, the reference's greedy `<<[^\n]+>>` can only match from the first "<<" to the last ">>".
        for line in text.raw.split("\n"):
            start = line.find("<<")
            end = line.rfind(">>")
            if start != -1 and end >= start + 3 and line[start : end + 2].lstrip("<").rstrip(">").strip():
                return True
        return False


class SentenceHyphens(Checker):
    """Sentences are joined by hyphens with no spaces around them (`One.-Two?-Three.`).

    The text split at `-` must equal, piece by piece, the rule-splitter sentences of the text with hyphens turned
    into spaces, and no piece may have surrounding whitespace. A single sentence passes; so does the empty response;
    a hyphenated word (`well-known`) fails.
    """

    def check(self, text: Text) -> bool:
        sentences = textlib.rule_sentences(text.raw.replace("-", " "))
        pieces = text.raw.split("-")
        return all(piece == piece.strip() == sentence for piece, sentence in zip(pieces, sentences, strict=False))


class SquareBrackets(Checker):
    """Every whitespace token starts with `[` and ends with `]` (`[a] [b]` passes, `[a b]` fails)."""

    def check(self, text: Text) -> bool:
        return all(token.startswith("[") and token.endswith("]") for token in text.tokens)


class BigramWrapping(Checker):
    """Whitespace tokens pair up as `<<first second>>`: each even token starts with `<<`, the next ends with `>>`.

    A trailing unpaired token is not checked, and a pair's size is not checked (`<<I>> <<am>>` passes).
    """

    def check(self, text: Text) -> bool:
        tokens = text.tokens
        return all(
            tokens[index].startswith("<<") and tokens[index + 1].endswith(">>")
            for index in range(0, len(tokens) - 1, 2)
        )
