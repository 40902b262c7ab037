"""Shared fixtures: the server on WorkBench's tables (NeMo-Gym's rows refer to their ids) and on our own data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymfleet.testing import nemo_gym_examples, serve
from resources_servers.workplace_assistant.app import WorkplaceAssistantServer

EXAMPLES = nemo_gym_examples("workplace_assistant")
WORKBENCH_CSV = EXAMPLES.parents[1] / "workplace_assistant" / "csv"
NEMO_GYM_ROWS = [json.loads(line) for line in (EXAMPLES / "example.jsonl").read_text().splitlines() if line.strip()]
OWN_ROWS = [json.loads(line) for line in (Path(__file__).parents[1] / "data/example.jsonl").read_text().splitlines()]


def make_server(**fields) -> WorkplaceAssistantServer:
    return WorkplaceAssistantServer({"name": "workplace_assistant", "domain": "agent", **fields})


@pytest.fixture(scope="module")
def workbench():
    """(base URL, server) on WorkBench's tables."""
    server = make_server(data_dir=str(WORKBENCH_CSV))
    with serve(server.create_app()) as url:
        yield url, server
