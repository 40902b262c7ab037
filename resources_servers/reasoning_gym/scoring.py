r"""reasoning_gym grading: pull the answer out of the model's text and score it with the task's own scorer.

Extraction (NeMo-Gym's order): the last `<answer>...</answer>` pair (stripped; an empty pair is the answer ""),
else the first `\boxed{...}` whose content has no `}` (stripped), else the whole text (stripped). All three steps run
in linear time, unlike the lazy regexes they mirror, which rescan the text once per unclosed opening.

Scoring: `reasoning_gym.get_score_answer_fn(task)(answer=..., entry={question, answer, metadata})`, the task's own
`score_answer` built on its default config (cached per task). A scorer that raises scores 0.0, as in NeMo-Gym:
scorers raise on answers they cannot read, which is the model's fault. Scorers are CPU-bound Python and some (the
sympy-based ones) slow down sharply with input size, so answers longer than the cap are not scored at all (0.0).

Import: reasoning-gym imports every task module up front (sympy among them: about a second and a half of CPU), so
it is imported on first use (`load`: the server does it in the background once it is up), and the names of its
tasks, which every row is checked against, come from gymfleet's cache folder, keyed by reasoning-gym's version
(`tasks`; written by the first process that imports it, rewritten by one that finds it out of date). Its
`game_of_life` tasks import `cellpylib`, which imports `matplotlib.pyplot` (about half of reasoning-gym's import
time, and memory in every fleet that serves it): `cellpylib` is deferred (`gymfleet.grading.deferred.defer_module`)
and loads only when something generates such a board; no scorer uses it.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import math
import os
import threading
from collections.abc import Callable
from functools import cache
from typing import Any

from gymfleet.fleet.cache import cache_dir
from gymfleet.grading import answers
from gymfleet.grading.deferred import defer_module

defer_module("cellpylib")  # before reasoning_gym, whose game_of_life tasks import it (and with it matplotlib.pyplot)

log = logging.getLogger(__name__)

_known_tasks: frozenset[str] | None = None


_loading = threading.Lock()
"""One import of reasoning-gym at a time: the server's warm-up imports it in a thread while a request's validation
may need the task names (`tasks`) on a machine with no cache yet. Two threads importing it at once can leave one of
them with the package half imported (Python's import locks give a thread a module still being initialised where
they see a deadlock), so the names it read would be a part of the tasks, cached for every later start (the likely
cause of one full-suite run refusing `knights_knaves`, a task this version has)."""


def load() -> frozenset[str]:
    """Import reasoning-gym (every task module) and return the task names it registered; the cached names are
    corrected if they differ."""
    global _known_tasks
    with _loading:  # a second caller waits for the first one's import, then reads the same names
        from reasoning_gym.factory import DATASETS

        registered = frozenset(DATASETS)
        if _read_cache() != registered:
            _write_cache(registered)
        _known_tasks = registered
        return registered


def tasks() -> frozenset[str]:
    """Task names reasoning-gym has registered (a row's `metadata.source_dataset` must be one of them): from the
    cache when it holds this version's, else by importing reasoning-gym (`load`)."""
    global _known_tasks
    if _known_tasks is None:
        _known_tasks = _read_cache() or load()
    return _known_tasks


def _cache_path() -> Any:
    return cache_dir() / f"reasoning-gym-{importlib.metadata.version('reasoning-gym')}-tasks.json"


def _read_cache() -> frozenset[str] | None:
    try:
        names = json.loads(_cache_path().read_text())
    except (OSError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        return None
    return frozenset(names)


def _write_cache(names: frozenset[str]) -> None:
    try:
        path = _cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(sorted(names)))
        os.replace(temporary, path)
    except (OSError, importlib.metadata.PackageNotFoundError) as exc:  # best effort: the next start imports again
        log.debug("could not cache reasoning-gym's task names: %s", exc)


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
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def score(task: str, answer: str, entry: dict[str, Any]) -> float:
    """The task scorer's verdict on `answer`; 0.0 when it raises or returns something that is not a finite number."""
    try:
        value = float(scorer(task)(answer=answer, entry=entry))
    except Exception as error:  # third-party scorers raise anything on unreadable answers (model fault)
        log.debug("reasoning-gym scorer for %s raised %s: %s", task, type(error).__name__, error)
        return 0.0
    return value if math.isfinite(value) else 0.0
