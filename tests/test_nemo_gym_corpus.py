"""NeMo-Gym 0.7.0's own environment folders, unchanged, on gymfleet: what `bench/nemo_gym_corpus.py` does over the
whole corpus, over a handful of folders of different kinds. Each is started under `ng_run` from the wheel's tree
(its config cut down to its resources server, named with `+server_folders`), its own tests run in a subprocess with
NeMo-Gym's pytest settings, and its recorded rollouts are replayed through `/verify` to the recorded rewards.

- `example_single_tool_call`: a tool route added in `setup_webserver` (the replay calls the recorded tool calls);
- `example_session_state_mgmt`: per-session state kept between `/seed_session`, tool calls and `/verify`;
- `mcqa`: a folder named like gymfleet's own `mcqa` environment, whose requirement (`tiktoken`) the fleet lacks:
  served from the tree, in an environment of its own (`+folder_requirements=venv`);
- `math_with_judge`: a judge folder that pins `math-verify==0.8.0` where gymfleet has 0.9: served in its own uv
  environment (made once, cached), its library grading replayed.

The wheel comes from the package index (cached, `gymfleet.testing.nemo_gym_wheel`); the folders' environments are
made with uv from the package index the first time, then cached.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from gymfleet.testing import serve
from gymfleet.testing.judge_replay import JudgeReplay, recorded_judge_calls
from gymfleet.testing.nemo_gym_corpus import JUDGE_MISSING, TASK_MISSING, FolderResult, _replay, needs, try_folder
from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder

FOLDERS = {  # folder: ng_run's folder_requirements for it
    "example_single_tool_call": "check",
    "example_session_state_mgmt": "check",
    "mcqa": "venv",
    "math_with_judge": "check",  # a conflicting pin gets its own environment whatever the policy
}
KNOWN_GAPS = {  # folder: (own tests failing, at most this many recorded rows disagreeing), each with its reason
    # one recorded mcqa rollout predates 0.7.0's answer parsing: 0.7.0's own verify, called directly, scores it as
    # gymfleet serves it (tests/test_nemo_gym_folders.py replays it beside the others and says the same)
    "mcqa": (0, 1),
    # up to two recorded rows hold symbolic answers math-verify cannot settle within the folder's own 5 s bound on a
    # loaded 2-core machine (about 12 CPU seconds each), which the folder itself scores 0.0 too
    "math_with_judge": (0, 2),
}


@pytest.mark.parametrize("name", sorted(FOLDERS))
def test_a_nemo_gym_folder_starts_passes_its_own_tests_and_replays_its_recorded_rewards(name, tmp_path):
    folder = nemo_gym_folder(name)
    assert needs(folder) is None
    result = try_folder(folder, tmp_path, requirements=FOLDERS[name])
    assert result.start == "yes", result.why
    failing_tests, disagreeing_rows = KNOWN_GAPS.get(name, (0, 0))
    assert result.tests_total > 0 and result.tests_total - result.tests_passed == failing_tests, result.why
    assert result.rows > 0 and result.rows - result.agree <= disagreeing_rows, result.why


def test_a_folder_that_needs_containers_or_lean_is_named_in_one_line_and_not_started(tmp_path):
    for name, what in [("swebench", "containers"), ("math_formal_lean", "a Lean checker")]:
        result = try_folder(nemo_gym_folder(name), tmp_path / name)
        assert result.start == "-" and len(result.why) == 1 and what in result.why[0]


def _judged_row(*verdicts: tuple[str, str]) -> dict:
    return {"reward": 1.0, "responses_create_params": {"input": "policy prompt"}, "response": {"output": []},
            "judge_evaluations": [{"responses_create_params": {"input": [{"role": "user", "content": asked}]},
                                   "response": {"id": answer}} for asked, answer in verdicts]}


def test_the_stand_in_judge_answers_recorded_calls_exactly_then_by_row_and_never_invents_one():
    """A recorded judge call is answered with its recorded response; a request in other words (a judge prompt
    edited since recording) gets the replayed row's own recorded answers, most alike first, once each; beyond them
    a 404, so the folder's judge call fails typed."""
    import httpx

    rows = [_judged_row(("is 2 equal to 2? A", "r1-a"), ("is 2 equal to 2? B", "r1-b")), _judged_row(("x=y?", "r2"))]
    with JudgeReplay(rows) as judge, httpx.Client(base_url=judge.url) as client:
        def ask(text: str) -> httpx.Response:
            return client.post("/responses", json={"model": "stand-in", "input": [{"role": "user", "content": text}]})

        assert ask("x=y?").json() == {"id": "r2"}, "exact, whatever row is being replayed"
        judge.replaying(rows[0])
        assert ask("Is 2 equal to 2?? (B)").json() == {"id": "r1-b"}
        assert ask("something else").json() == {"id": "r1-a"}
        missing = ask("one more")
        assert missing.status_code == 404 and "no recorded judge answer" in missing.json()["error"]["message"]
    assert (judge.hits, judge.fuzzy, judge.misses) == (3, 2, 1)
    assert recorded_judge_calls([{"responses_create_params": {"input": "p"}, "response": {"id": "policy"}}]) == {}


