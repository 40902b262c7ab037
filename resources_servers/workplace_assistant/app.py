"""workplace_assistant: WorkBench's workplace agent — act on emails, calendar, analytics, tasks and a CRM with tools.

The user is "Sam" at a company whose addresses end in `@atlas.com`; today is Thursday 2023-11-30 23:59. The model
(`simple_agent`, `max_steps: 6`) calls 27 tools over HTTP against its rollout's own copy of six tables. The reward
replays the model's calls and the reference solution's calls on fresh copies of the tables and compares the final
states. Behaviour and wording follow NeMo-Gym's `workplace_assistant` (spec: `workplace_assistant.md`), so its
datasets and tool definitions work unchanged.

## Task fields
- `id` (int; numeric strings are coerced), `category` (str, e.g. `workplace_assistant_email`), `environment_name`
  (str): required, not used in scoring.
- `ground_truth`: the reference solution, `[{"name": "<tool>", "arguments": "<JSON object as a string>"}, ...]`
  (arguments given as an object are a 422). A string `ground_truth` is accepted and replays as no calls (Q5).
- `responses_create_params`: the system prompt with the fixed date, the user's request, the 27 tool definitions
  (`data/example.jsonl` shows them), `parallel_tool_calls: false`.
- Any other field is echoed untouched.

## Reward
1.0 iff the five tables emails, calendar events, plots, project tasks and CRM are equal after replaying, each on a
fresh load, (a) every `function_call` of `response.output` in order and (b) the `ground_truth` calls; else 0.0.
The replay does not read the session's live state. A call that raises (unknown tool, JSON that is not an object,
a wrong argument name, a regex error) is skipped; a tool's error message changes nothing. Equality is NeMo-Gym's:
same row labels in the same order (appends to emails, tasks and CRM renumber them, calendar appends get label 0,
deletes leave gaps), and equal cells after lowercasing every column except `status`, `list_name` and `board`,
where any non-string value counts as missing. The model's text answer is not scored, so a question whose answer
needs no change scores 1.0 for any trajectory that changes nothing. The response adds `tables_differing` (names
of the compared tables that differ; empty when the reward is 1.0).

## Config
- `data_dir` (null): folder of the tables in WorkBench's layout (`emails.csv`, `calendar_events.csv`,
  `project_tasks.csv`, `customer_relationship_manager_data.csv`, `analytics_data.csv`, `raw/email_addresses.csv`),
  absolute or relative to the repository root. Null: our own synthetic workplace in `data/workplace/`, made by
  `generate.py` (seeded). NeMo-Gym's datasets refer to ids in WorkBench's tables: point `data_dir` at those.
- `session_idle_s` (3600): a session untouched this long is dropped (its next tool call is HTTP 410
  `session_lost`: `gymfleet.serving.session_store`). Sessions are also dropped at `/verify`.
- `max_sessions` (20000): sessions kept at once; past it the least recently used are dropped.

## Tools
`POST /<tool>` with the arguments as a JSON object answers HTTP 200 `{"output": <result>}`; top-level `null`
arguments are dropped (the tool's default applies). An exception a tool does not catch answers
`{"output": "Error executing tool '<tool>': <text>"}`; an unknown tool `Error executing tool 'foo': 'foo'`. Without
a seeded session the answer is HTTP 400 `{"detail": "Session not initialized. Please call seed_session first."}`;
with a session seeded before this server crashed and was restarted, or dropped as idle or least recently used, it
is HTTP 410 `session_lost`
(`gymfleet.serving.sessions`; `/verify`, which replays the calls, is still served);
a body that is not a JSON object is a 422. The 27 tools (`tools.py`, one class per toolkit):
`company_directory_find_email_address`; `email_` get_email_information_by_id, search_emails, send_email,
delete_email, forward_email, reply_email; `calendar_` get_event_information_by_id, search_events, create_event,
delete_event, update_event; `analytics_` get_visitor_information_by_id, create_plot, total_visits_count,
engaged_users_count, traffic_source_count, get_average_session_duration; `project_management_`
get_task_information_by_id, search_tasks, create_task, delete_task, update_task;
`customer_relationship_manager_` search_customers, update_customer, add_customer, delete_customer. Their quirks
are the reference's (unpadded new email ids `500`, `501`...; regex filters; string date bounds; pagination
clamping; see the spec's §5).

## Departures from NeMo-Gym
- Sessions are evicted at `/verify`, after `session_idle_s` idle, and past `max_sessions` (NeMo-Gym keeps every
  session's tables forever). `GET /metrics` has `gymfleet_sessions_open`.
- The verify answer echoes every row field (NeMo-Gym drops fields its model does not declare) and adds
  `tables_differing`.
- Date text is read as pandas reads it without pandas: ISO forms by hand, other forms through dateutil (which
  pandas itself uses for them; a declared dependency); numbers are nanoseconds since the epoch. Month-name text
  without a year takes the current year.
- The default tables are our own synthetic data, not WorkBench's.
- No MCP exposure of the tools.

## Version history
- v1: initial.
- v2: a tool call on a session dropped as idle or least recently used is HTTP 410 `session_lost` (the rollout ends
  as a failure row), not the 400 "Session not initialized"; rewards otherwise unchanged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import Gauge
from pydantic import Field
from starlette.responses import Response as StarletteResponse

from gymfleet.fleet.config_instances import repository_root
from gymfleet.serving.bodies import read_json
from gymfleet.serving.resources import (
    ResourcesServer,
    ResourcesServerConfig,
    SeedSessionRequest,
    VerifyRequest,
    VerifyResponse,
)
from gymfleet.serving.server import JSONResponse, add_route
from gymfleet.serving.session_store import SessionStore
from gymfleet.serving.sessions import session_id
from resources_servers.workplace_assistant import tools
from resources_servers.workplace_assistant.tables import Workplace, differing_tables, load_workplace

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "data" / "workplace"
NOT_SEEDED = "Session not initialized. Please call seed_session first."


class WorkplaceAssistantConfig(ResourcesServerConfig):
    """workplace_assistant's fields (see the module docstring)."""

    data_dir: str | None = None
    """Folder of the tables (WorkBench's layout); null: the synthetic workplace in `data/workplace/`."""
    session_idle_s: float = Field(default=3600.0, gt=0)
    """A session untouched this long is dropped."""
    max_sessions: int = Field(default=20_000, gt=0)
    """Sessions kept at once; the least recently used go first."""


