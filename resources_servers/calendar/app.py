"""calendar: multi-turn calendar scheduling; the model's latest calendar must satisfy every event's constraints.

The conversation (user requests and the assistant's earlier calendars) is in the prompt; the model answers with the
whole calendar as a JSON list of `{"event_id", "event_name", "start_time": "HH:MM", "duration": minutes}`.

## Task fields
- `exp_cal_state`: event id (string key) -> `{event_id, duration, constraint, min_time, max_time}`: the duration in
  minutes, a constraint ("before 1:45pm", "after 10am", "between 10am and 11:45am", "at 2pm" or null) and the
  window the event must fit in. Times are written "10am", "1:45pm" or "13:30". A constraint with another prefix
  places no constraint (NeMo-Gym's rule); a known prefix with an unreadable time is a malformed row (422).
- Any other field is echoed untouched.

## Reward
1.0 when the calendar satisfies everything, else 0.0. The text read is the first content part of the response's
last output item (NeMo-Gym's rule: an output ending in a tool call has none). In order:
1. Empty text, or text containing `<think>`, scores 0.
2. An empty `exp_cal_state` scores 1 (nothing to check).
3. The calendar is the last `[...]` span holding an object, found as NeMo-Gym's regex finds such spans (see
   `schedule.event_lists`; computed in linear time), parsed as JSON; none, or invalid JSON, scores 0. An answer
   that shows a draft, or the previous calendar, before its final one is graded on the final one.
4. Every entry needs an `event_id`, a finite numeric `duration` and a `start_time` clock time; each id may appear
   once (ids compare as strings, so `0` and `"0"` are one id); the number of ids must equal the number of expected
   events; no two entries may overlap (`[start, start + duration)`); each expected event must be present with the
   same duration, inside `[min_time, max_time]`, and meet its constraint (before T: end <= T; after T: start >= T;
   between X and Y: start >= X and end <= Y; at T: start == T).
The response adds `reason` (`pass` or why not: `empty_response`, `think_found`, `no_json_list`, `too_many_events`,
`malformed_event`, `duplicate_event`, `different_number_of_events`, `conflicting_events`, `unknown_event`,
`constraint_violated`) and `extracted_answer` (the calendar text graded, or null). Clock times must be valid
("10:75" or "25:00" do not parse, where NeMo-Gym's parser would read them as 11:15 and 1am next day); a calendar of
more than 200 entries scores 0.

## Departures from NeMo-Gym
- The last list is graded; NeMo-Gym grades the first, so a correct draft followed by a different, wrong final
  calendar (or two alternatives, the first correct) scores 1.0 there.
- An event id listed twice is `duplicate_event`. NeMo-Gym keeps the last entry for an id and skips the overlap check
  between identical entries, so an event listed twice, or placed in several free slots with its last one valid,
  scores 1.0 there.
- Invalid clock times and calendars of more than 200 entries (above).

## Config
No fields of its own (`domain: agent`). Grading runs in a worker thread, so a pathological answer never blocks the
event loop.

## Tools
None.

## Version history
- v1: NeMo-Gym's calendar checks, with a linear-time equivalent of its list-finding regex.
- v2: the final (last) calendar list is graded; an event id listed more than once is `duplicate_event`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from gymfleet.wire import Response
from resources_servers.calendar.schedule import Constraint, Expected, Reason, parse_time, score


class CalendarConfig(ResourcesServerConfig):
    """calendar's fields (none of its own)."""


class ExpectedEvent(BaseModel):
    """One event the final calendar must hold."""

    model_config = ConfigDict(extra="allow")
    event_id: int | str | None = None
    duration: float = Field(gt=0)
    constraint: str | None = None
    min_time: str
    max_time: str

    @model_validator(mode="after")
    def _times_parse(self) -> ExpectedEvent:
        self.expected()
        return self

    def expected(self) -> Expected:
        """The event as the grader reads it."""
        return Expected(
            self.duration, parse_time(self.min_time), parse_time(self.max_time), Constraint.parse(self.constraint)
        )


class CalendarRequest(VerifyRequest):
    """A row to grade."""

    exp_cal_state: dict[str, ExpectedEvent]


class CalendarResponse(VerifyResponse):
    """The graded row."""

    reason: Reason
    extracted_answer: str | None = None


def answer_text(response: Response) -> str:
    """The first content part's text of the last output item ("" when it has none)."""
    if not response.output:
        return ""
    content: Any = getattr(response.output[-1], "content", None)
    if not isinstance(content, list) or not content:
        return ""
    part = content[0]
    text = part.get("text") if isinstance(part, dict) else getattr(part, "text", None)
    return text if isinstance(text, str) else ""


class CalendarServer(ResourcesServer):
    """Grades calendars against the expected events."""

    config: CalendarConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    async def verify(self, body: CalendarRequest) -> CalendarResponse:
        expected = {event_id: event.expected() for event_id, event in body.exp_cal_state.items()}
        reward, reason, found = await asyncio.to_thread(score, answer_text(body.response), expected)
        return CalendarResponse.echo(body, reward=reward, reason=reason, extracted_answer=found)
