"""Grading: which text is graded, configuring the row's checkers, and turning verdicts into a reward.

Pure functions of (row, response), so they are table-tested without a server; `app.py` adapts them to /verify.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from gymfleet.wire import Response
from resources_servers.instruction_following import registry
from resources_servers.instruction_following.checkers.base import Checker, NotFollowed, Text

log = logging.getLogger(__name__)

GradingMode = Literal["binary", "fraction"]


def graded_text(response: Response) -> str | None:
    """The text NeMo-Gym grades: the first content part of the **last** output item, unmodified.

    No stripping and no removal of reasoning or think tags. An empty output, or a last item without a non-empty
    `content` list (a function call, a message with no parts), gives the empty string. If the last item is a
    reasoning item with content, its first reasoning text is graded.

    Returns:
        The text, or None when that first part has no text (a refusal part): every instruction then counts as not
        followed. The reference fails the whole verify call there; we score it instead.
    """
    if not response.output:
        return ""
    content = getattr(response.output[-1], "content", None)
    if not isinstance(content, list) or not content:
        return ""
    part = content[0]
    text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
    return text if isinstance(text, str) else None


def build_checkers(instruction_ids: list[str], kwargs: list[dict[str, Any] | None]) -> list[Checker | None]:
    """Configure one checker per (id, kwargs) pair, stopping at the shorter list (as the reference does).

    Returns:
        A checker per pair, or None where the reference rejects the kwargs whatever the response (not followed).

    Raises:
        RowError: Naming the position and id of the first pair that cannot be graded deterministically.
    """
    checkers: list[Checker | None] = []
    for instruction_id, instruction_kwargs in zip(instruction_ids, kwargs, strict=False):
        try:
            checkers.append(registry.build(instruction_id, instruction_kwargs))
        except NotFollowed as reason:
            log.info("instruction %r can never be followed: %s", instruction_id, reason)
            checkers.append(None)
    return checkers


def follow_list(checkers: list[Checker | None], text: str | None) -> list[bool]:
    """Each instruction's verdict on `text` (all False when `text` is None)."""
    if text is None:
        return [False] * len(checkers)
    graded = Text(text)
    return [checker is not None and checker.check(graded) for checker in checkers]


def reward(follows: list[bool], grading_mode: GradingMode) -> float:
    """The reward: `binary` is 1.0 iff every instruction is followed (1.0 for none), `fraction` the share followed.

    `fraction` gives 0.0 for an empty list.
    """
    if grading_mode == "binary":
        return float(all(follows))
    return sum(follows) / len(follows) if follows else 0.0
