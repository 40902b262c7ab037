"""The resources-server contract over real HTTP: cookies, tools, echo, failure classes, error mapping."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest
from pydantic import BaseModel

from gymfleet import auth
from gymfleet.errors import JudgeError, SandboxError, TransportError
from gymfleet.fleet.credential import ServerAnswer, probe_server
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.serving.sessions import SESSION_LOST, session_id
from gymfleet.testing import make_response, serve


class Counter(BaseModel):
    step: int = 1


class Behaviour(VerifyRequest):
    behave: str = "ok"


class DemoServer(ResourcesServer):
    """Counts per session; /verify misbehaves on request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.counts: dict[str, int] = {}

    async def bump(self, body: Counter) -> dict:
        self.counts[session_id()] = self.counts.get(session_id(), 0) + body.step
        return {"count": self.counts[session_id()]}

    async def explode(self, body: Counter) -> dict:
        raise RuntimeError("tool bug")

    async def verify(self, body: Behaviour) -> VerifyResponse:
        match body.behave:
            case "judge_down":
                raise JudgeError("judge unreachable")
            case "sandbox_down":
                raise SandboxError("sandbox unreachable")
            case "inner_call":
                raise TransportError("cannot reach judge", url="http://judge")
            case "hang":
                await asyncio.sleep(30)
            case "bug":
                raise KeyError("row field")
            case "nan":
                return VerifyResponse.echo(body, reward=float("nan"))
        return VerifyResponse.echo(body, reward=0.5, count=self.counts.get(session_id(), 0))


@pytest.fixture(scope="module")
def url():
    server = DemoServer({"name": "demo", "domain": "other", "verify_timeout_s": 0.5})
    with serve(server.create_app()) as base:
        yield base


def _row(behave="ok", **extra):
    return {"responses_create_params": {"input": "q"}, "response": make_response("a"), "behave": behave, **extra}


def test_cookie_has_nemo_gym_name_and_signed_session_id(url):
    response = httpx.post(f"{url}/seed_session", json={"responses_create_params": {"input": "q"}})
    assert list(response.cookies) == ["DemoServer___demo"]
    payload = response.cookies["DemoServer___demo"].split(".")[0]
    session = json.loads(base64.b64decode(payload + "=" * (-len(payload) % 4)))
    assert set(session) == {"session_id"}


def test_state_follows_the_cookie_and_sessions_are_isolated(url):
    first = httpx.post(f"{url}/seed_session", json={}).cookies
    second = httpx.post(f"{url}/seed_session", json={}).cookies
    for _ in range(3):
        httpx.post(f"{url}/bump", json={"step": 2}, headers={"Cookie": _header(first)})
    assert httpx.post(f"{url}/bump", json={}, headers={"Cookie": _header(second)}).json() == {"count": 1}
    verified = httpx.post(f"{url}/verify", json=_row(), headers={"Cookie": _header(first)}).json()
    assert verified["count"] == 6


def test_tampered_cookie_gets_a_fresh_session(url):
    cookies = httpx.post(f"{url}/seed_session", json={}).cookies
    httpx.post(f"{url}/bump", json={}, headers={"Cookie": _header(cookies)})
    forged = {name: value[:-2] + "xx" for name, value in cookies.items()}
    assert httpx.post(f"{url}/bump", json={}, headers={"Cookie": _header(forged)}).json() == {"count": 1}


def test_verify_echoes_the_row_verbatim_and_adds_reward(url):
    row = _row(expected_answer="B", nested={"keep": [1, 2.5, None]}, _rowidx=7)
    result = httpx.post(f"{url}/verify", json=row).json()
    assert {key: result[key] for key in row} == row
    assert result["reward"] == 0.5


@pytest.mark.parametrize(
    ("behave", "failure_class"),
    [("judge_down", "judge_failed"), ("sandbox_down", "sandbox_failed"), ("inner_call", "transport_failed"),
     ("hang", "verify_timeout")],
)
def test_infrastructure_failures_are_tagged_rows_not_rewards(url, behave, failure_class):
    response = httpx.post(f"{url}/verify", json=_row(behave), timeout=10)
    assert response.status_code == 200
    result = response.json()
    assert result["_ng_failure_class"] == failure_class and result["failure"]
    metrics = httpx.get(f"{url}/metrics").text
    assert f'gymfleet_failures_total{{failure_class="{failure_class}",hop=' in metrics


