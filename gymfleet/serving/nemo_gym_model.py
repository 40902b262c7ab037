"""NeMo-Gym 0.7.0's model-server base (`nemo_gym.base_responses_api_model`), so NeMo-Gym's model-server folders
import and build their app: environment folders import them for their config (gdpval's judge settings are
`responses_api_models/openai_model`'s `SimpleModelServerConfig`) and their tests drive one in process (gdpval's judge
panel test builds openai_model's app and posts Chat Completions to it).

What is here has 0.7.0's behaviour: `BaseResponsesAPIModelConfig`, `SimpleResponsesAPIModel` whose
`setup_webserver()` serves `POST /v1/responses` and `POST /v1/chat/completions` (the body validated into
`NeMoGymResponseCreateParamsNonStreaming` / `NeMoGymChatCompletionCreateParamsNonStreaming`, a bad one answered with
FastAPI's 422, then the subclass's `responses(body=...)` / `chat_completions(body=...)`, also called with `request=`
where it declares one, and the result sent as JSON), and the run-wide capture settings
(`ModelCallCaptureConfig`, `observability_enabled_from_config`).

What is not: streaming (`"stream": true` is refused with a 400 naming it), the Anthropic Messages route, and
training-token capture (`token_id_capture_non_generating_requests` is accepted and unused). gymfleet serves its own
model servers (`responses_api_models/`); `ng_run` does not start NeMo-Gym's model-server folders.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, ClassVar

import orjson
from fastapi import Body, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gymfleet.serving.nemo_gym_server import BaseServer, SimpleServer
from gymfleet.serving.nemo_gym_types import (
    BaseRunServerInstanceConfig,
    NeMoGymChatCompletionCreateParamsNonStreaming,
    NeMoGymResponseCreateParamsNonStreaming,
)

__all__ = [
    "BaseResponsesAPIModel", "BaseResponsesAPIModelConfig", "Body", "ModelCallCaptureConfig", "NonGeneratingRequest",
    "SimpleResponsesAPIModel", "observability_enabled_from_config",
]


_BODY = Body()


class NonGeneratingRequest(BaseModel):
    """One exact model route (method and path) whose answers hold no policy-generated content."""

    model_config = ConfigDict(extra="forbid")
    method: str
    path: str

    @field_validator("method", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class BaseResponsesAPIModelConfig(BaseRunServerInstanceConfig):
    token_id_capture_non_generating_requests: list[NonGeneratingRequest] = Field(default_factory=list)


class BaseResponsesAPIModel(BaseServer):
    config: BaseResponsesAPIModelConfig


class ModelCallCaptureConfig(BaseModel):
    """The run-wide model-call capture settings of NeMo-Gym's global config (any other key is ignored)."""

    observability_enabled: bool = False
    model_call_capture_dir: Path | None = None

    @model_validator(mode="after")
    def _capture_dir(self) -> ModelCallCaptureConfig:
        if self.observability_enabled and self.model_call_capture_dir is None:
            raise ValueError("model_call_capture_dir is required when observability_enabled=true")
        if self.observability_enabled and not self.model_call_capture_dir.is_absolute():
            raise ValueError("model_call_capture_dir must be an absolute path")
        return self


def observability_enabled_from_config(global_config_dict: Any) -> bool:
    """The global config's `observability_enabled` (checked with its `model_call_capture_dir`)."""
    return ModelCallCaptureConfig.model_validate(global_config_dict).observability_enabled


def _validated(model: type[BaseModel], body: dict[str, Any]) -> BaseModel:
    """`body` as `model`, or FastAPI's 422 with each error's location under `body`."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in exc.errors(include_url=False)]) from None


def _json(content: Any) -> Response:
    if isinstance(content, Response):
        return content
    if isinstance(content, BaseModel):
        content = content.model_dump(mode="json", by_alias=True)
    return Response(content=orjson.dumps(content), media_type="application/json")


async def _call(method: Any, request: Request, body: BaseModel) -> Any:
    """`method(body=...)`, with `request=` too where the subclass's method declares it (0.7.0's servers vary)."""
    if "request" in inspect.signature(method).parameters:
        return await method(request=request, body=body)
    return await method(body=body)


def _refuse_stream(body: dict[str, Any], route: str) -> None:
    if body.get("stream") is True:
        raise HTTPException(400, f"{route}: \"stream\": true is not served for NeMo-Gym model-server folders on "
                                 "gymfleet; send the request without it")


class SimpleResponsesAPIModel(BaseResponsesAPIModel, SimpleServer):
    """The class NeMo-Gym's model servers subclass: `responses()` and `chat_completions()`, served by
    `setup_webserver()` at `/v1/responses` and `/v1/chat/completions`."""

    non_generating_model_routes: ClassVar[frozenset[tuple[str, str]]] = frozenset()

    def setup_webserver(self) -> FastAPI:
        app = FastAPI()
        self.setup_session_middleware(app)
        app.post("/v1/chat/completions")(self.chat_completions_dispatch)
        app.post("/v1/responses")(self.responses_dispatch)
        return app

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = _BODY) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement responses()")

    async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming = _BODY) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement chat_completions()")

    async def responses_dispatch(self, request: Request, body: dict = _BODY) -> Response:
        _refuse_stream(body, "/v1/responses")
        params = _validated(NeMoGymResponseCreateParamsNonStreaming, body)
        return _json(await _call(self.responses, request, params))

    async def chat_completions_dispatch(self, request: Request, body: dict = _BODY) -> Response:
        _refuse_stream(body, "/v1/chat/completions")
        params = _validated(NeMoGymChatCompletionCreateParamsNonStreaming, body)
        return _json(await _call(self.chat_completions, request, params))
