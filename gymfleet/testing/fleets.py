"""Small in-process fleets for tests: real servers, each on its own port, wired by a `global_config` dict.

`served` serves a built server; `server_block` is the config block that names one served instance;
`judge_fleet` names a judge model (`refuses_misspelt_judge`: an environment whose judge's name is misspelt fails at
start-up; `unjudged_answers`: the answers a judged environment scores without its judge); `judged` serves an
environment with a judge model behind it (`judged_by`: the judge's rules and the config's fields as arguments;
`judged_fixtures`: as a test module's `judge_url` and `url` fixtures; `url_fixtures`: module fixtures from any such
server); `agent_fleet` serves a resources server and a model server with an agent in front of them; `post_verify`
posts one `/verify` and checks its status; `datasets_config` writes a config giving a recipe's agent its datasets;
`buffer_body` lets an ASGI wrapper in front of a stand-in read a request's body and still pass it on;
`ReleasedVerifies` is a resources server whose `/verify` answers each row only when the test releases it. The servers
are passed in (built by the test), so this module imports no environment, model or agent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from gymfleet.errors import ServerRefError
from gymfleet.serving.resources import ResourcesServer, SeedSessionRequest, VerifyRequest, VerifyResponse
from gymfleet.testing import serve
from gymfleet.wire import make_response


def server_block(kind: str, impl: str, url: str) -> dict[str, Any]:
    """`{kind: {impl: {host, port}}}`: one instance's block of a `global_config`, for a server served at `url`."""
    parts = urlsplit(url)
    return {kind: {impl: {"host": parts.hostname, "port": parts.port}}}


def judge_fleet(judge_url: str, name: str = "judge_model") -> dict[str, Any]:
    """A `global_config` naming the scripted model served at `judge_url` as the instance `name`."""
    return {name: server_block("responses_api_models", "scripted_model", judge_url)}


def refuses_misspelt_judge(server_cls: Any, config: dict[str, Any], fleet: dict[str, Any], *,
                           match: str = "judge_model", field: str = "judge_model_server") -> Any:
    """Build `server_cls` with its judge (`config[field]`) misspelt as `judge_modle` in `fleet` (which names
    `judge_model`) and check that its start-up raises a `ServerRefError` matching `match`; returns the server."""
    import pytest  # test helpers only: the rest of this module runs without pytest

    server = server_cls({**config, field: "judge_modle"}, fleet)
    with pytest.raises(ServerRefError, match=match):
        asyncio.run(server.startup())
    return server


def unjudged_answers(answer: str, too_long: str) -> Any:
    """`pytest.mark.parametrize("text, skipped", ...)` over the answers a judged environment scores 0 without
    asking its judge: none at all (empty, blank, no message, only a think block, an unclosed one) is
    `empty_response`; `too_long` (longer than the environment's bound) is `response_too_long`."""
    import pytest  # test helpers only: the rest of this module runs without pytest

    return pytest.mark.parametrize(
        ("text", "skipped"),
        [("", "empty_response"), ("   \n ", "empty_response"), (None, "empty_response"),
         (f"<think>{answer}</think>\n", "empty_response"), (f"<think>{answer}", "empty_response"),
         (too_long, "response_too_long")],
        ids=["empty", "blank", "no-message", "only-think-block", "unclosed-think", "huge"],
    )


@contextmanager
def served(server: Any) -> Iterator[str]:
    """Serve `server` (a built gymfleet server: its `create_app()`); yields its URL."""
    with serve(server.create_app()) as url:
        yield url


@contextmanager
def judged(server_cls: Any, config: dict[str, Any], judge: Any, name: str = "judge_model") -> Iterator[str]:
    """Serve a `server_cls(config)` environment that reaches `judge` as the instance `name`; yields its URL.
    `judge` is a model server (served here, for as long as the environment) or the URL of one already served."""
    with ExitStack() as stack:
        judge_url = judge if isinstance(judge, str) else stack.enter_context(serve(judge.create_app()))
        yield stack.enter_context(serve(server_cls(config, judge_fleet(judge_url, name)).create_app()))



def judged_by(server_cls: Any, base: dict[str, Any], model_cls: Any,
              rules: Any) -> Callable[..., AbstractContextManager[str]]:
    """`judged(rules=rules, **config)` for one environment's tests: serves `server_cls({**base, **config})` with the
    model server `model_cls({"name": "judge_model", "rules": rules})` (a scripted model) behind it as `judge_model`;
    yields the environment's URL."""
    def serve_judged(rules: Any = rules, **config: Any) -> AbstractContextManager[str]:
        return judged(server_cls, {**base, **config}, model_cls({"name": "judge_model", "rules": rules}))

    return serve_judged

