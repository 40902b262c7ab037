"""Reading what the upstream answered: JSON that may hold NaN, error statuses, context overflow, empty answers."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import orjson

from gymfleet import http
from gymfleet.errors import UpstreamError

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 520})
# vLLM's 400s for a prompt that leaves no room: "This model's maximum context length is 4096 tokens...",
# "'max_tokens' is too large: ...", "max_tokens must be at least 1, got -12".
CONTEXT_OVERFLOW_MARKERS = ("context length", "max_tokens", "maximum context")


def is_context_overflow(answer: http.HttpResponse) -> bool:
    return answer.status == 400 and any(marker in answer.text for marker in CONTEXT_OVERFLOW_MARKERS)


def empty_completion(finish_reason: str, model: str) -> dict[str, Any]:
    """A completion with no content, no tool calls and no token fields (the agent reads it and stops)."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": None}, "finish_reason": finish_reason,
             "logprobs": None}
        ],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def raise_for_upstream(answer: http.HttpResponse) -> http.HttpResponse:
    """`answer` if 2xx; else an `UpstreamError` carrying the status (4xx are passed on, the rest become 502s)."""
    if not answer.ok:
        raise UpstreamError(
            f"upstream {answer.url} answered {answer.status}: {answer.text[:500]}",
            status=answer.status,
            url=answer.url,
            response_content=answer.body,
            failure_class="upstream_error",
        )
    return answer


def read_json(answer: http.HttpResponse) -> Any:
    """The body as JSON. Python's own parser is the fallback because vLLM can write `NaN` (not JSON) for a logprob;
    the token checks then reject it by name instead of the call dying on a parse error."""
    try:
        return answer.json()
    except orjson.JSONDecodeError:
        try:
            return json.loads(answer.text)
        except json.JSONDecodeError:
            raise UpstreamError(
                f"upstream {answer.url} answered {answer.status} with a body that is not JSON: {answer.text[:200]!r}",
                status=None, url=answer.url, failure_class="upstream_bad_response",
            ) from None


def read_completion(answer: http.HttpResponse) -> dict[str, Any]:
    """A 2xx Chat completion, checked for the parts every reader relies on (`choices[0].message`)."""
    completion = read_json(raise_for_upstream(answer))
    choices = completion.get("choices") if isinstance(completion, dict) else None
    if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        raise UpstreamError(
            f"upstream {answer.url} answered without choices[0].message: {answer.text[:200]!r}",
            url=answer.url, failure_class="upstream_bad_response",
        )
    return completion
