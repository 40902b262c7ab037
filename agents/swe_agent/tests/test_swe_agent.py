"""swe_agent's own rules: which model errors mean "the context is full", a conversation budget, a seed failure that
skips the episode, and a model failure that is not about the context still failing the rollout (502)."""

from __future__ import annotations

import httpx
import pytest

from agents.swe_agent.app import is_context_overflow
from gymfleet import http
from gymfleet.errors import TransportError
from gymfleet.grading.text import clip_middle
from gymfleet.testing import free_port, serve
from resources_servers.swebench.tests.conftest import BY_NAME, assert_sessions_closed, fleet, script
from sandbox.app import SandboxServer

ROW = BY_NAME["spans"]


@pytest.fixture(scope="module")
def sandbox():
    server = SandboxServer({"name": "sandbox"})
    with serve(server.create_app()) as url:
        yield url, server


@pytest.mark.parametrize("status, body, overflow", [
    (400, b'{"error": {"message": "This model\'s maximum context length is 32768 tokens."}}', True),
    (400, b'{"error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"}}', True),
    (400, b'{"error": {"message": "temperature must be <= 2"}}', False),
    (502, b'{"detail": "maximum context length", "error_type": "upstream_error"}', False),  # not the prompt's fault
    (None, None, False),
], ids=["vllm_400", "anthropic_style", "other_400", "502", "connection_error"])
def test_context_overflow_is_a_4xx_about_the_context(status, body, overflow):
    error = TransportError("HTTP error", status=status, response_content=body)
    assert is_context_overflow(error) is overflow


def test_cut_keeps_both_ends():
    assert clip_middle("a" * 50 + "b" * 50, 20) == "a" * 10 + "\n[... 80 characters cut ...]\n" + "b" * 10
    assert clip_middle("abc", 20) == "abc"


def test_a_conversation_budget_stops_before_the_model_call(sandbox):
    url, sandbox_server = sandbox
    calls = [("bash", {"command": "seq 1 2000"})] * 10
    with fleet(url, script(ROW, calls), agent_fields={"max_context_chars": 30_000}) as (run_url, _):
        result = httpx.post(run_url, json=ROW, timeout=120).json()
    assert result["agent_stop_reason"] == "context_limit" and 1 < result["agent_steps"] < 10
    assert (result["reward"], result["reason"]) == (0.0, "empty_patch")
    assert_sessions_closed(sandbox_server)


def test_a_seed_failure_skips_the_episode_and_verify_reports_it():
    dead = f"http://127.0.0.1:{free_port()}"
    with fleet(dead, script(ROW, [("bash", {"command": "ls"})])) as (run_url, env):
        env.sandbox.retry = http.RetryPolicy(max_attempts=1)
        result = httpx.post(run_url, json=ROW, timeout=120).json()
    assert result["agent_stop_reason"] == "seed_failed" and result["agent_steps"] == 0
    assert result["_ng_failure_class"] == "sandbox_failed" and result["response"]["output"] == []


def test_a_model_error_that_is_not_the_context_fails_the_rollout(sandbox):
    url, sandbox_server = sandbox
    rules = [{"match": ".", "status": 500, "error_message": "engine crashed"}]
    with fleet(url, rules) as (run_url, env):
        answer = httpx.post(run_url, json=ROW, timeout=120)
        assert answer.status_code == 502, answer.text
        env_sessions = len(env.workspaces)
    assert env_sessions == 1  # left to the idle expiry (and to shutdown, which closed it)
    assert_sessions_closed(sandbox_server)
