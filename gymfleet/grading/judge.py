r"""LLM judges: call a model server by instance name, load prompt files, read verdicts.

A judge is just another model server in the fleet (often the policy itself, or a larger model), reached by its
instance name through `gymfleet.http`:

    judge = JudgeClient("judge_model", self.client, timeout_s=60)
    reply = await judge.responses({"input": [{"role": "user", "content": prompt}], "max_output_tokens": 1024})
    label = verdict(response_text(reply), choices=("[[A=B]]", "[[A!=B]]"))

or, to also record who judged (the judge's model name, the prompt's version, the sampling seed) on the reward:

    reply = await judge.call(prompt, seed=0, max_output_tokens=1024)
    label = find_verdict(reply.text, ("[[A=B]]", "[[A!=B]]"))        # None when it names neither
    row["judge_provenance"] = reply.provenance(prompt_version(template))

Verdict parsers (`verdict`, `find_verdict`, `json_verdict`) and the injection screen (`injection_signals`) live in
`gymfleet.grading.verdicts` and are re-exported here.

Failure boundary (STYLE 2.5): a judge that cannot be reached, times out, answers a non-2xx status once retries are
spent, or answers something that is not a JSON object raises `JudgeError`; so does a reply that names none of the
expected verdicts (an unparseable verdict is not the policy's fault). A resources server turns `JudgeError` into a
row tagged `_ng_failure_class: judge_failed`, kept out of rewards and metrics. Wrap the judge *call* this way, never
the whole of `verify`, so ordinary bugs still surface as bugs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import re
import weakref
from pathlib import Path
from typing import Any, Literal

import orjson

from gymfleet import connections, http
from gymfleet.errors import JudgeError, TransportError
from gymfleet.grading.verdicts import (
    find_verdict,
    injection_signals,
    json_objects,  # noqa: F401  (re-exported: genrm_compare reads JSON this way)
    json_verdict,
    verdict,
)

__all__ = [
    "JudgeClient",
    "JudgeReply",
    "chat_text",
    "configured_prompts",
    "find_verdict",
    "injection_signals",
    "json_verdict",
    "load_prompt",
    "prompt_version",
    "render_prompt",
    "response_text",
    "verdict",
]

_JUDGE_RETRY_STATUSES = http.RETRY_STATUSES | {500}  # a judge's 500 is usually a transient engine error
JUDGE_TIMEOUT_S = 900.0
"""Default deadline of one judge call attempt: a model call's, as the agents' (`model_timeout_s`) and the model
servers' (`vllm_model`'s `timeout_s`). A judge is often the policy's own model server (NeMo-Gym's recipes), where
its calls queue behind every rollout's: 65,536 rollouts on 2 cores had policy calls waiting 287 s (p99) there, and
judge calls with 120 s failed as `judge_failed` while merely queued. Its queue is bounded by the agents' admission
(`max_concurrent_rollouts`), so a longer deadline costs nothing but the time to notice a judge that hangs."""


class JudgeClient:
    """Calls one judge model server by instance name, with a deadline, bounded retries and a concurrency cap.

    Args:
        server: Instance name of the judge's model server (a `{type, name}` reference's `name`).
        client: The calling server's `ServerClient` (resolves the name from the global config).
        timeout_s: Deadline for one attempt (`JUDGE_TIMEOUT_S`); a caller's own deadline (a resources server's
            `verify_timeout_s`) does not count the call, nor the wait for a free slot (`max_concurrency`).
        max_concurrency: Judge calls in flight at once from this client; more wait their turn.
        max_attempts: Attempts per call, the first included. Failures to connect and 429/5xx answers are retried with
            exponential backoff; a call that may have reached the judge (no answer in time, a dropped connection) is
            not: the judge may still be generating it, and a second call doubles its load.
        backoff_s: First backoff (doubles each attempt, with jitter).
    """

    def __init__(
        self,
        server: str,
        client: http.ServerClient,
        *,
        timeout_s: float = JUDGE_TIMEOUT_S,
        max_concurrency: int = 64,
        max_attempts: int = 3,
        backoff_s: float = 0.5,
    ):
        self.server = server
        self.client = client
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.retry = http.RetryPolicy(
            max_attempts=max_attempts, backoff_s=backoff_s, retry_statuses=_JUDGE_RETRY_STATUSES
        )
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def url(self) -> str:
        """The judge's base URL.

        Raises:
            ServerRefError: No instance of that name is in the global config (call it at startup to fail early).
        """
        return self.client.url_of(self.server)

    async def responses(self, params: dict[str, Any]) -> dict[str, Any]:
        """POST a Responses API request (`input`, `max_output_tokens`, ...) and return the Responses object.

        Raises:
            JudgeError: The call failed (see the module docstring).
        """
        return await self._post("/v1/responses", params)

    async def chat(self, params: dict[str, Any]) -> dict[str, Any]:
        """POST a Chat Completions request (`messages`, `max_tokens`, ...) and return the completion.

        Raises:
            JudgeError: The call failed (see the module docstring).
        """
        return await self._post("/v1/chat/completions", params)

    async def ask(
        self, prompt: str | list[dict[str, Any]], *, api: Literal["responses", "chat"] = "responses", **params: Any
    ) -> str:
        """Send `prompt` (one user message, or a list of `{role, content}` messages) and return the reply text.

        Args:
            prompt: The user message, or the whole message list.
            api: Which endpoint to call.
            **params: Other request fields (`max_output_tokens` / `max_tokens`, `temperature`, ...).

        Returns:
            The text of the judge's last message.

        Raises:
            JudgeError: The call failed, or the reply holds no message text.
        """
        return (await self.call(prompt, api=api, **params)).text

    async def call(
        self, prompt: str | list[dict[str, Any]], *, api: Literal["responses", "chat"] = "responses", **params: Any
    ) -> JudgeReply:
        """Like `ask`, but return the reply with what identifies it (the judge's model name, the seed sent).

        Raises:
            JudgeError: The call failed, or the reply holds no message text.
        """
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if api == "chat":
            data = await self.chat({"messages": messages, **params})
            text = chat_text(data)
        else:
            data = await self.responses({"input": messages, **params})
            text = response_text(data)
        if text is None:
            raise JudgeError(f"judge {self.server!r} replied without message text")
        model = data.get("model") if isinstance(data.get("model"), str) else params.get("model")
        seed = params.get("seed")
        return JudgeReply(text=text, server=self.server, model=model, seed=seed if isinstance(seed, int) else None)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        # Off the caller's clock (a resources server's `verify_timeout_s`): the wait for a free judge slot is a queue,
        # and the call is bounded by its own deadline (`timeout_s` per attempt). Counted against the verify's, 65,536
        # rollouts on 2 cores ended in `verify_timeout` rows, 64 at a time, queued behind judge calls.
        with connections.off_the_clock():
            async with self._semaphore():
                try:
                    response = await self.client.post(self.server, path, json=body, timeout_s=self.timeout_s,
                                                      retry=self.retry)
                except TransportError as exc:
                    raise JudgeError(f"judge {self.server!r} {path}: {exc}") from exc
        if not response.ok:
            raise JudgeError(f"judge {self.server!r} {path}: HTTP {response.status}: {response.text[:300]}")
        try:
            data = response.json()
        except orjson.JSONDecodeError as exc:
            raise JudgeError(f"judge {self.server!r} {path}: reply is not JSON: {response.text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise JudgeError(f"judge {self.server!r} {path}: reply is not a JSON object: {response.text[:200]!r}")
        return data

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return semaphore


@dataclasses.dataclass(frozen=True)
class JudgeReply:
    """A judge's reply text and what identifies the call that produced it.

    Attributes:
        text: The text of the judge's last message.
        server: The judge's model server instance name.
        model: The model that answered (the reply's `model` field, else the request's), or None.
        seed: The sampling seed sent with the request, or None when none was.
    """

    text: str
    server: str
    model: str | None = None
    seed: int | None = None

    def provenance(self, prompt_version: str | None = None) -> dict[str, Any]:
        """`{judge_server, judge_model, prompt_version, seed}`: what a reward records to be reproducible.

        Examples:
            >>> JudgeReply("[[A=B]]", "judge_model", "qwen3", 7).provenance("judge.txt@d99d445fc5cb")["judge_model"]
            'qwen3'
        """
        return {"judge_server": self.server, "judge_model": self.model, "prompt_version": prompt_version,
                "seed": self.seed}


def prompt_version(template: str, name: str = "prompt") -> str:
    """A short, stable version tag of a prompt template: `name@` and the first 12 hex digits of its SHA-256.

    Any edit to the template changes it, so a reward can say exactly which prompt produced it.

    Examples:
        >>> prompt_version("Is {a} equal to {b}?", "judge.txt")
        'judge.txt@d99d445fc5cb'
    """
    return f"{name}@{hashlib.sha256(template.encode('utf-8')).hexdigest()[:12]}"


def response_text(response: dict[str, Any]) -> str | None:
    """Text of the last output item of a Responses object when it is a message, else None.

    Examples:
        >>> response_text({"output": [{"type": "reasoning", "summary": []},
        ...     {"type": "message", "content": [{"type": "output_text", "text": "[[A=B]]"}]}]})
        '[[A=B]]'
        >>> response_text({"output": [{"type": "reasoning", "summary": []}]}) is None
        True
    """
    output = response.get("output")
    if not isinstance(output, list) or not output or not isinstance(output[-1], dict):
        return None
    last = output[-1]
    if last.get("type") != "message" or not isinstance(last.get("content"), list):
        return None
    parts = [part.get("text") for part in last["content"] if isinstance(part, dict)]
    texts = [text for text in parts if isinstance(text, str)]
    return "".join(texts) if texts else None


def chat_text(completion: dict[str, Any]) -> str | None:
    """`choices[0].message.content` of a Chat completion, or None when absent.

    Examples:
        >>> chat_text({"choices": [{"message": {"role": "assistant", "content": "yes"}}]})
        'yes'
        >>> chat_text({"choices": []}) is None
        True
    """
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else None


def load_prompt(anchor: str | Path, name: str) -> str:
    """The text of prompt file `name` in the folder of `anchor` (pass `__file__` from an environment's `app.py`).

    Raises:
        FileNotFoundError: No such file next to `anchor`.
    """
    return _read_prompt(str(Path(anchor).resolve().parent / name))


def configured_prompts(
    anchor: str | Path, template: str | None, system: str | None, *, template_file: str = "judge_prompt.txt",
    system_file: str = "judge_system.txt",
) -> tuple[str, str | None, str]:
    """A judge's prompt template and system message as an environment's config gives them, and the template's origin
    (the name `prompt_version` records): a null or empty `template` is the file `template_file` next to `anchor`
    (named by its file name unless it was configured empty: "config"); a null `system` is the file `system_file`,
    an empty one no system message.

    Raises:
        FileNotFoundError: A file it needs is not next to `anchor`.
    """
    text = template or load_prompt(anchor, template_file)
    system_text = load_prompt(anchor, system_file) if system is None else system or None
    return text, system_text, template_file if template is None else "config"


@functools.lru_cache(maxsize=128)
def _read_prompt(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


_FIELD = re.compile(r"\{(\w+)\}")  # "{question}"; "\boxed{}" has no name and stays, as does "{x}" unless given


def render_prompt(template: str, **fields: str) -> str:
    r"""Fill `{name}` placeholders in one pass; other braces (LaTeX such as `\frac{1}{2}`) are left alone.

    Unlike `str.format`, braces need no escaping, and a field value that itself contains `{name}` is not expanded
    again (an answer cannot inject text into the prompt's other slots).

    Examples:
        >>> render_prompt(r"Is {first} equal to \frac{1}{2}?", first="{second}", second="0.5")
        'Is {second} equal to \\frac{1}{2}?'
    """
    return _FIELD.sub(lambda match: fields.get(match.group(1), match.group(0)), template)
