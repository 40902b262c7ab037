"""NeMo-Gym's verifier fixtures (`nemo_gym.verifier_fixture`): a folder's JSONL table of scorer cases, checked
without a server.

Each line of `cases_path` is `{name, kind, request, expected_reward | expected_error}`; `kind` is `full_reward` (must
score the best end of `reward_range`), `zero_reward` (the worst end), `malformed` (must raise an error whose text
holds `expected_error`) or `determinism` (a seeded verifier scores it the same on two fresh servers).
`exercise_verifier_fixture` builds a fresh server (`server_factory()`) per case, validates the case's request with
`request_model` and awaits `verify` (or the fixture's `invoke`); every case must give its `expected_reward`.
`update_expected=True` (NeMo-Gym rewrites the file with the observed rewards) is refused here.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CaseKind = Literal["full_reward", "zero_reward", "malformed", "determinism"]
Invocation = Callable[[object, BaseModel], object | Awaitable[object]]


class VerifierFixtureError(ValueError):
    """A fixture is invalid, or the verifier does not behave as it says."""


@dataclass(frozen=True)
class VerifierFixture:
    """Where a folder's scorer cases live and how to build and call its verifier."""

    server_factory: Callable[[], object]
    request_model: type[BaseModel]
    cases_path: str | Path
    invoke: Invocation | None = None
    reseed: Invocation | None = None


class VerifierFixtureCase(BaseModel):
    """One line of a fixture file."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    name: str = Field(min_length=1)
    kind: CaseKind
    request: dict[str, Any]
    expected_reward: float | None = Field(default=None, allow_inf_nan=False)
    expected_error: str | None = None

    @model_validator(mode="after")
    def _one_expectation(self) -> VerifierFixtureCase:
        if self.kind == "malformed":
            if self.expected_error is None or self.expected_reward is not None:
                raise ValueError("a malformed case needs expected_error (and no expected_reward)")
        elif self.expected_reward is None or self.expected_error is not None:
            raise ValueError(f"a {self.kind} case needs expected_reward (and no expected_error)")
        return self


@dataclass(frozen=True)
class VerifierFixtureResult:
    name: str
    kind: CaseKind
    observed_rewards: tuple[float, ...] = ()


def load_verifier_fixture(path: str | Path) -> list[VerifierFixtureCase]:
    """The cases of a fixture file.

    Raises:
        VerifierFixtureError: unreadable, empty, or a line that is not JSON or not a case (its line number named).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeError) as error:
        raise VerifierFixtureError(f"cannot read verifier fixture {path}: {error}") from error
    cases = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            cases.append(VerifierFixtureCase.model_validate(json.loads(line)))
        except json.JSONDecodeError as error:
            raise VerifierFixtureError(f"{path}:{number}: not JSON: {error.msg}") from error
        except ValidationError as error:
            raise VerifierFixtureError(f"{path}:{number}: {error.errors(include_url=False)[0]['msg']}") from error
    if not cases:
        raise VerifierFixtureError(f"verifier fixture {path} has no cases")
    return cases


def _reward(result: object, case: VerifierFixtureCase) -> float:
    reward = result.get("reward") if isinstance(result, Mapping) else getattr(result, "reward", result)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise VerifierFixtureError(f"case {case.name!r}: the verifier returned no finite reward: {reward!r}")
    return float(reward)


async def _score(fixture: VerifierFixture, case: VerifierFixtureCase, *, reseed: bool = False) -> float:
    server = fixture.server_factory()
    request = fixture.request_model.model_validate(case.request)
    if reseed:
        if fixture.reseed is None:
            raise VerifierFixtureError("a determinism case of a seeded verifier needs the fixture's reseed")
        seeded = fixture.reseed(server, request)
        if inspect.isawaitable(seeded):
            await seeded
    result = fixture.invoke(server, request) if fixture.invoke is not None else server.verify(request)
    return _reward(await result if inspect.isawaitable(result) else result, case)


async def exercise_verifier_fixture(fixture: VerifierFixture, *, reward_range: Sequence[float],
                                    higher_is_better: bool = True, determinism: Any,
                                    update_expected: bool = False) -> tuple[VerifierFixtureResult, ...]:
    """Check every case of `fixture` (module docstring); the results in file order.

    Raises:
        VerifierFixtureError: a bad argument or fixture, a required kind missing, or a case the verifier fails.
    """
    if update_expected:
        raise VerifierFixtureError("update_expected=True is not supported: edit the fixture file's expected_reward")
    lower, upper = (float(value) for value in reward_range)
    if not (math.isfinite(lower) and math.isfinite(upper) and lower <= upper):
        raise VerifierFixtureError(f"reward_range must be two finite numbers, lower first: {reward_range!r}")
    best, worst = (upper, lower) if higher_is_better else (lower, upper)
    mode = str(getattr(determinism, "value", determinism))
    if mode not in ("seeded", "stochastic", "unknown"):
        raise VerifierFixtureError(f"determinism must be seeded, stochastic or unknown, not {mode!r}")
    cases = load_verifier_fixture(fixture.cases_path)
    required = {"full_reward", "zero_reward", "malformed"} | ({"determinism"} if mode == "seeded" else set())
    missing = sorted(required - {case.kind for case in cases})
    if missing:
        raise VerifierFixtureError(f"verifier fixture {fixture.cases_path} lacks cases of kind {', '.join(missing)}")
    results = []
    for case in cases:
        if case.kind == "determinism" and mode != "seeded":
            continue
        if case.kind == "malformed":
            try:
                await _score(fixture, case)
            except VerifierFixtureError:
                raise
            except Exception as error:  # the case's point: the verifier must refuse this request
                if case.expected_error not in str(error):
                    raise VerifierFixtureError(f"malformed case {case.name!r}: the error does not mention "
                                               f"{case.expected_error!r}: {error}") from error
            else:
                raise VerifierFixtureError(f"malformed case {case.name!r} raised no error")
            results.append(VerifierFixtureResult(case.name, case.kind))
            continue
        observed = [await _score(fixture, case, reseed=case.kind == "determinism")]
        if case.kind == "determinism":
            observed.append(await _score(fixture, case, reseed=True))
        pinned = {"full_reward": best, "zero_reward": worst}.get(case.kind)
        for value in observed:
            if not lower <= value <= upper:
                raise VerifierFixtureError(f"case {case.name!r}: reward {value} outside [{lower}, {upper}]")
        if pinned is not None and observed[0] != pinned:
            raise VerifierFixtureError(f"case {case.name!r} ({case.kind}) must score {pinned}, scored {observed[0]}")
        if len(set(observed)) > 1:
            raise VerifierFixtureError(f"determinism case {case.name!r} changed on a fresh server: {observed}")
        if observed[0] != case.expected_reward:
            raise VerifierFixtureError(f"case {case.name!r}: expected {case.expected_reward}, scored {observed[0]}")
        results.append(VerifierFixtureResult(case.name, case.kind, tuple(observed)))
    return tuple(results)