class WorkplaceAssistantRequest(VerifyRequest):
    """A row to grade."""

    id: int
    category: str
    environment_name: str
    ground_truth: list[dict[str, str]] | str


class WorkplaceAssistantResponse(VerifyResponse):
    """The graded row."""

    tables_differing: list[str]


def replay(initial: Workplace, calls: list[tuple[Any, Any]]) -> Workplace:
    """A fresh copy of `initial` after running `(name, arguments JSON)` calls in order; a call that raises is
    skipped (NeMo-Gym's verification; `null` arguments are passed as `None`, unlike over HTTP)."""
    state = initial.copy()
    for name, arguments in calls:
        try:
            tools.call(state, name, json.loads(arguments))
        except Exception as exc:  # the reference skips any failing call
            log.debug("replay skipped %s: %s: %s", name, type(exc).__name__, exc)
    return state


def predicted_calls(body: VerifyRequest) -> list[tuple[Any, Any]]:
    """Every `function_call` of the response, across turns, in order: `(name, arguments)`."""
    return [(item.name, item.arguments) for item in body.response.output if item.type == "function_call"]


def ground_truth_calls(ground_truth: list[dict[str, str]] | str) -> list[tuple[Any, Any]]:
    """The reference solution's calls; entries without `name` or `arguments` are skipped, a string is no calls."""
    if isinstance(ground_truth, str):
        return []
    return [(call["name"], call["arguments"]) for call in ground_truth if "name" in call and "arguments" in call]


class WorkplaceAssistantServer(ResourcesServer):
    """Serves the 27 tools on per-session tables and grades by replaying calls."""

    config: WorkplaceAssistantConfig
    reverify_mode = "stateless"  # the reward replays the calls; it never reads the session
    reward_libraries = ("python-dateutil",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial = load_workplace(str(self.data_dir()))
        self.sessions: SessionStore[Workplace] = SessionStore(self.config.session_idle_s, self.config.max_sessions,
                                                              name=self.config.name or "workplace_assistant")
        Gauge("gymfleet_sessions_open", "Rollout sessions holding tables", registry=self.metrics.registry
              ).set_function(lambda: len(self.sessions))

    def data_dir(self) -> Path:
        """The tables' folder (the config's, relative to the repository root, or the synthetic default)."""
        if self.config.data_dir is None:
            return DEFAULT_DATA_DIR
        path = Path(self.config.data_dir)
        return path if path.is_absolute() else repository_root() / path

    def routes(self, app: FastAPI) -> None:
        super().routes(app)
        add_route(app, "/{tool}", self._tool_route)  # last: the fixed routes take precedence

    async def seed_session(self, body: SeedSessionRequest) -> dict:
        self.sessions.put(session_id(), self.initial.copy())
        return {}

    async def _tool_route(self, request: Request) -> StarletteResponse:
        name = request.path_params["tool"]
        if not await request.body():
            raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
        arguments = await read_json(request)
        if not isinstance(arguments, dict):
            raise RequestValidationError(
                [{"type": "model_attributes_type", "loc": ("body",),
                  "msg": "the tool's arguments must be a JSON object, e.g. {\"email_id\": \"00000057\"}"}]
            )
        key = session_id()
        workplace = self.sessions.get(key)
        if workplace is None:
            if self.sessions.lost(key):
                return self.sessions.lost_answer(f"POST /{name}")
            return JSONResponse({"detail": NOT_SEEDED}, status_code=400)
        arguments = {key: value for key, value in arguments.items() if value is not None}
        try:
            output = tools.call(workplace, name, arguments)
        except Exception as exc:  # the model reads the reference's wording of any tool failure
            output = f"Error executing tool '{name}': {exc}"
        return JSONResponse({"output": output})

    async def verify(self, body: WorkplaceAssistantRequest) -> WorkplaceAssistantResponse:
        self.sessions.pop(session_id())
        predicted = replay(self.initial, predicted_calls(body))
        expected = replay(self.initial, ground_truth_calls(body.ground_truth))
        differing = differing_tables(predicted, expected)
        return WorkplaceAssistantResponse.echo(body, reward=0.0 if differing else 1.0, tables_differing=differing)
