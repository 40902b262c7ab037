"""Token capture: `prompt_token_ids`, `generation_token_ids` and `generation_log_probs` of one completion.

Sources, first found wins:
1. the three fields already on `choices[0].message` (an upstream that captures itself, e.g. another gymfleet);
2. vLLM's `return_token_ids`: top-level `prompt_token_ids` and `choices[0].token_ids`, with logprobs from
   `choices[0].logprobs.content` (cross-checked against `token_id:<int>` names when the upstream gives them);
3. `choices[0].logprobs.content[i]` (`token: "token_id:<int>"`, `logprob`) for the generation, and the prompt
   from the upstream's `/tokenize` (the `tokenize` callable).

Whatever the source, the data is checked before anyone trains on it: integer ids, a non-empty prompt, finite
logprobs, as many logprobs as generated tokens. Anything else is an `UpstreamError` (HTTP 502,
`error_type: upstream_bad_token_data`), never silently wrong training data.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from operator import itemgetter, methodcaller
from typing import Any

from gymfleet.errors import UpstreamError
from gymfleet.wire import TOKEN_FIELDS

FAILURE_CLASS = "upstream_bad_token_data"
PREFIX = "token_id:"
"""How vLLM names a token by its id in a logprobs entry (`return_tokens_as_token_ids`)."""


def _bad(url: str, reason: str) -> UpstreamError:
    return UpstreamError(f"upstream {url}: {reason}", url=url, failure_class=FAILURE_CLASS)


async def capture_tokens(
    completion: dict[str, Any], tokenize: Callable[[], Awaitable[list[int]]], *, url: str
) -> dict[str, list]:
    """The three token fields of `completion`'s first choice, checked (see the module docstring)."""
    choice = completion["choices"][0]
    message = choice["message"]
    named: list[int] = []
    if all(message.get(name) is not None for name in TOKEN_FIELDS):
        fields = {name: message[name] for name in TOKEN_FIELDS}
    else:
        entries = (choice.get("logprobs") or {}).get("content")
        if not isinstance(entries, list):
            raise _bad(url, "answer has no choices[0].logprobs.content; is it vLLM started with logprobs enabled?")
        logprobs = _logprobs_of(entries)
        if completion.get("prompt_token_ids") is not None and choice.get("token_ids") is not None:
            generation = choice["token_ids"]
            named = _named_ids(entries)
            if named is None:
                named = [_token_id(entry, url) for entry in entries if str(entry.get("token", "")).startswith(PREFIX)]
            prompt = completion["prompt_token_ids"]
        else:
            generation = _named_ids(entries)
            if generation is None:
                generation = [_token_id(entry, url) for entry in entries]  # names the first entry that is not
            prompt = await tokenize()
        fields = dict(zip(TOKEN_FIELDS, (prompt, generation, logprobs), strict=True))
    _check(fields, url)
    if named and named != fields["generation_token_ids"]:
        raise _bad(url, "choices[0].token_ids disagree with the token ids named in the logprobs")
    return fields


def _logprobs_of(entries: list[Any]) -> list[Any]:
    """Each entry's `logprob` (None where an entry has none, or is not an object)."""
    try:  # in C where every entry has one: a completion has one entry per generated token
        return list(map(itemgetter("logprob"), entries))
    except (KeyError, TypeError):
        return [entry.get("logprob") if isinstance(entry, dict) else None for entry in entries]


def _named_ids(entries: list[Any]) -> list[int] | None:
    """The ids every entry's `token` names (`token_id:<int>`, vLLM's `return_tokens_as_token_ids`), read in C (`map`),
    or None unless every entry is an object with such a token: the caller then reads them one at a time."""
    try:
        names = list(map(itemgetter("token"), entries))
        if set(map(type, names)) <= {str} and all(map(methodcaller("startswith", PREFIX), names)):
            return list(map(int, map(itemgetter(slice(len(PREFIX), None)), names)))
    except (KeyError, TypeError, ValueError):
        pass
    return None


def _token_id(entry: dict[str, Any], url: str) -> int:
    token = str(entry.get("token", ""))
    if not token.startswith(PREFIX):
        raise _bad(url, f"logprob token {token[:40]!r} is not 'token_id:<int>'; send return_tokens_as_token_ids "
                        "(vLLM >= 0.6) or set request_prompt_and_generation_token_ids")
    try:
        return int(token.removeprefix(PREFIX))
    except ValueError:
        raise _bad(url, f"logprob token {token[:40]!r} is not 'token_id:<int>'") from None


def _ids(values: list[Any]) -> bool:
    """Whether every element is a token id: an `int` (not a `bool`, not a subclass: the values come from JSON) that is
    not negative. In C (`map`, `set`, `min`) rather than a Python loop: a model server checks every prompt token of
    every call (`bench/token_capture.py` times the whole capture)."""
    return set(map(type, values)) <= {int} and (not values or min(values) >= 0)


def _finite(values: list[Any]) -> bool:
    """Whether every element is a finite `float` or `int` (not a `bool`), in C as `_ids` is."""
    if not set(map(type, values)) <= {float, int}:
        return False
    try:  # a sum is finite only if every term is (a huge sum of finite terms only takes the exact way)
        return math.isfinite(sum(values)) or all(map(math.isfinite, values))
    except OverflowError:  # an int too large for a float
        return False


def _check(fields: dict[str, Any], url: str) -> None:
    prompt, generation, logprobs = (fields[name] for name in TOKEN_FIELDS)
    if not isinstance(prompt, list) or not prompt or not _ids(prompt):
        raise _bad(url, "prompt_token_ids must be a non-empty list of token ids")
    if not isinstance(generation, list) or not _ids(generation):
        raise _bad(url, "generation_token_ids must be a list of token ids")
    if not isinstance(logprobs, list) or len(logprobs) != len(generation):
        count = len(logprobs) if isinstance(logprobs, list) else type(logprobs).__name__
        raise _bad(url, f"{len(generation)} generated tokens but {count} logprobs")
    if _finite(logprobs):
        return
    for position, value in enumerate(logprobs):  # the first bad one, for the message
        if not _finite([value]):
            raise _bad(url, f"generation logprob {position} is {value!r}, not a finite number")