@pytest.mark.parametrize("behave", ["bug", "nan"])
def test_our_bugs_are_logged_500s_with_a_json_reason(url, behave):
    response = httpx.post(f"{url}/verify", json=_row(behave))
    assert response.status_code == 500
    assert response.json()["error_type"] == "server_error" and "demo" in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (b"{not json", ["body", 1]),
        (b"[1, 2]", ["body"]),
        (json.dumps({"response": make_response("a")}).encode(), ["body", "responses_create_params"]),
        (json.dumps({"responses_create_params": {"input": "q", "temperature": "hot"},
                     "response": make_response("a")}).encode(), ["body", "responses_create_params", "temperature"]),
    ],
    ids=["bad-json", "not-object", "missing-params", "wrong-type-in-params"],
)
def test_malformed_verify_is_422_naming_the_field(url, body, loc):
    response = httpx.post(f"{url}/verify", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == loc


def test_bad_tool_arguments_are_readable_by_the_model(url):
    response = httpx.post(f"{url}/bump", json={"step": "many"})
    assert response.status_code == 200
    assert "invalid arguments for tool 'bump'" in response.json()["error"]


def test_tool_bug_is_500_and_server_keeps_serving(url):
    assert httpx.post(f"{url}/explode", json={}).status_code == 500
    assert httpx.get(f"{url}/").json() == {"status": "ok"}


def test_reverify_mode_and_aggregate_metrics(url):
    assert httpx.get(f"{url}/reverify_mode").json() == "unknown"
    results = [{"reward": 1.0, "_ng_task_index": 0}, {"reward": 0.0, "_ng_task_index": 0},
               {"reward": 1.0, "_ng_task_index": 1}, {"reward": 0.0, "_ng_failure_class": "judge_failed"}]
    metrics = httpx.post(f"{url}/aggregate_metrics", json={"verify_responses": results}).json()
    assert metrics["agent_metrics"]["mean/reward"] == pytest.approx(2 / 3)
    assert metrics["key_metrics"] == {"mean/reward": pytest.approx(2 / 3)}
    assert [group["mean/reward"] for group in metrics["group_level_metrics"]] == [0.5, 1.0]


class Notebook(ResourcesServer):
    """Keeps notes per session in memory (it overrides seed_session, so it keeps session state)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.notes: dict[str, list[int]] = {}

    async def seed_session(self, body) -> dict:
        self.notes[session_id()] = []
        return {}

    async def write(self, body: Counter) -> dict:
        notes = self.notes.get(session_id())
        if notes is None:
            return {"error": "Session not initialized. Please call seed_session first."}
        notes.append(body.step)
        return {"notes": len(notes)}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=float(len(self.notes.pop(session_id(), []))))


class Ledger(Notebook):
    """Keeps session state for its tools, but its reward does not read the session."""

    reverify_mode = "stateless"

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=1.0)


def _next_second() -> None:
    """Sleep into the next whole second: a server started then is a later process than a cookie signed before."""
    time.sleep(1.01 - time.time() % 1)


@pytest.fixture(scope="module")
def restarted():
    """Per server class: a cookie seeded (and used) by one process, and the URL of the same instance's next process,
    started in a later second, as `ng_run` restarts a crashed server (after at least a second)."""
    kinds = {"notebook": Notebook, "ledger": Ledger, "demo": DemoServer}
    cookies = {}
    for name, cls in kinds.items():
        with serve(cls({"name": name, "domain": "other"}).create_app()) as before:
            seeded = httpx.post(f"{before}/seed_session", json={}).cookies
            tool = "bump" if cls is DemoServer else "write"
            assert httpx.post(f"{before}/{tool}", json={}, headers={"Cookie": _header(seeded)}).status_code == 200
            cookies[name] = seeded
    _next_second()
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serve(cls({"name": name, "domain": "other"}).create_app()))
                for name, cls in kinds.items()}
        yield cookies, urls


def test_a_stateful_environment_refuses_a_session_from_its_earlier_process_as_session_lost(restarted):
    cookies, urls = restarted
    url, old = urls["notebook"], {"Cookie": _header(cookies["notebook"])}
    for route, body in (("/write", {}), ("/verify", _row())):
        answer = httpx.post(url + route, json=body, headers=old)
        assert answer.status_code == 410, answer.text
        assert answer.json()["error_type"] == SESSION_LOST
        assert "notebook" in answer.json()["detail"] and "earlier process" in answer.json()["detail"]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'gymfleet_failures_total{failure_class="session_lost",hop="local"} 2.0' in metrics

    reseeded = httpx.post(f"{url}/seed_session", json={}, headers=old)  # a rollout run again starts afresh
    assert reseeded.status_code == 200 and reseeded.cookies["Notebook___notebook"] != cookies["notebook"][
        "Notebook___notebook"]
    new = {"Cookie": _header(reseeded.cookies)}
    assert httpx.post(f"{url}/write", json={}, headers=new).json() == {"notes": 1}
    _next_second()  # a session this process started stays its own in later seconds
    assert httpx.post(f"{url}/write", json={}, headers=new).json() == {"notes": 2}
    assert httpx.post(f"{url}/verify", json=_row(), headers=new).json()["reward"] == 2.0


def test_an_environment_whose_reward_reads_no_session_still_verifies_an_earlier_processs_session(restarted):
    cookies, urls = restarted
    url, old = urls["ledger"], {"Cookie": _header(cookies["ledger"])}
    assert httpx.post(f"{url}/write", json={}, headers=old).json()["error_type"] == SESSION_LOST
    assert httpx.post(f"{url}/verify", json=_row(), headers=old).json()["reward"] == 1.0


def test_an_environment_without_session_state_serves_an_earlier_processs_cookie_on_a_fresh_session(restarted):
    cookies, urls = restarted
    answer = httpx.post(f"{urls['demo']}/bump", json={}, headers={"Cookie": _header(cookies["demo"])})
    assert answer.status_code == 200 and answer.json() == {"count": 1}
    assert answer.cookies["DemoServer___demo"] != cookies["demo"]["DemoServer___demo"]


def test_sessions_of_this_process_stay_its_own_when_the_clock_is_set_back(monkeypatch):
    """A cookie's age is its signing second: a clock set back after start-up must not make this process's own new
    sessions look like an earlier process's."""
    with serve(Notebook({"name": "clock", "domain": "other"}).create_app()) as url:
        httpx.get(url + "/")  # started
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - 30)
        seeded = httpx.post(f"{url}/seed_session", json={})
        answer = httpx.post(f"{url}/write", json={}, headers={"Cookie": _header(seeded.cookies)})
        assert answer.status_code == 200 and answer.json() == {"notes": 1}, answer.text


