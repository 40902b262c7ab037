"""`new:copy_span_idx`: copy a span of the prompt given by character indices."""

from __future__ import annotations

from resources_servers.instruction_following.checkers.base import Checker, Kwargs, Text


class CopySpanIdx(Checker):
    """The response is `prompt_to_repeat[n_start:n_end]` (end **exclusive**), both stripped and lower-cased.

    The reference treats `n_start: 0` as absent and draws a random start, whose range includes 0; we take 0.
    """

    kwargs = ("prompt_to_repeat", "n_start", "n_end")

    def __init__(self, kwargs: Kwargs) -> None:
        prompt = kwargs.string("prompt_to_repeat", strip=False)
        start = kwargs.index("n_start", zero_ok=True)
        end = kwargs.index("n_end")
        self.span = prompt[start:end].strip().lower()

    def check(self, text: Text) -> bool:
        return text.raw.strip().lower() == self.span
