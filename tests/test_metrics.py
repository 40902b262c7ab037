"""`/metrics` answers questions (issue 14): route templates as labels, rewards per environment and task, failures by
class and hop, upstream latency per target, process metrics on every server, the head server included.

Servers are real (uvicorn on an ephemeral port, real HTTP); the last test runs `ng_collect_rollouts` against a real
quickstart fleet (subprocesses) and scrapes a resources server, a model server, an agent and the head server.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gymfleet import http, metrics
from gymfleet.cli.collect import main as collect_main
from gymfleet.errors import JudgeError
from gymfleet.metrics import MAX_LABEL_CHARS, MAX_TARGETS, MAX_TASKS, BoundedLabel, target_of, task_of
from gymfleet.serving.resources import ResourcesServer, VerifyRequest, VerifyResponse
from gymfleet.serving.server import JSONResponse, add_route
from gymfleet.testing import fleet_headers, free_port, make_response, running_fleet, serve

ROOT = Path(__file__).resolve().parents[1]
MCQA_ROWS = ROOT / "resources_servers/mcqa/data/example.jsonl"


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """`{(sample name, labels): value}` of a server's `/metrics`, parsed with prometheus_client's own parser."""
    text = httpx.get(url + "/metrics", timeout=10, headers=fleet_headers()).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def label_values(samples: dict, name: str, label: str) -> set[str]:
    return {dict(have)[label] for (n, have), _ in samples.items() if n == name and label in dict(have)}


class Scored(VerifyRequest):
    score: float = 0.0
    behave: str = "ok"


class ScoredServer(ResourcesServer):
    """Rewards what the row says; a `/{tool}` catch-all as workplace_assistant has; judge failures on request."""

    async def ping(self, body: Scored) -> dict:
        return {"pong": True}

    async def verify(self, body: Scored) -> VerifyResponse:
        match body.behave:
            case "judge_down":
                raise JudgeError("judge unreachable")
            case "judge_by_name":  # a judge call by instance name to a closed port
                await self.client.post("judge_model", "/v1/responses", json={}, timeout_s=5, retry=http.NO_RETRY)
            case "hang":
                await self.judge_never_answers()
        return VerifyResponse.echo(body, reward=body.score)

    async def judge_never_answers(self) -> None:
        import asyncio

        await asyncio.sleep(30)

    def routes(self, app) -> None:
        super().routes(app)

        async def any_tool(request):
            return JSONResponse({"tool": request.path_params["tool"]})

        add_route(app, "/{tool}", any_tool)


def _row(**fields) -> dict:
    return {"responses_create_params": {"input": "q"}, "response": make_response("a"), **fields}


@pytest.fixture(autouse=True)
def fresh_target_labels(monkeypatch):
    """Upstream target labels are per process: bounded (`MAX_TARGETS`, then `other`), and named after the fleet
    instance known to serve a base URL. A server process meets a few targets in its life, from one config; a pytest
    worker meets hundreds of ephemeral ports across test files, and a port an earlier test's instance used may be
    handed out again. So each test here starts with this process's labels as a fresh server process has them."""
    monkeypatch.setattr(metrics, "_targets", BoundedLabel(MAX_TARGETS))
    monkeypatch.setattr(metrics, "_instance_at", {})


@pytest.fixture(scope="module")
def env_url():
    judge = {"judge_model": {"responses_api_models": {"vllm_model": {"host": "127.0.0.1", "port": free_port()}}}}
    server = ScoredServer({"name": "scored_env", "domain": "other", "verify_timeout_s": 0.5}, judge)
    with serve(server.create_app()) as url:
        yield url


