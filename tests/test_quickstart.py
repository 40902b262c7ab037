"""The README's first command, as a user runs it: `ng_quickstart` prints a reward per example row."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart_prints_rewards_from_the_real_chain(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "gymfleet.cli.quickstart", f"+output_dir={tmp_path}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rewards = re.findall(r"task (\d) rollout 0: reward ([01]\.0)", out.stdout)
    expected_rewards = {"0": "1.0", "1": "0.0", "2": "1.0", "3": "0.0", "4": "1.0"}  # from configs/quickstart.yaml
    assert dict(rewards) == expected_rewards, out.stdout
    assert "Fleet stopped." in out.stdout
    rollouts = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 5
    for rollout in rollouts:
        assert rollout["agent_ref"]["name"] == "mcqa_simple_agent"
        assert rollout["response"]["model"] == "scripted", "the answer came through the scripted LLM"
    assert (tmp_path / "logs" / "mcqa.log").exists()
