"""Fixtures: one real sandbox server for this folder (its object kept, to count its sessions), and a fleet of real
servers per rollout: scripted model ⇄ swe_agent ⇄ swebench ⇄ sandbox, each uvicorn on an ephemeral port."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import psutil
import pytest

from agents.swe_agent.app import SWEAgent
from gymfleet.testing import serve, wait_until
from gymfleet.testing.fleets import agent_fleet
from resources_servers.swebench.app import SWEBenchServer
from responses_api_models.scripted_model.app import ScriptedModel
from sandbox.app import SandboxServer
from sandbox.tests.conftest import fork_server_or_idle

ROWS = [json.loads(line) for line in (Path(__file__).parents[1] / "data/example.jsonl").read_text().splitlines()]
BY_NAME = {row["repo"].split("/")[1]: row for row in ROWS}


@pytest.fixture(scope="module")
def sandbox():
    """(URL, server object) of a real bubblewrap sandbox service."""
    server = SandboxServer({"name": "sandbox", "max_sessions": 64})
    with serve(server.create_app()) as url:
        yield url, server


def script(row: dict, calls: list[tuple[str, dict]], final: str = "Done.", **rule_fields) -> list[dict]:
    """Scripted-model rules making `calls` one per turn for `row`'s issue, then a closing message."""
    match = re.escape(row["responses_create_params"]["input"][-1]["content"][:60])
    rules = [{"match": match, "turn": turn, "tool_calls": [{"name": name, "arguments": arguments}], **rule_fields}
             for turn, (name, arguments) in enumerate(calls)]
    return rules + [{"match": match, "turn": len(calls), "text": final}]


@contextlib.contextmanager
def fleet(sandbox_url: str, rules: list[dict], *, model_fields: dict | None = None, agent_fields: dict | None = None,
          env_fields: dict | None = None):
    """Yields (`/run` URL, swebench server) for a scripted model following `rules`."""
    env = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": sandbox_url, **(env_fields or {})})
    model = ScriptedModel({"name": "llm", "rules": rules, **(model_fields or {})})
    with agent_fleet(SWEAgent, env, model, env_name="swebench", model_timeout_s=30, **(agent_fields or {})) as url:
        yield url + "/run", env


def sandbox_children() -> list[psutil.Process]:
    """Sandbox processes started by this test process (as the sandbox uid, or bwrap itself), but the fork server's
    own and the one-shot runs it prepared ahead (`sandbox.forkserver`)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if (child.uids().real == 65534 or child.name() == "bwrap") and not fork_server_or_idle(child):
                found.append(child)
    return found


def assert_sessions_closed(sandbox_server: SandboxServer) -> None:
    """No session open in the sandbox and none of its processes left (they may take a moment to be reaped)."""
    wait_until(lambda: len(sandbox_server.sessions) == 0, "every sandbox session of the rollout closed",
               interval_s=0.05, explain=lambda: f"open: {list(sandbox_server.sessions)}")
    wait_until(lambda: not sandbox_children(), "every sandbox process of the rollout exited", interval_s=0.05,
               explain=lambda: f"left: {sandbox_children()}")
