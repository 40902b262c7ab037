"""The conformance checker over every environment folder (Gymnasium's `test_all_env_api`, for our servers).

Each `resources_servers/<env>/` must: have `configs/<env>.yaml` declaring the server with a valid `domain`, have
`data/example.jsonl` with at least five rows, load and validate its config, answer `/seed_session` and `/verify`
on every example row over real HTTP (finite reward, row echoed, same reward twice), and document itself in a
module docstring with the house sections.
"""

from __future__ import annotations

import json

import pytest

from gymfleet.fleet.config_instances import ServerInstance, repository_root
from gymfleet.fleet.launch import build_server
from gymfleet.testing import check_resources_server, environment_block, serve

ROOT = repository_root()
ENVS = sorted(p.name for p in (ROOT / "resources_servers").iterdir() if (p / "app.py").is_file())
SECTIONS = ("## Task fields", "## Reward", "## Config", "## Tools", "## Version history")


def test_there_are_environments():
    assert "mcqa" in ENVS


@pytest.mark.parametrize("env", ENVS)
def test_environment_conforms(env):
    name, fields = environment_block(env, ROOT)  # ROOT: a scaffolded tree in test_cli_tools
    instance = ServerInstance(name=name, server_type="resources_servers", impl=env,
                              fields={**fields, "host": "127.0.0.1", "port": 0})
    server = build_server(instance, {})
    doc = type(server).__module__ and __import__(type(server).__module__, fromlist=["_"]).__doc__ or ""
    missing = [section for section in SECTIONS if section not in doc]
    assert not missing, f"{env}/app.py docstring lacks {missing}"
    rows = [json.loads(line) for line in (ROOT / "resources_servers" / env / "data" / "example.jsonl")
            .read_text().splitlines() if line.strip()]
    assert len(rows) >= 5, f"{env}: data/example.jsonl needs at least 5 rows"
    with serve(server.create_app()) as url:
        check_resources_server(url, rows)
