"""`length_constraints:*`: how many sentences, words or paragraphs, and how a paragraph starts."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import (
    DIVIDER,
    Checker,
    CountChecker,
    Kwargs,
    NotFollowed,
    Text,
    count_pieces,
)


class NumberSentences(CountChecker):
    """The Punkt sentence count compares by `relation` with `num_sentences` (line breaks do not end sentences)."""

    kwargs = ("num_sentences", "relation")
    threshold_kwarg = "num_sentences"

    def count(self, text: Text) -> int:
        return len(text.punkt_sentences)


class NumberWords(CountChecker):
    """The word count (runs of word characters: `don't` is 2) compares by `relation` with `num_words`."""

    kwargs = ("num_words", "relation")
    threshold_kwarg = "num_words"

    def count(self, text: Text) -> int:
        return text.word_count


class NumberParagraphs(Checker):
    """Exactly `num_paragraphs` paragraphs separated by `***` dividers.

    A divider before the first or after the last paragraph is tolerated; two dividers in a row (an empty paragraph
    between) fail. `***` inside `***bold italic***` divides too.
    """

    kwargs = ("num_paragraphs",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.num_paragraphs = kwargs.threshold("num_paragraphs")

    def check(self, text: Text) -> bool:
        count = count_pieces(DIVIDER.split(text.raw))
        return count is not None and count == self.num_paragraphs


# Characters that end the first word of a paragraph (`"Second's,` gives `second`).
_WORD_END = frozenset(".,?!'\"")


class NthParagraphFirstWord(Checker):
    """Exactly `num_paragraphs` paragraphs (split on blank lines), paragraph `nth_paragraph` starting `first_word`.

    Paragraphs are separated by the exact two characters `\\n\\n`; empty pieces (from three or more line feeds, or a
    leading blank line pair) are not counted but still take a position, so they shift `nth_paragraph`. The first
    word loses leading `'` then `"` characters, ends before the first of `. , ? ! ' "`, and is lower-cased;
    markdown is kept (`**Second**` is not `second`).
    """

    kwargs = ("num_paragraphs", "nth_paragraph", "first_word")

    def __init__(self, kwargs: Kwargs) -> None:
        self.num_paragraphs = kwargs.threshold("num_paragraphs")
        nth = kwargs.number("nth_paragraph")
        if nth <= 0 or nth > self.num_paragraphs:
            raise kwargs.missing("nth_paragraph", f"outside 1..num_paragraphs ({nth})")
        if not isinstance(nth, int):
            raise NotFollowed(f"nth_paragraph is used as an index and must be an integer, got {nth!r}")
        self.nth = nth
        self.first_word = kwargs.string("first_word", strip=False, falsy_is_absent=False).lower()

    def check(self, text: Text) -> bool:
        pieces = text.raw.split("\n\n")
        count = sum(1 for piece in pieces if piece.strip())
        if self.nth > count:
            return False
        paragraph = pieces[self.nth - 1].strip()
        if not paragraph:
            return False
        word = paragraph.split()[0].lstrip("'").lstrip('"')
        end = next((index for index, char in enumerate(word) if char in _WORD_END), len(word))
        return count == self.num_paragraphs and word[:end].lower() == self.first_word