def _header(cookies) -> str:
    return "; ".join(f"{name}={value}" for name, value in cookies.items())


class WarmingServer(ResourcesServer):
    """Its `warm_up` waits for the test's word (`release`), then succeeds or fails."""

    def __init__(self, *args, release: threading.Event, fail: bool, **kwargs):
        super().__init__(*args, **kwargs)
        self.release, self.fail, self.loaded = release, fail, False

    def warm_up(self) -> None:
        self.release.wait(60)
        if self.fail:
            raise RuntimeError("model files missing")
        self.loaded = True

    async def bump(self, body: Counter) -> dict:
        return {"loaded": self.loaded}

    async def verify(self, body: Behaviour) -> VerifyResponse:
        return VerifyResponse.echo(body, reward=float(self.loaded))


class AsyncWarmingServer(WarmingServer):
    """The same, its `warm_up` an `async def` (run as a task on the server's loop, not in a thread). It waits for
    the release on the loop (polled): a thread blocked in `release.wait` would hold up the loop's closing (its
    default executor is joined) until the release, which a warm-up the server cancels never gets."""

    async def warm_up(self) -> None:
        deadline = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self.fail:
            raise RuntimeError("model files missing")
        self.loaded = True


@pytest.mark.parametrize("kind", [WarmingServer, AsyncWarmingServer], ids=["thread", "async"])
@pytest.mark.parametrize("fail", [False, True], ids=["warm-up-succeeds", "warm-up-fails"])
def test_verify_and_tools_wait_for_warm_up_and_its_failure_is_a_500_on_each(fail, kind):
    release = threading.Event()
    server = kind({"name": "warming"}, release=release, fail=fail)
    with serve(server.create_app()) as url, ThreadPoolExecutor(2) as pool:
        assert httpx.get(f"{url}/").status_code == 200  # up (ready) while warming
        calls = [pool.submit(httpx.post, f"{url}/verify", json=_row(), timeout=60),
                 pool.submit(httpx.post, f"{url}/bump", json={}, timeout=60)]
        assert httpx.post(f"{url}/verify", json={}, timeout=60).status_code == 422  # validation does not wait
        while _in_flight(url) < 3:  # both calls are in the server (and this /metrics request)
            assert not any(call.done() for call in calls), [call.result().text for call in calls if call.done()]
            time.sleep(0.01)
        assert not any(call.done() for call in calls)
        release.set()
        verify, tool = (call.result() for call in calls)
        if fail:
            assert (verify.status_code, tool.status_code) == (500, 500)
            assert "model files missing" in verify.json()["detail"]
            assert httpx.post(f"{url}/verify", json=_row()).status_code == 500
        else:
            assert (verify.json()["reward"], tool.json()) == (1.0, {"loaded": True})


