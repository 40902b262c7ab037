"""example_weather: the smallest multi-turn tool environment — look the weather up, then report it.

The user asks about one city's weather. The model should call `get_weather` for that city, read the forecast, and
answer with the forecast's condition. The server records every `get_weather` call of the rollout (per session), so
the reward depends on what the model actually looked up, not on what its transcript claims.

## Task fields
- `expected_city`: the city the user asks about; one of the cities in `FORECASTS` (matched case-insensitively).
- `responses_create_params.tools` should declare `get_weather` (see `data/example.jsonl`).
- Any other field is echoed untouched.

## Reward
1.0 iff, in this rollout's session, the model called `get_weather` with `expected_city` (case and surrounding
whitespace ignored) and its final answer (the text of the last assistant message) names that city's forecast
condition as a word (e.g. "sunny") and no other condition of `FORECASTS` (an answer hedging "sunny or rainy"
scores 0.0), else 0.0. Calls with bad arguments, calls for other cities, an answer without a call, or an empty
answer score 0.0. The response adds `tool_calls_made` (number of `get_weather` calls that
reached the tool), `expected_city` and `reason` (why the reward is 0, else null).

## Config
No fields of its own (`domain: agent`).

## Tools
- `get_weather(city: str)`: `{"city", "condition", "temperature_c"}` from the built-in table `FORECASTS`; an
  unknown city answers `{"error": "..."}` listing the known cities, which the model can read and retry.

A `get_weather` call or `/verify` whose session was seeded before this server crashed and was restarted answers
HTTP 410 `session_lost` (the calls it recorded are gone; `gymfleet.serving.sessions`), which the agent ends as a
failure row, not a reward of 0.0; so does a `/verify` whose session is not open (never seeded, or evicted past
`MAX_SESSIONS` open sessions).

## Version history
- v1: initial.
- v2: an answer that names any other forecast condition besides the right one scores 0.0 (a policy looking up
  every city and listing every condition was paid; found by `tests/test_reward_probes.py`).
- v3: `/verify` on a session that is not open (evicted, never seeded) is a 410 `session_lost` failure instead of a
  reward of 0.0 computed on no calls.
"""

from __future__ import annotations

import re
from collections import OrderedDict

from pydantic import BaseModel, ConfigDict

from gymfleet.errors import SessionLostError
from gymfleet.grading.answers import normalize
from gymfleet.serving.resources import ResourcesServer, SeedSessionRequest, VerifyRequest, VerifyResponse
from gymfleet.serving.sessions import session_id
from gymfleet.wire import Response

FORECASTS: dict[str, tuple[str, int]] = {
    "paris": ("sunny", 24),
    "london": ("rainy", 14),
    "tokyo": ("cloudy", 19),
    "oslo": ("snowy", -3),
    "chicago": ("windy", 11),
    "san francisco": ("foggy", 16),
    "cairo": ("sunny", 35),
}
"""City (normalized) -> (condition, temperature in °C). Deterministic on purpose: the reward must be too."""
MAX_SESSIONS = 100_000
"""Sessions kept at once (a record stays after /verify, so verifying again scores it again); the oldest are dropped
first, so rollouts that never reach /verify cannot grow memory without bound."""


class GetWeatherRequest(BaseModel):
    """`get_weather` arguments."""

    model_config = ConfigDict(extra="forbid")
    city: str


class ExampleWeatherRequest(VerifyRequest):
    """A row to grade."""

    expected_city: str


class ExampleWeatherResponse(VerifyResponse):
    """The graded row."""

    expected_city: str
    tool_calls_made: int
    reason: str | None = None


def final_answer(response: Response) -> str:
    """Text of the last assistant message of the episode ("" when there is none)."""
    messages = [item for item in response.output if item.type == "message"]
    if not messages:
        return ""
    return "".join(getattr(part, "text", "") for part in messages[-1].content if part.type == "output_text")


def score(cities_asked: list[str], answer: str, expected_city: str) -> tuple[float, str | None]:
    """`(reward, reason)` for a rollout that looked up `cities_asked` (normalized) and answered `answer`."""
    city = normalize(expected_city)
    if city not in FORECASTS:
        return 0.0, f"expected_city {expected_city!r} is not in the forecast table"
    if city not in cities_asked:
        return 0.0, f"get_weather was not called for {expected_city!r} (called for {cities_asked})"
    condition = FORECASTS[city][0]
    if not re.search(rf"\b{condition}\b", answer, re.IGNORECASE):
        return 0.0, f"the final answer does not say {condition!r}"
    others = sorted({c for c, _ in FORECASTS.values() if c != condition and re.search(rf"\b{c}\b", answer, re.I)})
    if others:
        return 0.0, f"the final answer hedges: it also says {others}"
    return 1.0, None


class ExampleWeatherServer(ResourcesServer):
    """Serves `get_weather` and grades the rollout from the calls it recorded."""

    reverify_mode = "unsupported"  # the reward needs the session's recorded calls
    reward_libraries = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._calls: OrderedDict[str, list[str]] = OrderedDict()

    async def seed_session(self, body: SeedSessionRequest) -> dict:
        self._calls[session_id()] = []
        while len(self._calls) > MAX_SESSIONS:
            self._calls.popitem(last=False)
        return {}

    async def get_weather(self, body: GetWeatherRequest) -> dict:
        city = normalize(body.city)
        calls = self._calls.get(session_id())
        if calls is not None:
            calls.append(city)
        if city not in FORECASTS:
            known = ", ".join(name.title() for name in FORECASTS)
            return {"error": f"no forecast for {body.city!r}; known cities: {known}"}
        condition, temperature_c = FORECASTS[city]
        return {"city": body.city.strip(), "condition": condition, "temperature_c": temperature_c}

    async def verify(self, body: ExampleWeatherRequest) -> ExampleWeatherResponse:
        cities = self._calls.get(session_id())  # kept (the oldest evicted past MAX_SESSIONS): verify repeats
        if cities is None:  # scoring an empty record would turn an evicted rollout's 1.0 into a silent 0.0
            raise SessionLostError(
                f"no record of this rollout's get_weather calls: its session was never seeded, or was evicted past "
                f"{MAX_SESSIONS} open sessions; run it again from /seed_session"
            )
        reward, reason = score(cities, final_answer(body.response), body.expected_city)
        return ExampleWeatherResponse.echo(body, reward=reward, tool_calls_made=len(cities), reason=reason)