def test_routes_are_labelled_by_their_template_and_unmatched_paths_collapse(env_url):
    with httpx.Client(base_url=env_url) as client:
        client.post("/verify", json=_row(score=1.0))
        client.post("/ping", json={})
        for i in range(30):  # arbitrary tool names all count under the template
            assert client.post(f"/tool_{i}", json={}).json() == {"tool": f"tool_{i}"}
        for i in range(30):  # paths no route matches collapse to one label
            assert client.get(f"/no/such/path/{i}").status_code == 404
        assert client.get("/verify").status_code == 405
        for method in ("PROPFIND", "MKCOL"):  # methods no route serves collapse to one label
            assert client.request(method, "/verify").status_code == 405
    samples = scrape(env_url)
    routes = label_values(samples, "gymfleet_requests_total", "route")
    assert routes <= {"/verify", "/ping", "/{tool}", "unmatched", "/metrics", "/seed_session"}, routes
    assert label_values(samples, "gymfleet_requests_total", "method") == {"GET", "POST", "other"}
    assert value(samples, "gymfleet_requests_total", route="/verify", method="other", status="405") == 2
    assert value(samples, "gymfleet_requests_total", route="/{tool}", method="POST", status="200") == 30
    assert value(samples, "gymfleet_requests_total", route="unmatched", status="404") == 30
    assert value(samples, "gymfleet_requests_total", route="/verify", method="GET", status="405") == 1
    assert value(samples, "gymfleet_requests_total", route="/ping", method="POST", status="200") == 1
    assert value(samples, "gymfleet_request_seconds_count", route="/verify") >= 1


def test_rewards_count_per_environment_and_task_and_failure_rows_are_not_rewards(env_url):
    before = scrape(env_url)
    rows = [
        _row(category="algebra", score=1.0), _row(category="algebra", score=0.0), _row(category="algebra", score=1.0),
        _row(subset_for_metrics="geometry", score=0.5), _row(score=0.25),
        _row(category="algebra", behave="judge_down"), _row(category="algebra", behave="hang"),
        _row(category="geometry", behave="judge_by_name"),
    ]  # fmt: skip
    with httpx.Client(base_url=env_url, timeout=10) as client:
        results = [client.post("/verify", json=row).json() for row in rows]
    assert [r.get("_ng_failure_class") for r in results[-3:]] == ["judge_failed", "verify_timeout", "transport_failed"]
    after = scrape(env_url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, environment="scored_env", **labels) - value(before, name, environment="scored_env",
                                                                               **labels)

    assert delta("gymfleet_reward_count", task="algebra") == 3  # the two failure rows are not rewards
    assert delta("gymfleet_reward_sum", task="algebra") == 2.0
    assert delta("gymfleet_reward_count", task="geometry") == 1
    assert delta("gymfleet_reward_sum", task="geometry") == 0.5
    assert delta("gymfleet_reward_bucket", task="none", le="0.3") == 1
    assert delta("gymfleet_verify_results_total", task="algebra", outcome="scored") == 3
    assert delta("gymfleet_verify_results_total", task="algebra", outcome="judge_failed") == 1
    assert delta("gymfleet_verify_results_total", task="algebra", outcome="verify_timeout") == 1
    assert delta("gymfleet_verify_results_total", task="geometry", outcome="transport_failed") == 1
    # Failures by class and hop: the judge (no URL said), this server's own deadline, the judge instance by name.
    assert value(after, "gymfleet_failures_total", failure_class="judge_failed", hop="judge") >= 1
    assert value(after, "gymfleet_failures_total", failure_class="verify_timeout", hop="local") >= 1
    assert value(after, "gymfleet_failures_total", failure_class="transport_failed", hop="judge_model") >= 1
    assert value(after, "gymfleet_upstream_requests_total", target="judge_model", outcome="connection_error") >= 1


def test_infra_failure_share_gauge_is_failures_over_all_verify_answers(env_url):
    before = scrape(env_url)
    rows = [_row(category="algebra", score=1.0)] * 3 + [_row(category="algebra", behave="judge_down")]
    with httpx.Client(base_url=env_url, timeout=10) as client:
        results = [client.post("/verify", json=row).json() for row in rows]
    assert sum(bool(r.get("_ng_failure_class")) for r in results) == 1
    after = scrape(env_url)
    answers = value(after, "gymfleet_verify_results_total", environment="scored_env")
    failures = answers - value(after, "gymfleet_verify_results_total", environment="scored_env", outcome="scored")
    assert answers - value(before, "gymfleet_verify_results_total", environment="scored_env") == 4
    assert failures >= 1
    share = value(after, "gymfleet_infra_failure_share", environment="scored_env")
    assert share == pytest.approx(failures / answers)
    assert 0 < share < 1
    text = httpx.get(env_url + "/metrics", timeout=10).text
    assert "# HELP gymfleet_infra_failure_share Share of /verify answers that were infrastructure failures" in text
    assert "# TYPE gymfleet_infra_failure_share gauge" in text