PROBE_S = 30.0
"""A probe's timeout in these tests."""


@pytest.mark.parametrize("kind", [WarmingServer, AsyncWarmingServer], ids=["thread", "async"])
@pytest.mark.parametrize("fail", [False, True], ids=["warm-up-succeeds", "warm-up-fails"])
def test_a_warm_up_the_fleet_waits_for_is_told_to_its_probe(fail, kind):
    """With `ready_after_warm_up` (the sandbox's self-test), `GET /` tells the fleet's probe `warming` until the
    warm-up's verdict, then ready, or failed with its error; a probe that lets it wait gets the verdict the moment
    it is in. Without it (the default) a server is ready while it warms up. Another fleet's token learns nothing."""
    release = threading.Event()
    token = auth.new_token()
    auth.hold(token)
    try:
        gated = type("Gated", (kind,), {"ready_after_warm_up": True})({"name": "gated"}, release=release, fail=fail)
        plain = kind({"name": "plain"}, release=release, fail=fail)
        with serve(gated.create_app()) as url, serve(plain.create_app()) as plain_url, ThreadPoolExecutor(1) as pool:
            # A probe's 2 s default is for a fleet; here a bound a loaded machine's answer stays well within (a
            # timed-out probe is None too, which would make the test's `is None` pass for the wrong reason).
            assert probe_server(url, token, "gated", PROBE_S) == ServerAnswer(ready=False)
            assert probe_server(url, token, "gated", PROBE_S, 0.05) == ServerAnswer(ready=False)  # still no verdict
            assert probe_server(plain_url, token, "plain", PROBE_S) == ServerAnswer(ready=True)
            assert probe_server(url, auth.new_token(), "gated", PROBE_S) is None
            waiting = pool.submit(probe_server, url, token, "gated", PROBE_S, 60.0)
            headers = {auth.TOKEN_HEADER: token}
            while _in_flight(url, headers) < 2:  # the waiting probe (and this /metrics request) are in the server
                assert not waiting.done(), waiting.result()
                time.sleep(0.01)
            release.set()
            verdict = waiting.result()
            assert verdict == probe_server(url, token, "gated", PROBE_S)  # what it says from now on
        if fail:
            assert not verdict.ready and "model files missing" in verdict.failure
        else:
            assert verdict == ServerAnswer(ready=True)
    finally:
        release.set()
        auth.hold(None)


