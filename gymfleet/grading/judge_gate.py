r"""The one path from a policy's answer to a judge's verdict, shared by every judged environment.

Screen the answer, ask the judge, read the verdict, record provenance:

    gate = JudgeGate(judge_client(config, self.client), params=judge_params(config))
    answer = gate.prepare(raw_text, labels=("[[A=B]]", "[[A!=B]]"), markers=(...,))
    if answer.reasons:                      # it tries to steer the judge: score it without asking
        return 0.0
    prompt = render_prompt(template, answer=gate.quote(answer.shown))
    ruling = await gate.ask(prompt, labels=("[[A=B]]", "[[A!=B]]"), answer=answer.shown, version=version)
    ruling.label, ruling.provenance, ruling.reply.text

`prepare` applies `judge_input` (what the user sees, normalised, screened); `quote` puts it in a nonce-delimited
block; `ask` calls the judge (`JudgeError` when the call fails) and reads its final verdict by `judge_verdict`
(None when the reply names no label: each environment documents what that is worth). An environment whose judge
reads JSON or a line rule passes `read=` its own reader, still given the reply with quoted copies removed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

from gymfleet.errors import JudgeError
from gymfleet.grading.judge import JudgeClient, JudgeReply, chat_text, response_text
from gymfleet.grading.judge_input import Quoted, judge_text, quote, screen
from gymfleet.grading.judge_verdict import final_verdict, ruling_text

__all__ = ["JudgeGate", "Prepared", "Ruling", "judge_client", "judge_params"]


def judge_client(config: Any, client: Any, *, uncapped: int = 1 << 20) -> JudgeClient:
    """A `JudgeClient` from an environment config's `judge_model_server`, `judge_timeout_s`, `judge_max_attempts`
    and `judge_max_concurrency` (None: no cap)."""
    return JudgeClient(config.judge_model_server, client, timeout_s=config.judge_timeout_s,
                       max_concurrency=config.judge_max_concurrency or uncapped,
                       max_attempts=config.judge_max_attempts)


def judge_params(config: Any) -> dict[str, Any]:
    """The config's `judge_responses_create_params` as a request body, without its `input`."""
    params = config.judge_responses_create_params.model_dump(mode="json", exclude_none=True)
    params.pop("input", None)
    return params


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A policy's text made ready for a judge.

    Attributes:
        shown: What the judge is shown (`judge_input.judge_text`): visible, normalised.
        reasons: Why it looks like it steers the judge (`judge_input.screen`); empty when it may be judged.
    """

    shown: str
    reasons: list[str]


@dataclasses.dataclass(frozen=True)
class Ruling:
    """One judge call and its verdict.

    Attributes:
        label: The verdict label (None when the reply names none, or `read` found none).
        reply: The reply text with what identifies the call.
        params: The request sent.
        response: The judge's whole reply object.
        provenance: `{judge_server, judge_model, prompt_version, seed}`.
    """

    label: str | None
    reply: JudgeReply
    params: dict[str, Any]
    response: dict[str, Any]
    provenance: dict[str, Any]


class JudgeGate:
    """Screens answers for one judge and reads its verdicts (module docstring)."""

    def __init__(self, judge: JudgeClient, *, params: dict[str, Any] | None = None):
        self.judge = judge
        self.params = dict(params or {})

    @staticmethod
    def prepare(raw: str, labels: Sequence[str] = (), markers: Sequence[Any] = ()) -> Prepared:
        """What the judge would be shown of `raw` and why it must not be (screened against `labels`, `markers`)."""
        shown = judge_text(raw)
        return Prepared(shown, screen(shown, labels, markers))

    @staticmethod
    def quote(shown: str, name: str = "RESPONSE") -> Quoted:
        """`shown` in a block delimited by a fresh nonce (`judge_input.quote`)."""
        return quote(shown, name)

    async def ask(
        self,
        prompt: str | list[dict[str, Any]],
        *,
        labels: Sequence[str] = (),
        answer: str | None = None,
        version: str | None = None,
        system: str | None = None,
        api: Literal["responses", "chat"] = "responses",
        read: Callable[[str], str | None] | None = None,
    ) -> Ruling:
        """Ask the judge and read its final verdict.

        Args:
            prompt: The user message, or the whole message list.
            labels: The verdict labels (read last-wins unless `read` is given).
            answer: The policy's text shown in the prompt (its copies in the reply are not read).
            version: The prompt's version tag, recorded in the provenance.
            system: A system message put first.
            api: `responses` or `chat`.
            read: A reader of the ruling text for a verdict, instead of the last label.

        Raises:
            JudgeError: The call failed, or the reply holds no message text.
        """
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system:
            messages.insert(0, {"role": "system", "content": system})
        if api == "chat":
            params = {**self.params, "messages": messages}
            response = await self.judge.chat(params)
            text = chat_text(response)
        else:
            params = {**self.params, "input": messages}
            response = await self.judge.responses(params)
            text = response_text(response)
        if text is None:
            raise JudgeError(f"judge {self.judge.server!r} replied without message text")
        model = response.get("model") if isinstance(response.get("model"), str) else params.get("model")
        seed = params.get("seed")
        reply = JudgeReply(text, self.judge.server, model, seed if isinstance(seed, int) else None)
        label = read(ruling_text(text, answer)) if read else final_verdict(text, labels, answer=answer)
        return Ruling(label, reply, params, response, reply.provenance(version))
