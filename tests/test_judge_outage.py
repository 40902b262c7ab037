"""A judge outage during `ng_collect_rollouts` (issue 12): the rows it hits are failure rows, never rewards of 0, and
a resumed collection once the judge is back completes every rollout exactly once.

The fleet is real (`ng_run`'s supervisor, every server a subprocess): a policy (`vllm_model` in front of a scripted
LLM), equivalence_llm_judge and its simple_agent, and a separate judge model server `judge_model` (`vllm_model`) whose
upstream is a scripted LLM this test serves on a fixed port. Stopping that upstream takes the judge down for as long
as the test wants (the fleet would restart a crashed fleet member by itself, but not an endpoint outside it); serving
it again on the same port brings the judge back.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from gymfleet.testing import free_port, running_fleet, serve
from responses_api_models.scripted_model.app import ScriptedModel

ROOT = Path(__file__).resolve().parents[1]
ROWS_FILE = ROOT / "resources_servers/equivalence_llm_judge/data/example.jsonl"
ROWS = [json.loads(line) for line in ROWS_FILE.read_text().splitlines()]
AGENT = "equivalence_llm_judge_simple_agent"
REPEATS = 10
TOTAL = len(ROWS) * REPEATS
WAIT_S = 120
"""How long the test waits for something that takes seconds (a bound against hanging, not a timing assertion)."""

# The policy answers every example row correctly, in the row's own answer format.
POLICY_RULES = [
    {"match": "aerobic respiration", "text": "In the mitochondria.\n\n\\boxed{the mitochondrion}"},
    {"match": "capacitance", "text": "Named after Faraday.\n<final_answer>farad</final_answer>"},
    {"match": "carbon-12", "text": "Carbon's atomic number is six: **6**"},
    {"match": "derivative", "text": "\\boxed{$\\cos x$}"},
    {"match": "largest mass", "text": "Jupiter, by far.\n\n\\boxed{Jupiter}"},
    {"match": "Newton's second law", "text": f"<final_answer>{ROWS[5]['expected_answer']}</final_answer>"},
]
# The judge says equal when the candidate contains the reference; a little latency keeps the collection running
# while the test takes the judge down.
JUDGE_RULES = [
    {"match": r"(?is)<reference_answer>\s*(\S[^<]*?)\s*</reference_answer>.*<<<BEGIN CANDIDATE ANSWER (\w+)>>>"
              r"(?:(?!<<<END).)*\1",
     "delay_s": 0.1, "text": "Same answer.\n\n[[A=B]] the answers are equivalent"},
]


class JudgeUpstream:
    """The judge's scripted LLM on 127.0.0.1:`port`, a fixed port, so it can come back where the fleet expects it."""

    def __init__(self, port: int):
        self.port = port
        self.server: uvicorn.Server | None = None

    def start(self) -> None:
        app = ScriptedModel({"name": "judge_llm", "model": "scripted-judge", "rules": JUDGE_RULES,
                             "default": {"text": "Different.\n\n[[A!=B]] the answers are not equivalent"}})
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.server = uvicorn.Server(uvicorn.Config(app.create_app(), log_level="warning",
                                                    timeout_graceful_shutdown=1))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the judge upstream did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self.thread.join(WAIT_S)
            self.sock.close()
            self.server = None


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def keys(rows: list[dict]) -> list[tuple[int, int]]:
    return sorted((row["_ng_task_index"], row["_ng_rollout_index"]) for row in rows)


def test_a_judge_outage_gives_failure_rows_and_a_resume_completes_each_rollout_once(tmp_path):
    judge = JudgeUpstream(free_port())
    judge.start()  # the fleet checks its model endpoints at start
    try:
        with serve(ScriptedModel({"name": "policy_llm", "rules": POLICY_RULES}).create_app()) as policy_url:
            output, failures = collect_through_an_outage(judge, policy_url, tmp_path)
    finally:
        judge.stop()
    results = lines(output)
    assert keys(results) == [(task, rollout) for task in range(len(ROWS)) for rollout in range(REPEATS)], "once each"
    assert all(r["reward"] == 1.0 and r["judge_provenance"][0]["judge_server"] == "judge_model" for r in results)
    assert keys([r for r in results if "_ng_attempt_index" in r]) == keys(failures), "failed ones, retried once"
    assert lines(tmp_path / "out_failures.jsonl") == [{**f, "_ng_superseded": True} for f in failures]
    [entry] = json.loads((tmp_path / "out_aggregate_metrics.json").read_text())
    assert entry["key_metrics"]["mean/reward"] == 1.0


def collect_through_an_outage(judge: JudgeUpstream, policy_url: str, tmp_path: Path) -> tuple[Path, list[dict]]:
    """Collect while the judge goes down, check the outcome, resume with the judge back; the failure rows."""
    extra = {
        "policy_base_url": policy_url + "/v1", "policy_api_key": "not-needed", "policy_model_name": "scripted",
        "judge_model": {"responses_api_models": {"vllm_model": {
            "entrypoint": "app.py", "base_url": f"http://127.0.0.1:{judge.port}/v1", "api_key": "not-needed",
            "model": "scripted-judge", "upstream_max_attempts": 1}}},
        "equivalence_llm_judge": {"resources_servers": {"equivalence_llm_judge": {
            "judge_model_server": {"type": "responses_api_models", "name": "judge_model"},
            "judge_max_attempts": 1, "judge_timeout_s": 30}}},
    }
    config_paths = [str(ROOT / "responses_api_models/vllm_model/configs/vllm_model.yaml"),
                    str(ROOT / "resources_servers/equivalence_llm_judge/configs/equivalence_llm_judge.yaml")]
    output, failures_file = tmp_path / "out.jsonl", tmp_path / "out_failures.jsonl"
    with running_fleet(config_paths, extra) as fleet:
        command = [sys.executable, "-m", "gymfleet.cli.collect", f"+agent_name={AGENT}",
                   f"+input_jsonl_fpath={ROWS_FILE}", "+output_jsonl_fpath=out.jsonl",
                   f"+head_server={{host: 127.0.0.1, port: {fleet.config.head_port}}}",
                   f"+num_repeats={REPEATS}", "+num_samples_in_parallel=2"]
        collector = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + WAIT_S
        while len(lines(output)) < 8:
            if collector.poll() is not None:
                pytest.fail("the collection ended before the judge went down: "
                            + b"".join(collector.communicate()).decode()[-3000:])
            assert time.monotonic() < deadline, "no rollouts finished"
            time.sleep(0.05)
        judge.stop()  # the judge goes down mid-collection
        out, err = collector.communicate(timeout=WAIT_S)
        assert collector.returncode == 1, out.decode() + err.decode()  # 1: some rollouts failed

        results, failures = lines(output), lines(failures_file)
        assert results and failures and len(results) + len(failures) == TOTAL, "every rollout is one or other"
        assert all(r["reward"] == 1.0 and "_ng_failure_class" not in r for r in results), "no reward of 0"
        assert {f["_ng_failure_class"] for f in failures} == {"judge_failed"}
        assert all("judge_model" in f["failure"] for f in failures)

        judge.start()  # the judge is back
        resumed = subprocess.run([*command, "+resume_from_cache=true"], cwd=tmp_path, capture_output=True,
                                 timeout=WAIT_S)
        assert resumed.returncode == 0, resumed.stdout.decode() + resumed.stderr.decode()
    return output, failures
