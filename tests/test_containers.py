"""swebench's Docker backend, for real against a container engine (Podman from scripts/install_container_engine.sh,
or the engine DOCKER_HOST names): whole rollouts (scripted model ⇄ swe_agent ⇄ swebench, the agent's session in the
bubblewrap sandbox) graded in fresh containers.

Our five tasks score 1.0 with their gold patch; no fix, test edits, conftest tricks and the other cheats of the
bubblewrap backend's suite score 0.0 with the same reasons (one grading code path); a hung test is killed at its
deadline and a memory hog by its limit; eight gradings at once all score; a row naming an official SWE-bench image
this engine lacks fails naming it; an engine that does not answer fails at start-up. After every test no container
of this backend is left (`podman ps -a`, by its label).

The base image is localhost/gymfleet-base:bookworm (the install script builds it); with your own engine set
GYMFLEET_TEST_BASE_IMAGE to any image with python3 and git (e.g. python:3.11).
"""

from __future__ import annotations

import concurrent.futures
import os

import httpx
import pytest

from gymfleet.errors import ConfigError
from gymfleet.testing import free_port, make_response, serve
from resources_servers.swebench.app import SWEBenchServer
from resources_servers.swebench.containers import LABEL, TASK_IMAGE, ContainerRunner, connect
from resources_servers.swebench.tests import conftest as swebench_conftest
from resources_servers.swebench.tests.conftest import ROWS, assert_sessions_closed, fleet, script
from resources_servers.swebench.tests.test_swebench_rollouts import (
    CHEATS,
    FIX,
    SLUG,
    assert_the_cheat_scores_0,
    gold_calls,
    run,
)

BASE_IMAGE = os.environ.get("GYMFLEET_TEST_BASE_IMAGE", "localhost/gymfleet-base:bookworm")
DOCKER = {"backend": "docker", "base_image": BASE_IMAGE}
sandbox = swebench_conftest.sandbox  # the swebench suite's real bubblewrap sandbox service, for the agent's sessions


@pytest.fixture(scope="module")
def engine():
    """The engine's client; fails (not skips) naming the install script when there is none."""
    try:
        client = connect()
    except ConfigError as exc:
        pytest.fail(f"{exc} Run scripts/install_container_engine.sh (the README's test command does).")
    yield client
    client.close()


@pytest.fixture(autouse=True)
def no_container_left(engine):
    """Every test ends with no container of this backend on the engine, running or stopped."""
    yield
    left = engine.containers.list(all=True, filters={"label": LABEL})
    assert not left, f"containers left behind: {[(c.name, c.status) for c in left]}"
    images = [tag for image in engine.images.list(TASK_IMAGE) for tag in image.tags]
    assert not images, f"task images left behind by a server that shut down: {images}"


def docker_fleet(sandbox_url: str, rules: list[dict], **env_fields):
    return fleet(sandbox_url, rules, env_fields={**DOCKER, **env_fields})


@pytest.mark.parametrize("row", ROWS, ids=[row["instance_id"] for row in ROWS])
def test_gold_patch_scores_1_in_a_container(sandbox, row):
    url, sandbox_server = sandbox
    with docker_fleet(url, script(row, gold_calls(row))) as (run_url, env):
        result = run(run_url, row)
        assert env.grader is env.containers and env.containers._images, "graded in a container"
    assert result["reward"] == 1.0, (result["reason"], result.get("grading_detail"), result["tests_status"])
    assert result["resolved"] is True and result["model_patch"].strip() == row["patch"].strip()
    assert_sessions_closed(sandbox_server)


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_no_fix_or_a_cheat_scores_0_in_a_container(sandbox, cheat):
    assert_the_cheat_scores_0(sandbox[0], cheat, DOCKER)


HANG = ("str_replace", {"path": "textkit/slug.py", "old_str": "import unicodedata",
                        "new_str": "import unicodedata\nwhile True:\n    pass"})
HOG = ("str_replace", {"path": "textkit/slug.py", "old_str": "import unicodedata",
                       "new_str": "import unicodedata\nHOG = [bytearray(1 << 20) for _ in range(4096)]"})


def test_a_hung_test_is_killed_at_its_deadline(sandbox):
    url, _ = sandbox
    with docker_fleet(url, script(SLUG, [FIX, HANG]), grading_timeout_s=5) as (run_url, _):
        result = run(run_url, SLUG)
    assert (result["reward"], result["reason"]) == (0.0, "tests_timeout"), result.get("grading_detail")
    assert "deadline" in result["grading_detail"]


def test_a_memory_hog_is_stopped_by_its_limit(sandbox):
    url, _ = sandbox
    with docker_fleet(url, script(SLUG, [FIX, HOG]), grading_memory_mb=128) as (run_url, _):
        result = run(run_url, SLUG)
    assert (result["reward"], result["reason"]) == (0.0, "tests_oom"), result.get("grading_detail")
    assert "_ng_failure_class" not in result


def test_eight_gradings_at_once(sandbox):
    url, sandbox_server = sandbox
    rows = [ROWS[i % len(ROWS)] for i in range(8)]
    rules = [rule for row in ROWS for rule in script(row, gold_calls(row))]
    with docker_fleet(url, rules, docker_concurrency=8) as (run_url, _):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda row: run(run_url, row), rows))
    assert [r["reward"] for r in results] == [1.0] * 8, [(r["reason"], r.get("grading_detail")) for r in results]
    assert_sessions_closed(sandbox_server)


def test_a_row_naming_an_image_the_engine_lacks_fails_naming_it(sandbox):
    url, _ = sandbox
    row = {**{k: v for k, v in SLUG.items() if k != "repo_source"}, "image": "localhost/no-such-swebench:image"}
    server = SWEBenchServer({"name": "swebench", "domain": "coding", "sandbox_url": url, **DOCKER})
    with serve(server.create_app()) as env_url, httpx.Client(base_url=env_url, timeout=60) as client:
        assert "localhost/no-such-swebench:image" in client.post("/seed_session", json=row).json()["error"]
        result = client.post("/verify", json={**row, "response": make_response("done")}).json()
    assert result["_ng_failure_class"] == "sandbox_failed" and "no-such-swebench" in result["failure"]


def test_an_engine_that_does_not_answer_fails_at_start_up(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(ConfigError, match="does not answer"):
        ContainerRunner(BASE_IMAGE).start()


def test_a_missing_base_image_fails_at_start_up_naming_it(engine):
    with pytest.raises(ConfigError, match="localhost/no-such-base:image"):
        ContainerRunner("localhost/no-such-base:image").start()