def test_an_async_warm_up_still_running_when_the_server_stops_is_cancelled():
    release = threading.Event()
    server = AsyncWarmingServer({"name": "warming"}, release=release, fail=False)
    try:
        with serve(server.create_app()) as url:
            assert httpx.get(f"{url}/").status_code == 200
        assert server._warming.done() and server._warm_up_task is None  # nothing waiting on it could hang
        with pytest.raises(RuntimeError, match="stopped while warming up"):
            server._warming.result()
        assert not server.loaded
    finally:
        release.set()


def _in_flight(url: str, headers: dict[str, str] | None = None) -> float:
    metrics = httpx.get(f"{url}/metrics", headers=headers).text
    return next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("gymfleet_requests_in_flight "))


def test_verify_answers_are_merged_exactly_as_model_dump_writes_them_whatever_the_values():
    """`_merge_result` reads plain values straight from the answer's fields; for every kind of value (generated) the
    merged row, keys in order, is the one `model_dump(mode="json")` of the added fields gives."""
    import enum
    import math
    import random
    import warnings

    from pydantic import Field, field_serializer

    from gymfleet.serving.resources import _added_fields, _merge_result, _plain_added, _plain_added_names

    class Colour(enum.Enum):
        RED = "red"

    class Answer(VerifyResponse):
        expected_answer: str
        extracted: object = None
        score: float = 0.0
        flag: bool | None = None

    class Hidden(VerifyResponse):
        shown: int = 0
        hidden: int = Field(default=0, exclude=True)

    class Shouting(VerifyResponse):
        word: str = ""

        @field_serializer("word")
        def _loud(self, value: str) -> str:
            return value.upper()

    row = {"responses_create_params": {"input": "q"}, "response": make_response("a"), "id": 1, "score": "raw"}
    body = VerifyRequest.model_validate(row)
    rng = random.Random(27)
    read_straight = 0
    values = [None, True, False, 0, -3, 2**70, 0.5, math.inf, -math.inf, math.nan, "", "é\u2028", [1, {"a": 2}],
              {"k": (1, 2)}, (3,), Colour.RED, b"x", 1.0]
    for _ in range(400):
        def pick(fitting: list) -> object:  # mostly a value of the field's type, else anything
            return rng.choice(fitting if rng.random() < 0.8 else values)

        answer = Answer.echo(body, reward=rng.choice([0.0, 1.0, 0.25, 1]), expected_answer=rng.choice(["1", "x"]),
                             extracted=pick([None, "", "é", 3, True, 0.5]), score=pick([0.5, 1.0, -2.0]),
                             flag=pick([None, True, False]))
        include = _added_fields(Answer, VerifyRequest)
        try:
            expected = {**row, **answer.model_dump(mode="json", include=include, warnings=False)}
        except Exception as exc:  # noqa: BLE001 - what model_dump refuses, the merge refuses the same way
            with pytest.raises(type(exc)):
                _merge_result(row, answer, VerifyRequest)
            continue
        if not (isinstance(expected["reward"], int | float) and math.isfinite(expected["reward"])):
            continue
        with warnings.catch_warnings():  # pydantic warns of values that do not fit their field; same output
            warnings.simplefilter("ignore")
            merged = _merge_result(row, answer, VerifyRequest)
        read_straight += _plain_added(answer, VerifyRequest) is not None
        assert json.dumps(merged, default=str) == json.dumps(expected, default=str)
        assert list(merged) == list(expected)
    assert read_straight > 20  # the generated answers exercised both ways
    assert [name for name, _ in _plain_added_names(Answer, VerifyRequest)] == [
        "reward", "expected_answer", "extracted", "score", "flag"]
    shouting = _merge_result(row, Shouting.echo(body, reward=1.0, word="hi"), VerifyRequest)
    assert shouting["word"] == "HI"
    hidden = _merge_result(row, Hidden.echo(body, reward=1.0, shown=1, hidden=2), VerifyRequest)
    assert (hidden["shown"], "hidden" in hidden) == (1, False)