def url_fixtures(make: Callable[..., AbstractContextManager[str]], **fixtures: dict[str, Any]) -> list[Any]:
    """Module-scoped pytest fixtures, one per keyword (its name -> the keyword arguments for `make`), each yielding
    the URL `make(**arguments)` serves. Assign them to the module's names: `url, slow_url = url_fixtures(...)`."""
    import pytest  # test helpers only: the rest of this module runs without pytest

    def fixture(name: str, arguments: dict[str, Any]) -> Any:
        def serving() -> Iterator[str]:
            with make(**arguments) as url:
                yield url

        return pytest.fixture(serving, scope="module", name=name)

    return [fixture(name, arguments) for name, arguments in fixtures.items()]


def judged_fixtures(server_cls: Any, config: dict[str, Any], model_cls: Any, rules: Any,
                    **judge: Any) -> tuple[Any, Any]:
    """A test module's `judge_url` (the model server `model_cls({"name": "judge_model", "rules": rules, **judge})`, a
    scripted model, served) and `url` (`server_cls(config)` reaching it as `judge_model`) fixtures, module-scoped:
    `judge_url, url = judged_fixtures(...)`."""
    import pytest

    @pytest.fixture(scope="module", name="judge_url")
    def judge_url() -> Iterator[str]:
        with served(model_cls({"name": "judge_model", "rules": rules, **judge})) as url:
            yield url

    @pytest.fixture(scope="module", name="url")
    def url(judge_url: str) -> Iterator[str]:
        with judged(server_cls, config, judge_url) as base:
            yield base

    return judge_url, url

@contextmanager
def agent_fleet(agent_cls: Any, env: Any, model: Any, *, env_name: str, **agent_fields: Any) -> Iterator[str]:
    """Serve `env` (a resources server, instance `env_name`), `model` (a scripted model, instance `llm`) and an
    `agent_cls` agent over both (its config: `agent_fields`); yields the agent's URL."""
    with serve(env.create_app()) as env_url, serve(model.create_app()) as model_url:
        config = {env_name: server_block("resources_servers", env_name, env_url),
                  "llm": server_block("responses_api_models", "scripted_model", model_url)}
        agent = agent_cls({"name": "agent", "resources_server": env_name, "model_server": "llm", **agent_fields},
                          config)
        with serve(agent.create_app(), intake=agent.intake) as agent_url:  # as a fleet serves it
            yield agent_url


def datasets_config(path: Path, recipe: str, agent: str, impl: str, datasets: list[dict[str, Any]]) -> Path:
    """Write at `path` a config that loads `recipe` and gives its agent instance `agent` (implementation `impl`)
    `datasets` (each `{name, type, jsonl_fpath, ...}`, as `ng_prepare_data` reads them); returns `path`."""
    config = {"config_paths": [recipe], agent: {"responses_api_agents": {impl: {"datasets": datasets}}}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def post_verify(url: str, row: dict[str, Any], text: str | None, status: int = 200, *, timeout: float = 60,
                **response: Any) -> dict[str, Any]:
    """POST `row` with a response saying `text` (`make_response(text, **response)`) to `url`/verify; asserts the
    HTTP `status`, returns the body."""
    answer = httpx.post(f"{url}/verify", json={**row, "response": make_response(text, **response)}, timeout=timeout)
    assert answer.status_code == status, answer.text
    return answer.json()


async def buffer_body(receive: Any) -> tuple[bytes, Any]:
    """Read an ASGI request's whole body from `receive`; returns it and a `receive` for the wrapped app, which
    hands the body on once and then defers to the original (for the disconnect)."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return body, replay


class ReleasedVerifies(ResourcesServer):
    """Records each row's `idx` as its rollout starts (`/seed_session`) and ends (`/verify`); with `gated`, a row's
    `/verify` answers only once the test has `release`d its idx (a row never released fails after `hang_bound_s`)."""

    def __init__(self, *args: Any, gated: bool = True, hang_bound_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gated, self.hang_bound_s = gated, hang_bound_s
        self.started: list[int] = []
        self.finished: list[int] = []
        self.active = self.peak = 0
        self._released: set[int] = set()

    def release(self, *indices: int) -> None:
        self._released.update(indices)

    async def seed_session(self, body: SeedSessionRequest) -> dict:
        self.started.append(body.model_extra["idx"])
        self.active += 1
        self.peak = max(self.peak, self.active)
        return {}

    async def verify(self, body: VerifyRequest) -> VerifyResponse:
        idx = body.model_extra["idx"]
        deadline = time.monotonic() + self.hang_bound_s
        while self.gated and idx not in self._released:
            assert time.monotonic() < deadline, f"row {idx} was never released"
            await asyncio.sleep(0.005)
        self.active -= 1
        self.finished.append(idx)
        return VerifyResponse.echo(body, reward=1.0)
