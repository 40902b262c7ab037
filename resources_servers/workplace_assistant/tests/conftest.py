"""Shared fixtures: the server on WorkBench's tables (NeMo-Gym's rows refer to their ids) and on our own data.

WorkBench's tables come from NeMo-Gym's wheel: `csv_data/processed/*.csv` and `csv_data/raw/email_addresses.csv`.
The server reads WorkBench's layout (the tables and `raw/` in one folder), so `WORKBENCH_CSV` is a temporary
folder of links to them.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from gymfleet.testing import nemo_gym_examples, serve
from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder
from resources_servers.workplace_assistant.app import WorkplaceAssistantServer

EXAMPLES = nemo_gym_examples("workplace_assistant")


def _workbench_layout() -> Path:
    """A temporary folder in WorkBench's layout linking to the wheel's tables (removed at exit)."""
    tables = nemo_gym_folder("workplace_assistant") / "csv_data"
    folder = Path(tempfile.mkdtemp(prefix="workbench-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for table in (tables / "processed").glob("*.csv"):
        (folder / table.name).symlink_to(table)
    (folder / "raw").symlink_to(tables / "raw", target_is_directory=True)
    return folder


WORKBENCH_CSV = _workbench_layout()
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
