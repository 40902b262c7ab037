"""`paragraphs:*`: exactly two paragraphs, separated by a `***` divider or by a blank line."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import DIVIDER, Checker, Text, count_pieces


class TwoDividedParagraphs(Checker):
    """Exactly two paragraphs separated by `***` (the rule of `length_constraints:number_paragraphs`)."""

    def check(self, text: Text) -> bool:
        return count_pieces(DIVIDER.split(text.raw)) == 2


class TwoBlankLineParagraphs(Checker):
    """Exactly two paragraphs separated by `\\n\\n`; leading/trailing blank pieces are tolerated, inner ones fail.

    `a\\n\\n\\nb` passes (the second paragraph starts with a line feed); `a\\n\\n\\n\\nb` fails (an empty piece
    between).
    """

    def check(self, text: Text) -> bool:
        return count_pieces(text.raw.split("\n\n")) == 2