def test_infra_failure_share_is_zero_for_an_environment_without_failures():
    server = ScoredServer({"name": "healthy_env", "domain": "other"})
    with serve(server.create_app()) as url:
        assert "gymfleet_infra_failure_share" not in httpx.get(url + "/metrics", timeout=10).text  # no answer yet
        assert httpx.post(url + "/verify", json=_row(score=1.0), timeout=10).status_code == 200
        assert value(scrape(url), "gymfleet_infra_failure_share", environment="healthy_env") == 0.0
        assert ("gymfleet_infra_failure_share", frozenset({("environment", "healthy_env")})) in scrape(url)
        httpx.post(url + "/verify", json=_row(behave="judge_down"), timeout=10)
        assert value(scrape(url), "gymfleet_infra_failure_share", environment="healthy_env") == 0.5


@pytest.mark.parametrize(
    ("row", "task"),
    [
        ({"category": "Mail"}, "Mail"),
        ({"task": "t1", "category": "c"}, "t1"),
        ({"subset_for_metrics": "aime24"}, "aime24"),
        ({"dataset": 3}, "3"),
        ({"category": True}, "none"),  # a flag is not a task
        ({"category": ""}, "none"),
        ({"category": {"nested": 1}, "subset": "s"}, "s"),
        ({"task_id": "row-000123", "_ng_task_index": 7}, "none"),  # per-row ids would explode the label
        ({}, "none"),
    ],
    ids=["category", "task_first", "subset_for_metrics", "int", "bool", "empty", "dict_skipped", "row_ids", "none"],
)
def test_task_of(row, task):
    assert task_of(row) == task


def test_task_labels_are_bounded_and_cut(env_url):
    with httpx.Client(base_url=env_url) as client:
        for i in range(MAX_TASKS + 8):
            client.post("/verify", json=_row(category=f"hostile_{i:03d}_" + "x" * 200, score=1.0))
    tasks = label_values(scrape(env_url), "gymfleet_reward_count", "task")
    assert len(tasks) <= MAX_TASKS + 1 and "other" in tasks
    assert max(len(task) for task in tasks) == MAX_LABEL_CHARS


def test_upstream_target_labels_are_bounded_per_process():
    urls = [f"http://127.0.0.1:{20000 + i}/v1/responses" for i in range(MAX_TARGETS + 3)]
    labels = [target_of(url) for url in urls]
    assert labels[:MAX_TARGETS] == [url.rsplit("/v1", 1)[0] for url in urls[:MAX_TARGETS]]
    assert labels[MAX_TARGETS:] == ["other"] * 3
    assert target_of(urls[0]) == "http://127.0.0.1:20000"  # a target seen before the bound keeps its label
    assert target_of(None) == "unknown"


def test_agent_counts_a_dead_model_by_hop_and_upstream_target():
    from agents.simple_agent.app import SimpleAgent
    from resources_servers.mcqa.app import MCQAServer

    row = json.loads(MCQA_ROWS.read_text().splitlines()[0])
    with serve(MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()) as env:
        fleet = {
            "mcqa": {"resources_servers": {"mcqa": {"host": "127.0.0.1", "port": int(env.rsplit(":", 1)[1])}}},
            "policy_model": {"responses_api_models": {"vllm_model": {"host": "127.0.0.1", "port": free_port()}}},
        }
        # Nothing will ever listen at the model's port: ride over a restart for 1 s, not 10 (`restart_ride_s`).
        agent = SimpleAgent({"name": "agent", "resources_server": "mcqa", "model_server": "policy_model",
                             "restart_ride_s": 1}, fleet)
        with serve(agent.create_app()) as url:
            answer = httpx.post(url + "/run", json=row, timeout=60)
            assert answer.status_code == 502 and answer.json()["error_type"] == "connection_error"
            samples = scrape(url)
    assert value(samples, "gymfleet_failures_total", failure_class="connection_error", hop="policy_model") == 1
    assert value(samples, "gymfleet_upstream_requests_total", target="mcqa", outcome="2xx") >= 1
    assert value(samples, "gymfleet_upstream_requests_total", target="policy_model", outcome="connection_error") >= 1
    assert value(samples, "gymfleet_requests_total", route="/run", status="502") == 1


