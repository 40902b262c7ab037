"""The `openai` package's output item models (openai 3.57's `ResponseOutputMessage`, `ResponseFunctionToolCall`,
`ResponseReasoningItem` and their parts), field for field, with its models' config (extra keys kept, schema built
on first use). They are written out here rather than imported: importing any `openai.types` module runs the
package's `__init__` (its client, httpx, every type of the API), about a second of CPU before a server's first
fork. tests/test_wire.py checks they validate and dump as the installed package's classes do. They keep its class
names, which a 422 shows in an error's location (`content.0.ResponseOutputText.text`).

`gymfleet.wire` widens the three item models with the training token fields (`OutputMessage`, `FunctionCall`,
`Reasoning`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_OPENAI_CONFIG = ConfigDict(extra="allow", defer_build=True)
_ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _OpenAIModel(BaseModel):
    model_config = _OPENAI_CONFIG


class AnnotationFileCitation(_OpenAIModel):
    file_id: str
    filename: str
    index: int
    type: Literal["file_citation"]


class AnnotationURLCitation(_OpenAIModel):
    end_index: int
    start_index: int
    title: str
    type: Literal["url_citation"]
    url: str


class AnnotationContainerFileCitation(_OpenAIModel):
    container_id: str
    end_index: int
    file_id: str
    filename: str
    start_index: int
    type: Literal["container_file_citation"]


class AnnotationFilePath(_OpenAIModel):
    file_id: str
    index: int
    type: Literal["file_path"]


class LogprobTopLogprob(_OpenAIModel):
    token: str
    bytes: list[int]
    logprob: float


class Logprob(_OpenAIModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[LogprobTopLogprob]


class ResponseOutputText(_OpenAIModel):
    """An `output_text` part of a message."""

    annotations: list[
        AnnotationFileCitation | AnnotationURLCitation | AnnotationContainerFileCitation | AnnotationFilePath
    ]
    text: str
    type: Literal["output_text"]
    logprobs: list[Logprob] | None = None


class ResponseOutputRefusal(_OpenAIModel):
    """A `refusal` part of a message."""

    refusal: str
    type: Literal["refusal"]


class ResponseOutputMessage(_OpenAIModel):
    id: str
    content: list[ResponseOutputText | ResponseOutputRefusal]
    role: Literal["assistant"]
    status: _ItemStatus
    type: Literal["message"]
    phase: Literal["commentary", "final_answer"] | None = None


class CallerDirect(_OpenAIModel):
    type: Literal["direct"]


class CallerProgram(_OpenAIModel):
    caller_id: str
    type: Literal["program"]


class ResponseFunctionToolCall(_OpenAIModel):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"]
    id: str | None = None
    async_: bool | None = Field(alias="async", default=None)
    caller: CallerDirect | CallerProgram | None = None
    namespace: str | None = None
    status: _ItemStatus | None = None


class Summary(_OpenAIModel):
    """A `summary_text` part of a reasoning item."""

    text: str
    type: Literal["summary_text"]


class Content(_OpenAIModel):
    """A `reasoning_text` part of a reasoning item."""

    text: str
    type: Literal["reasoning_text"]


class ResponseReasoningItem(_OpenAIModel):
    id: str
    summary: list[Summary]
    type: Literal["reasoning"]
    content: list[Content] | None = None
    encrypted_content: str | None = None
    status: _ItemStatus | None = None
