"""`combination:*`: two different responses, or the prompt repeated before the answer."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, Text

SEPARATOR = "******"


class TwoResponses(Checker):
    """Exactly two non-blank responses separated by `******`, different once stripped.

    A leading or trailing separator is tolerated; an empty response between two separators fails. Seven asterisks
    still separate (the extra `*` stays in a response).
    """

    def check(self, text: Text) -> bool:
        pieces = text.raw.split(SEPARATOR)
        responses = []
        for index, piece in enumerate(pieces):
            if piece.strip():
                responses.append(piece.strip())
            elif index not in (0, len(pieces) - 1):
                return False
        return len(responses) == 2 and responses[0] != responses[1]


class RepeatPrompt(Checker):
    """The response starts with `prompt_to_repeat` (both stripped and lower-cased)."""

    kwargs = ("prompt_to_repeat",)

    def __init__(self, kwargs: Kwargs) -> None:
        self.prompt = kwargs.string("prompt_to_repeat").lower()

    def check(self, text: Text) -> bool:
        return text.raw.strip().lower().startswith(self.prompt)