def test_model_server_counts_its_dead_upstream_by_base_url():
    from responses_api_models.vllm_model.app import VLLMModel

    upstream = f"http://127.0.0.1:{free_port()}"
    model = VLLMModel({"name": "policy", "base_url": upstream + "/v1", "timeout_s": 5, "upstream_max_attempts": 2,
                       "upstream_backoff_s": 0.01})
    with serve(model.create_app()) as url:
        assert httpx.post(url + "/v1/responses", json={"input": "hi"}, timeout=60).status_code == 502
        samples = scrape(url)
    assert value(samples, "gymfleet_failures_total", failure_class="connection_error", hop=upstream) == 1
    # two attempts of the call (and any readiness probes of the upstream, which count too)
    assert value(samples, "gymfleet_upstream_requests_total", target=upstream, outcome="connection_error") >= 2
    assert value(samples, "gymfleet_requests_total", route="/v1/responses", status="502") == 1


def test_a_collection_shows_verify_latency_rewards_and_process_metrics_on_every_server(tmp_path, monkeypatch):
    """The issue's check: after `ng_collect_rollouts` on the quickstart fleet, scrape four kinds of server."""
    monkeypatch.chdir(tmp_path)
    with running_fleet([str(ROOT / "configs/quickstart.yaml")]) as fleet:
        head = f"http://127.0.0.1:{fleet.config.head_port}"
        argv = ["+agent_name=mcqa_simple_agent", f"+input_jsonl_fpath={MCQA_ROWS}", "+output_jsonl_fpath=out.jsonl",
                "+num_repeats=2", f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}"]
        with pytest.raises(SystemExit) as exited:
            collect_main(argv)
        assert exited.value.code == 0
        rewards = [json.loads(line)["reward"] for line in Path("out.jsonl").read_text().splitlines()]
        scraped = {name: scrape(fleet.config.instance(name).url)
                   for name in ("mcqa", "policy_model", "scripted_llm", "mcqa_simple_agent")}
        scraped["head"] = scrape(head)
        scripted_url = fleet.config.instance("scripted_llm").url

    assert len(rewards) == 10
    env = scraped["mcqa"]
    assert value(env, "gymfleet_request_seconds_count", route="/verify") == 10
    assert value(env, "gymfleet_requests_total", route="/seed_session", status="200") == 10
    assert value(env, "gymfleet_requests_total", route="unmatched") == 0
    assert value(env, "gymfleet_reward_count", environment="mcqa") == 10
    assert value(env, "gymfleet_reward_sum", environment="mcqa") == sum(rewards)
    assert value(env, "gymfleet_verify_results_total", environment="mcqa", outcome="scored") == 10

    agent = scraped["mcqa_simple_agent"]
    assert value(agent, "gymfleet_request_seconds_count", route="/run") == 10
    assert value(agent, "gymfleet_upstream_seconds_count", target="mcqa") == 20  # seed_session + verify
    assert value(agent, "gymfleet_upstream_requests_total", target="policy_model", outcome="2xx") == 10

    policy = scraped["policy_model"]
    assert value(policy, "gymfleet_request_seconds_count", route="/v1/responses") == 10
    assert value(policy, "gymfleet_upstream_requests_total", target=scripted_url, outcome="2xx") >= 10
    assert value(scraped["scripted_llm"], "gymfleet_requests_total", route="/v1/chat/completions") >= 10

    head_samples = scraped["head"]
    assert value(head_samples, "gymfleet_requests_total", route="/global_config_dict_yaml", status="200") >= 1
    assert value(head_samples, "gymfleet_server_restarts_total", instance="mcqa") == 0
    for name, samples in scraped.items():
        assert value(samples, "process_resident_memory_bytes") > 10e6, name
        assert value(samples, "process_open_fds") > 0, name
        assert value(samples, "process_cpu_seconds_total") > 0, name