def test_rows_that_cannot_be_replayed_here_are_counted_by_what_they_lack(tmp_path):
    """A recorded row whose task is not in `data/` (the verify refuses the prompt-only request) and a row whose judge
    call failed with no judge recorded are counted apart from rows that disagree; a row that disagrees with its task
    and no judge failure is a disagreement."""
    app = FastAPI()

    @app.post("/verify")
    async def verify(body: dict) -> dict:
        if "question" not in body:
            return JSONResponse({"detail": [{"loc": ["body", "question"], "msg": "Field required"}]}, 422)
        if body["question"] == "judged":
            return {"reward": 0.0, "_ng_failure_class": "judge_failed"}
        return {"reward": 0.5}

    def row(text: str) -> dict:
        return {"responses_create_params": {"input": text}, "response": {"output": []}, "reward": 1.0}

    data = tmp_path / "folder" / "data"
    data.mkdir(parents=True)
    (data / "example_rollouts.jsonl").write_text("".join(json.dumps(row(t)) + "\n" for t in ["a", "b", "c", "d"]))
    (data / "example.jsonl").write_text("".join(json.dumps({**row(t), "question": q}) + "\n"
                                               for t, q in [("b", "judged"), ("c", "plain"), ("d", "judged")]))
    (tmp_path / "folder" / "app.py").write_text("")
    result = FolderResult("folder")
    with serve(app) as url:
        _replay(tmp_path / "folder", url, result)
    assert (result.agree, result.rows) == (0, 4)
    assert result.blocked == {TASK_MISSING: 1, JUDGE_MISSING: 2}, "row c disagrees: counted as no want"


