r"""reasoning_gym grading: pull the answer out of the model's text and score it with the task's own scorer.

Extraction (NeMo-Gym's order): the last `<answer>...</answer>` pair (stripped; an empty pair is the answer ""),
else the first `\boxed{...}` whose content has no `}` (stripped), else the whole text (stripped). All three steps run
in linear time, unlike the lazy regexes they mirror, which rescan the text once per unclosed opening.

Scoring: `reasoning_gym.get_score_answer_fn(task)(answer=..., entry={question, answer, metadata})`, the task's own
`score_answer` built on its default config (cached per task). A scorer that raises scores 0.0, as in NeMo-Gym:
scorers raise on answers they cannot read, which is the model's fault. Scorers are CPU-bound Python and some (the
sympy-based ones) slow down sharply with input size, so answers longer than the cap are not scored at all (0.0).

Import: reasoning-gym imports every task module up front, and its `game_of_life` tasks import `cellpylib`, which
imports `matplotlib.pyplot` (about half of reasoning-gym's import time, and memory in every fleet that serves it):
`cellpylib` is deferred (`gymfleet.grading.deferred.defer_module`) and loads only when something generates such a
board; no scorer uses it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from functools import cache
from typing import Any

from gymfleet.grading import answers
from gymfleet.grading.deferred import defer_module

defer_module("cellpylib")  # before reasoning_gym, whose game_of_life tasks import it (and with it matplotlib.pyplot)

import reasoning_gym  # noqa: E402
from reasoning_gym.factory import DATASETS  # noqa: E402

log = logging.getLogger(__name__)

TASKS: frozenset[str] = frozenset(DATASETS)
"""Task names reasoning-gym has registered (a row's `metadata.source_dataset` must be one of them)."""


def first_plain_box(text: str) -> str | None:
    r"""The stripped content of the first `\boxed{...}` holding at least one character and no `}`.

    This is what `re.search(r"\\boxed\{([^}]+)\}", text)` finds: nested braces are not followed, so
    `\boxed{\frac{1}{2}}` gives `\frac{1`, as in NeMo-Gym.

    Examples:
        >>> first_plain_box(r"\boxed{} then \boxed{ 42 } then \boxed{7}")
        '42'
        >>> first_plain_box(r"\boxed{\frac{1}{2}}")
        '\\frac{1'
        >>> first_plain_box(r"\boxed{never closed") is None
        True
    """
    opening = "\\boxed{"
    pos = 0
    while (start := text.find(opening, pos)) != -1:
        content = start + len(opening)
        close = text.find("}", content)
        if close == -1:
            return None  # no later box can close either
        if close > content:
            return text[content:close].strip()
        pos = content
    return None


def extract_answer(text: str) -> str:
    r"""The answer a reasoning-gym scorer is given for the model's `text`.

    Examples:
        >>> extract_answer("Thinking... <answer>Zoey is a fool</answer>")
        'Zoey is a fool'
        >>> extract_answer(r"So the total is \boxed{48}.")
        '48'
        >>> extract_answer("  48  ")
        '48'
    """
    tagged = answers.last_tagged(text, "answer")
    if tagged is not None:
        return tagged
    boxed = first_plain_box(text)
    return boxed if boxed is not None else text.strip()


@cache
def scorer(task: str) -> Callable[..., Any]:
    """The task's `score_answer` (building a dataset object per call, as the package's helper does, is wasteful)."""
    return reasoning_gym.get_score_answer_fn(task)


def score(task: str, answer: str, entry: dict[str, Any]) -> float:
    """The task scorer's verdict on `answer`; 0.0 when it raises or returns something that is not a finite number."""
    try:
        value = float(scorer(task)(answer=answer, entry=entry))
    except Exception as error:  # third-party scorers raise anything on unreadable answers (model fault)
        log.debug("reasoning-gym scorer for %s raised %s: %s", task, type(error).__name__, error)
        return 0.0
    return value if math.isfinite(value) else 0.0
