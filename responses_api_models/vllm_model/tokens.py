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
from typing import Any

from gymfleet.errors import UpstreamError
from gymfleet.wire import TOKEN_FIELDS

FAILURE_CLASS = "upstream_bad_token_data"


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
        logprobs = [entry.get("logprob") if isinstance(entry, dict) else None for entry in entries]
        if completion.get("prompt_token_ids") is not None and choice.get("token_ids") is not None:
            generation = choice["token_ids"]
            named = [_token_id(entry, url) for entry in entries if str(entry.get("token", "")).startswith("token_id:")]
            prompt = completion["prompt_token_ids"]
        else:
            generation = [_token_id(entry, url) for entry in entries]
            prompt = await tokenize()
        fields = dict(zip(TOKEN_FIELDS, (prompt, generation, logprobs), strict=True))
    _check(fields, url)
    if named and named != fields["generation_token_ids"]:
        raise _bad(url, "choices[0].token_ids disagree with the token ids named in the logprobs")
    return fields


def _token_id(entry: dict[str, Any], url: str) -> int:
    token = str(entry.get("token", ""))
    if not token.startswith("token_id:"):
        raise _bad(url, f"logprob token {token[:40]!r} is not 'token_id:<int>'; send return_tokens_as_token_ids "
                        "(vLLM >= 0.6) or set request_prompt_and_generation_token_ids")
    try:
        return int(token.removeprefix("token_id:"))
    except ValueError:
        raise _bad(url, f"logprob token {token[:40]!r} is not 'token_id:<int>'") from None


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check(fields: dict[str, Any], url: str) -> None:
    prompt, generation, logprobs = (fields[name] for name in TOKEN_FIELDS)
    if not isinstance(prompt, list) or not prompt or not all(_is_id(token) for token in prompt):
        raise _bad(url, "prompt_token_ids must be a non-empty list of token ids")
    if not isinstance(generation, list) or not all(_is_id(token) for token in generation):
        raise _bad(url, "generation_token_ids must be a list of token ids")
    if not isinstance(logprobs, list) or len(logprobs) != len(generation):
        count = len(logprobs) if isinstance(logprobs, list) else type(logprobs).__name__
        raise _bad(url, f"{len(generation)} generated tokens but {count} logprobs")
    for position, value in enumerate(logprobs):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise _bad(url, f"generation logprob {position} is {value!r}, not a finite number")