def test_a_row_replayed_without_its_task_sends_none_of_what_verify_computed(tmp_path):
    """A verify that spreads its request into its answer (iheval: `Answer(**body.model_dump(), row_id=...)`) fails
    with "multiple values" when handed back its own outputs: a row whose task is not in `data/` is replayed less every
    key verify added to the folder's rows whose task is there, whichever keys those are."""
    outputs = ["row_id", "generation", "strict", "loose"]
    app = FastAPI()

    @app.post("/verify")
    async def verify(body: dict) -> dict:
        def answer(question, **computed):  # NeMo-Gym folders build their answer this way
            return {**computed, "question": question}

        try:
            return {**answer(**body, **{key: 1 for key in outputs}), "reward": 1.0}
        except TypeError as exc:
            return JSONResponse({"detail": str(exc)}, 500)

    def row(text: str, computed: list[str]) -> dict:
        return {"responses_create_params": {"input": text}, "response": {"output": []}, "question": text,
                "_ng_task_index": 0, "reward": 1.0, **{key: 1 for key in computed}}

    data = tmp_path / "folder" / "data"
    data.mkdir(parents=True)
    recorded = [row("a", outputs[:2]), row("b", outputs[1:]), row("orphan", outputs)]
    (data / "example_rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recorded))
    (data / "example.jsonl").write_text("".join(json.dumps({"responses_create_params": {"input": t}, "question": t})
                                               + "\n" for t in ["a", "b"]))
    (tmp_path / "folder" / "app.py").write_text("")
    result = FolderResult("folder")
    with serve(app) as url:
        _replay(tmp_path / "folder", url, result)
    assert (result.agree, result.rows) == (3, 3), result.why


def test_a_field_set_from_a_setting_nobody_gave_is_named_as_what_the_folder_needs(tmp_path):
    from gymfleet.testing.nemo_gym_corpus import _unset_setting

    config = tmp_path / "c.yaml"
    config.write_text("x:\n  resources_servers:\n    x:\n      api_key: ${oc.select:service_api_key,null}\n")
    refused = "x.api_key.str: Input should be a valid string (got None)"
    assert _unset_setting(config, refused) == ("needs service_api_key (an external service's key or setting: "
                                               "+service_api_key=...)")
    assert _unset_setting(config, "x.other: Field ok") is None
    required = "invalid C config for NeMo-Gym folder F:\n  x.key: Field required (got {})\n  x.cx: Field required"
    assert _unset_setting(config, required).startswith("needs key, cx (settings its config class requires and its "
                                                       "YAML leaves to the user: ++<instance>.resources_servers.")


def test_a_folder_config_gets_what_the_files_it_includes_give_its_instance():
    """terminal_bench_4's config names its `environment` only in a file its `config_paths` include (from the tree's
    `benchmarks/`): the cut-down config has it, and the included agent instances stay out, as do the includes."""
    from gymfleet.testing.nemo_gym_corpus import folder_config

    data, servers = folder_config(nemo_gym_folder("terminal_bench_4"))
    assert servers == ["terminal_bench_4"] and "config_paths" not in data
    instance = data["terminal_bench_4"]["resources_servers"]["terminal_bench_4"]
    assert instance["entrypoint"] == "app.py" and "sandbox_provider" in instance["environment"]
    assert not any("responses_api_agents" in block or "environment_servers" in block for block in data.values())


def test_a_test_file_that_cannot_be_collected_is_one_error_and_the_others_still_run(tmp_path):
    from gymfleet.testing.nemo_gym_corpus import _tests

    folder = tmp_path / "tree" / "resources_servers" / "fake"
    (folder / "tests").mkdir(parents=True)
    (folder / "app.py").write_text("")
    (folder / "tests" / "test_fine.py").write_text("def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    (folder / "tests" / "test_agents.py").write_text("import nemo_gym.no_such_module\n")
    result = FolderResult("fake")
    _tests(folder, tmp_path / "scratch", result, "check")
    assert (result.tests_passed, result.tests_total) == (2, 3), result.why
    assert "No module named 'nemo_gym.no_such_module'" in result.why[0]


def _tree_named_like_gymfleets_environments(tmp_path) -> Path:
    """A NeMo-Gym-shaped tree with a folder for every environment name gymfleet ships (and an `environment_servers`
    package) and a folder `genrm_compare` whose conftest imports all of them and a bare sibling module."""
    from gymfleet.fleet.config import repository_root

    builtins = sorted(p.name for p in (repository_root() / "resources_servers").iterdir()
                      if (p / "app.py").is_file() and p.name not in sys.stdlib_module_names)  # calendar: as pytest
    assert "genrm_compare" in builtins
    tree = tmp_path / "tree"
    for name in builtins:
        (tree / "resources_servers" / name).mkdir(parents=True)
        (tree / "resources_servers" / name / "app.py").write_text(f"WHOSE = 'tree:{name}'\n")
    (tree / "environment_servers" / "legacy").mkdir(parents=True)
    (tree / "environment_servers" / "legacy" / "app.py").write_text("WHOSE = 'tree:legacy'\n")
    folder = tree / "resources_servers" / "genrm_compare"
    (folder / "app.py").write_text("import nemo_gym  # a NeMo-Gym folder\n\nWHOSE = 'tree:genrm_compare'\n")
    (folder / "tests").mkdir()
    for package in (folder, folder / "tests"):
        (package / "__init__.py").write_text("")
    (folder / "util.py").write_text("SIBLING = 'util'\n")
    (folder / "tests" / "conftest.py").write_text(
        "import importlib\n\nfrom util import SIBLING\n\n"
        f"WHOSE = [importlib.import_module(f'resources_servers.{{n}}.app').WHOSE for n in {builtins!r}]\n")
    (folder / "tests" / "test_whose.py").write_text(
        "from environment_servers.legacy.app import WHOSE as LEGACY\n"
        "from resources_servers.genrm_compare.tests.conftest import SIBLING, WHOSE\n\n\n"
        "def test_the_trees_folders():\n"
        f"    assert (WHOSE, SIBLING, LEGACY) == ({[f'tree:{n}' for n in builtins]!r}, 'util', 'tree:legacy')\n")
    return folder


def test_a_conftest_imports_its_trees_folders_even_where_gymfleet_has_environments_of_those_names(tmp_path):
    """pytest loads a folder's `tests/conftest.py` before `pytest_configure`: the tree must already be entered then,
    or a conftest importing `resources_servers.<name>.app` binds gymfleet's environment of that name (genrm_compare's
    conftest did) and a bare sibling import (`from util import ...`) is not found. Every name gymfleet ships is tried,
    from one folder's conftest (one pytest run), by the bench's runner and by `ng_test`."""
    from gymfleet.testing.nemo_gym_corpus import _tests

    folder = _tree_named_like_gymfleets_environments(tmp_path)
    result = FolderResult("genrm_compare")
    _tests(folder, tmp_path / "scratch", result, "check")
    assert (result.tests_passed, result.tests_total) == (1, 1), result.why
    done = subprocess.run([sys.executable, "-m", "gymfleet.cli.test", f"+entrypoint={folder}",
                           "+pytest_args=[-q,-p,no:warnings]"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and re.search(r"\b1 passed", done.stdout), done.stdout[-3000:] + done.stderr[-2000:]
