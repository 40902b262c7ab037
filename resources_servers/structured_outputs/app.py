"""structured_outputs: does the model's structured document validate under the row's JSON Schema?

The prompt asks for a document in a given format (text mode) or for one call of a tool whose arguments carry the
document (tool-call mode, NeMo-Gym's "v4" rows). Only schema adherence is graded, never the content.

## Task fields
- `schema_str`: the JSON Schema, as a JSON string.
- `schema_type` (default `json`): the text format, `json`, `yaml`, `xml`, `toml` or `csv` (text mode only).
- `response_mode` (default `text`): `text` or `tool_call`.
- `tool_name` (tool-call mode, optional): the function the model must call.
- `tool_payload_key` (tool-call mode, optional): the argument that holds the document (a wrapper such as
  `{"extraction": {...}}`); null means the arguments object is the document.
- Any other field (`problem_type`, `schema_repr`, `num_tools`, `agent_ref`, ...) is echoed untouched.

## Reward
1.0 iff the document validates under the *strict* schema, else 0.0. Strict: every object schema reachable through
dict values that has `properties` requires all of them and allows no other keys (`required` = all property names,
`additionalProperties: false`); schemas inside lists (`anyOf` branches, ...) are left as written. Validation is JSON
Schema 2020-12 with the schema checked first, `format` not asserted, and `$ref` resolved only within the schema.
- text mode: the text is the response's `output_text` (all assistant message text, reasoning excluded), parsed as
  it is: no code-fence stripping, so a fenced or prose-wrapped document is a `parse_error`. XML leaves (when
  `xml_coerce_types`) and CSV cells are converted to the schema's integer/number/boolean types first; the XML root
  element is the top-level key, and CSV is a list of header-keyed rows.
- tool-call mode: the output must hold exactly one `function_call`, named `tool_name` when the row gives one; its
  arguments are parsed as JSON and `arguments[tool_payload_key]` (or the whole object) is validated. Text is
  ignored; a response that carries an `error` scores 0.
In both modes a document holding NaN or an infinity is a `parse_error`: JSON has no such numbers (`NaN`,
`Infinity`, `-Infinity`, or a literal such as `1e999` that overflows), and YAML's `.nan` / `.inf` and TOML's
`nan` / `inf` are refused alike; NaN would otherwise satisfy every `minimum` / `maximum`. An XML or CSV value
written `NaN` or `inf` is not coerced to a number, so a number field holding it is a `validation_error`.
The response adds `error_type` (null on success; `empty_response`, `schema_error`, `parse_error`,
`validation_error`, `response_error`, `missing_tool_call`, `multiple_tool_calls`, `wrong_tool_name`) and
`error_message` (clipped to 200 characters). `/aggregate_metrics` adds `mean/reward_<schema_type>` and
`mean/error_<error_type>` (the share of rows failing that way).

## Config
- `xml_coerce_types` (default true): convert XML leaf strings to the schema's scalar types before validating.
- `max_document_chars` (default 400000): a longer document (text or arguments) is a `parse_error` unread.
- `max_document_nodes` (default 100000): a document holding more values once YAML aliases are expanded is a
  `parse_error`; this bounds validation time (jsonschema checks ~40k values/s).
Grading runs in a worker thread (`asyncio.to_thread`), so parsing and validating never block the event loop.

## Departures from NeMo-Gym
- NaN and infinities score 0 (above). NeMo-Gym parses with Python's `json.loads`, which accepts `NaN`,
  `Infinity` and `-Infinity`, and its validator counts them as numbers within any bounds.

## Tools
None. Tool-call rows declare their tools in `responses_create_params.tools`; the agent must not execute them
(NeMo-Gym sets `execute_tool_calls: false` on its v4 agent): the call is the answer.

## Version history
- v1: text mode (json, yaml, xml, toml, csv) and tool-call mode, NeMo-Gym's strictify rule and error types.
- v2: NaN and infinities are a `parse_error` in every format and in tool-call arguments.
- v2 (fix, no reward changes): YAML nesting deeper than 1000 levels is a `parse_error` found before the document
  is built; such text (60 KB of `- ` or `[`) used to crash libyaml's C composer and with it the server.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from statistics import fmean
from typing import Any, Literal

from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.structured_outputs.documents import SchemaType
from resources_servers.structured_outputs.scoring import ErrorType, Grade, Limits, grade_text, grade_tool_call


class StructuredOutputsConfig(ResourcesServerConfig):
    """structured_outputs' fields."""

    xml_coerce_types: bool = True
    """Convert XML leaf strings to the schema's integer/number/boolean types (xmltodict reads every leaf as text)."""
    max_document_chars: int = 400_000
    """Longer documents are a parse_error without parsing (libyaml reads ~250k chars/s in its Python constructor)."""
    max_document_nodes: int = 100_000
    """Documents holding more values (YAML aliases expanded) are a parse_error; bounds validation time."""


class StructuredOutputsRequest(VerifyRequest):
    """A row to grade."""

    schema_str: str
    schema_type: SchemaType = "json"
    response_mode: Literal["text", "tool_call"] = "text"
    tool_name: str | None = None
    tool_payload_key: str | None = None


class StructuredOutputsResponse(VerifyResponse):
    """The graded row."""

    error_type: ErrorType | None = None
    error_message: str | None = None


class StructuredOutputsServer(ResourcesServer):
    """Grades structured documents against JSON Schemas."""

    config: StructuredOutputsConfig
    reverify_mode = "stateless"
    reward_libraries = ("jsonschema", "referencing", "PyYAML", "xmltodict")

    async def verify(self, body: StructuredOutputsRequest) -> StructuredOutputsResponse:
        config = self.config
        limits = Limits(config.max_document_chars, config.max_document_nodes, config.xml_coerce_types)
        if body.response_mode == "tool_call":
            grade: Grade = await asyncio.to_thread(
                grade_tool_call, body.response, body.schema_str, body.tool_name, body.tool_payload_key, limits
            )
        else:
            text = body.response.output_text
            grade = await asyncio.to_thread(grade_text, text, body.schema_str, body.schema_type, limits)
        return StructuredOutputsResponse.echo(
            body, reward=grade.reward, error_type=grade.error_type, error_message=grade.error_message
        )

    def aggregate_metrics(self, verify_responses: list[dict[str, Any]]) -> dict[str, Any]:
        metrics = super().aggregate_metrics(verify_responses)
        rows = [row for row in verify_responses if not row.get("_ng_failure_class")]
        by_type: dict[str, list[float]] = defaultdict(list)
        for row in rows:
            by_type[str(row.get("schema_type", "json"))].append(float(row.get("reward", 0.0)))
        extra = {f"mean/reward_{kind}": fmean(rewards) for kind, rewards in sorted(by_type.items())}
        for error_type in sorted({row["error_type"] for row in rows if row.get("error_type")}):
            extra[f"mean/error_{error_type}"] = fmean(row.get("error_type") == error_type for row in rows)
        metrics["agent_metrics"].update(extra)
        metrics["key_metrics"].update(extra)
        return metrics
