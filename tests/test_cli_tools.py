"""The commands a NeMo-Gym user reaches for: ng_test, ng_init_resources_server, ng_reward_profile,
ng_aggregate_rollouts, ng_e2e_collect_rollouts and the `gym` spelling, each on real files, a real pytest and a
real fleet."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import test_conformance

from gymfleet.cli import aggregate, e2e_collect, gym, init_server, reward_profile
from gymfleet.cli import test as ng_test
from gymfleet.cli.reward_profile import pass_at_k
from gymfleet.cli.run import dry_run
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.fleet.config_instances import ServerInstance
from gymfleet.testing import free_port, make_response

ROOT = Path(__file__).resolve().parents[1]
POLICY = "responses_api_models/vllm_model/configs/vllm_model.yaml"
POLICY_ARGS = ["+policy_base_url=http://127.0.0.1:9/v1", "+policy_api_key=k", "+policy_model_name=m"]


def run_main(main, argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---------------------------------------------------------------------------------------------- ng_test


def test_ng_test_runs_the_environment_tests_and_its_conformance_in_pytest(capfd):
    with pytest.raises(SystemExit) as exit_:
        ng_test.main(["+entrypoint=resources_servers/example_weather", "+pytest_args=[-q,-p,no:cacheprovider,-rA]"])
    out = capfd.readouterr().out
    assert exit_.value.code == 0, out[-3000:]
    assert "PASSED resources_servers/example_weather/tests/test_example_weather.py::test_outcomes" in out
    assert "PASSED tests/test_conformance.py::test_environment_conforms[example_weather]" in out
    assert "test_dry_run_validates_every_server[resources_servers/example_weather/configs/example_weather.yaml]" in out
    assert "resources_servers/mcqa" not in out and "[mcqa]" not in out, "one environment only"


def test_ng_test_exit_code_is_pytests(capfd):
    with pytest.raises(SystemExit) as exit_:
        ng_test.main(["+entrypoint=resources_servers/example_weather/", "+pytest_args=--no-such-pytest-option"])
    assert exit_.value.code == 4, capfd.readouterr()  # pytest's usage error, before any collection


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["+entrypoint=resources_servers/exampel_weather"], "Did you mean 'example_weather'?"),
        (["+entrypoint=agents/simple_agent"], "not an environment folder"),
        ([], "entrypoint is required"),
        (["+entrypoint=resources_servers/mcqa", "+pytest_arg=-x"], "Did you mean 'pytest_args'?"),
    ],
    ids=["typo", "not-an-environment", "missing", "unknown-key"],
)
def test_ng_test_refuses_bad_arguments(argv, message, capsys):
    code, _, err = run_main(ng_test.main, argv, capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize("argv", [["ng_test", "+entrypoint=resources_servers/mcqa"], ["ng_test_all"]])
def test_ng_test_without_pytest_names_the_install_command(argv):
    """After `pip install -e .` alone pytest is missing: one message and exit 2, not Python's "No module named"."""
    script = ("import sys; sys.modules['pytest'] = None; from gymfleet.cli import test; "
              f"(test.main if {argv[0]!r} == 'ng_test' else test.main_all)({argv[1:]!r})")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert f"{argv[0]} runs the tests with pytest" in done.stderr and "pip install -e '.[test]'" in done.stderr
    assert "Traceback" not in done.stderr and "$ python -m pytest" not in done.stdout


def test_ng_test_targets_and_ng_test_all_selection(tmp_path, capsys):
    for name, files in {"alpha": ["app.py", "tests/test_alpha.py", "configs/alpha.yaml", "configs/alpha_judge.yaml"],
                        "beta": ["app.py"], "notes": ["README.md"]}.items():
        for file in files:
            (tmp_path / "resources_servers" / name / file).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "resources_servers" / name / file).write_text("")
    assert ng_test.environments(tmp_path) == ["alpha", "beta"], "a folder without app.py is not an environment"
    assert ng_test.targets("alpha", tmp_path) == [
        "resources_servers/alpha/tests",
        "tests/test_conformance.py::test_environment_conforms[alpha]",
        "tests/test_shipped_configs.py::test_dry_run_validates_every_server[resources_servers/alpha/configs/alpha.yaml]",
        "tests/test_shipped_configs.py::test_dry_run_validates_every_server[resources_servers/alpha/configs/"
        "alpha_judge.yaml]",
    ]
    assert ng_test.targets("beta", tmp_path) == ["tests/test_conformance.py::test_environment_conforms[beta]"]
    assert ng_test.select_all(tmp_path) == ["alpha", "beta"]
    assert ng_test.select_all(tmp_path, ["alpha"]) == ["beta"]
    command = ng_test.pytest_command(ng_test.select_all(tmp_path, "beta"), tmp_path, ["-x"])
    assert command == [sys.executable, "-m", "pytest", *ng_test.targets("alpha", tmp_path), "-x"]
    with pytest.raises(Exception, match="Did you mean 'alpha'"):
        ng_test.select_all(tmp_path, ["alpah"])
    assert ng_test.select_all(ROOT) == test_conformance.ENVS, "ng_test_all covers what the conformance test covers"
    code, _, err = run_main(ng_test.main_all, ["+skip=[mcqq]"], capsys)
    assert code == 2 and "Did you mean 'mcqa'?" in err


# ---------------------------------------------------------------------------------------------- ng_init


@pytest.fixture
def scaffolded(tmp_path, monkeypatch, capsys):
    """`ng_init_resources_server` run in a scratch checkout (the repository's other folders linked in)."""
    for folder in ("responses_api_models", "agents"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(init_server.main, ["+entrypoint=resources_servers/tiny_quiz"], capsys)
    assert code == 0, err
    (tmp_path / "resources_servers" / "__init__.py").write_text("")
    return tmp_path, out


def test_scaffold_writes_the_house_layout(scaffolded):
    root, out = scaffolded
    env = root / "resources_servers" / "tiny_quiz"
    assert sorted(str(p.relative_to(env)) for p in env.rglob("*") if p.is_file()) == [
        "__init__.py", "app.py", "configs/tiny_quiz.yaml", "data/example.jsonl", "tests/__init__.py",
        "tests/test_tiny_quiz.py",
    ]
    assert "ng_test +entrypoint=resources_servers/tiny_quiz" in out
    app = (env / "app.py").read_text()
    for name in ("TinyQuizConfig", "TinyQuizRequest", "TinyQuizResponse", "TinyQuizServer"):
        assert f"class {name}(" in app
    rows = [json.loads(line) for line in (env / "data/example.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and len({row["uuid"] for row in rows}) == 5


def test_scaffold_passes_the_conformance_checker_untouched(scaffolded, monkeypatch):
    root, _ = scaffolded
    monkeypatch.setattr(test_conformance, "ROOT", root)
    monkeypatch.setattr(test_conformance, "ServerInstance", functools.partial(ServerInstance, root=root))
    test_conformance.test_environment_conforms("tiny_quiz")  # the very check every environment passes


def test_scaffold_config_passes_ng_runs_dry_run(scaffolded):
    root, _ = scaffolded
    argv = [f"+config_paths=[{POLICY},resources_servers/tiny_quiz/configs/tiny_quiz.yaml]", *POLICY_ARGS,
            f"+head_server.port={free_port()}"]
    plan = dry_run(parse_global_config(GlobalConfigDictParserConfig(cli_args=argv), root=root))
    assert "tiny_quiz_simple_agent" in plan and "3 server instances validated" in plan


def test_scaffold_tests_pass_against_a_real_server(scaffolded):
    root, _ = scaffolded
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
         "resources_servers/tiny_quiz/tests"],
        cwd=root, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "12 passed" in result.stdout, result.stdout[-500:]


def test_scaffold_never_overwrites_and_checks_the_name(scaffolded, capsys):
    root, _ = scaffolded
    app = root / "resources_servers/tiny_quiz/app.py"
    app.write_text("# my work")
    code, _, err = run_main(init_server.main, ["+entrypoint=resources_servers/tiny_quiz"], capsys)
    assert code == 2 and "already exists" in err and app.read_text() == "# my work"
    for bad in ("resources_servers/Tiny-Quiz", "resources_servers/class", "envs/tiny"):
        code, _, err = run_main(init_server.main, [f"+entrypoint={bad}"], capsys)
        assert code == 2, bad
    code, _, err = run_main(init_server.main, ["+entrypoint=resources_servers/ok_env", "+domain=maths"], capsys)
    assert code == 2 and "domain 'maths'" in err and not (root / "resources_servers/ok_env").exists()


# ---------------------------------------------------------------------------------------------- reward profile


def rollout(task, index, reward, agent="quiz_agent", **extra) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": f"question {task}"}]},
            "response": make_response(f"\\boxed{{{reward}}}"), "reward": reward, "_ng_task_index": task,
            "_ng_rollout_index": index, "agent_ref": {"name": agent}, **extra}


@pytest.fixture
def collection(tmp_path):
    """A collector's four files: task 0 passes 3 of 4, task 1 never, task 2 always (one judge failure, one
    superseded one), task 3 only failed."""
    out = tmp_path / "rollouts.jsonl"
    rows = [rollout(0, i, r) for i, r in enumerate([1.0, 0.0, 1.0, 1.0])]
    rows += [rollout(1, i, 0.0) for i in range(4)] + [rollout(2, i, 1.0) for i in (0, 1, 3)]
    write_jsonl(out, rows)
    write_jsonl(tmp_path / "rollouts_failures.jsonl", [
        {**rollout(2, 2, 0.0), "_ng_failure_class": "judge_failed"},
        {**rollout(2, 3, 0.0), "_ng_failure_class": "connection_error", "_ng_superseded": True},
        {**rollout(3, 0, 0.0), "_ng_failure_class": "sandbox_failed"},
    ])
    inputs = [{"question": f"q{t}", "_ng_task_index": t, "_ng_rollout_index": i} for t in range(4) for i in range(4)]
    write_jsonl(tmp_path / "rollouts_materialized_inputs.jsonl", inputs)
    return out


def test_reward_profile_per_task(collection, capsys):
    code, out, err = run_main(reward_profile.main, [f"+input_jsonl_fpath={collection}"], capsys)
    assert code == 0, err
    tasks = {t["_ng_task_index"]: t for t in map(json.loads, (collection.parent / "rollouts_reward_profiling.jsonl")
                                                  .read_text().splitlines())}
    assert sorted(tasks) == [0, 1, 2, 3]
    first = tasks[0]
    assert (first["num_rollouts"], first["mean_reward"], first["variance"]) == (4, 0.75, 0.1875)
    assert (first["pass@1"], first["pass@2"], first["pass@4"]) == (0.75, 1.0, 1.0)
    assert first["sample"] == {"question": "q0"} and first["missing_num_rollouts"] == 0
    assert first["mean/reward"] == 0.75 and [info["reward"] for info in first["rollout_infos"]] == [1.0, 0, 1, 1]
    assert (tasks[1]["pass@4"], tasks[1]["variance"]) == (0.0, 0.0)
    assert (tasks[2]["num_rollouts"], tasks[2]["num_failures"], tasks[2]["failure_classes"]) == (3, 1,
                                                                                                 {"judge_failed": 1})
    assert (tasks[2]["pass@4"], tasks[2]["missing_num_rollouts"]) == (None, 1), "3 rollouts cannot give pass@4"
    assert (tasks[3]["num_rollouts"], tasks[3]["mean_reward"], tasks[3]["num_failures"]) == (0, None, 1)
    assert "1 always passed, 1 never passed, 1 mixed" in out
    assert "11 scored of 16 planned (68.8%); 2 infrastructure failures, left out (judge_failed: 1, sandbox_failed: 1)"\
        in out
    assert "Tasks without a scored rollout: [3]" in out
    header = next(line for line in out.splitlines() if line.startswith("TASK"))
    assert header.split() == ["TASK", "AGENT", "N", "FAILED", "MEAN", "VAR", "PASS@1", "PASS@2", "PASS@4"]


def test_reward_profile_shows_progress_reading_a_large_file(collection, capsys, monkeypatch):
    """Off a terminal, reading a large rollouts file prints plain progress lines on stderr (no carriage returns)."""
    monkeypatch.setattr("gymfleet.rollouts.rows.PROGRESS_MIN_BYTES", 0)  # every file counts as large
    code, _, err = run_main(reward_profile.main, [f"+input_jsonl_fpath={collection}"], capsys)
    assert code == 0, err
    assert f"Reading {collection.name}:" in err and "(100%)" in err and "\r" not in err


def test_reward_profile_in_nemo_gyms_spelling_takes_samples_from_the_dataset(tmp_path, capsys):
    dataset = write_jsonl(tmp_path / "data.jsonl", [{"question": "a"}, {"question": "b"}, {"question": "a"}])
    rollouts = write_jsonl(tmp_path / "r.jsonl", [rollout(0, 0, 0.5), rollout(1, 0, 1.0), rollout(1, 1, 0.0)])
    output = tmp_path / "profiled.jsonl"
    argv = [f"+input_jsonl_fpath={dataset}", f"+rollouts_jsonl_fpath={rollouts}", f"+output_jsonl_fpath={output}",
            "+pass_threshold=0.5", "++allow_partial_rollouts=True", "+max_table_rows=0"]
    code, out, err = run_main(reward_profile.main, argv, capsys)
    assert code == 0, err
    tasks = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(t["sample"], t["pass_rate"]) for t in tasks] == [({"question": "a"}, 1.0), ({"question": "b"}, 0.5)]
    assert "TASK" not in out and "Wrote 2 task rows" in out


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"reward": 1.0}'], "r.jsonl:1: no _ng_task_index"),
        ([json.dumps(rollout(0, 0, 1.0)), json.dumps({**rollout(0, 1, 1.0), "reward": None})],
         "r.jsonl:2: reward None is not a finite number"),
        ([json.dumps({**rollout(0, 0, 1.0), "reward": "1.0"})], "reward '1.0' is not a finite number"),
        ([json.dumps({**rollout(0, 0, 1.0), "reward": True})], "reward True is not a finite number"),
        (["not json"], "r.jsonl:1: not a JSON object"),
        (["[1, 2]"], "r.jsonl:1: not a JSON object"),
    ],
    ids=["no-task-index", "null-reward", "string-reward", "bool-reward", "not-json", "not-an-object"],
)
def test_reward_profile_refuses_bad_rows_naming_the_line(lines, message, tmp_path, capsys):
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    code, _, err = run_main(reward_profile.main, [f"+input_jsonl_fpath={tmp_path / 'r.jsonl'}"], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "r_reward_profiling.jsonl").exists()


def test_reward_profile_missing_file_and_typo(tmp_path, capsys):
    code, _, err = run_main(reward_profile.main, [f"+input_jsonl_fpath={tmp_path / 'none.jsonl'}"], capsys)
    assert code == 2 and "no such file" in err
    code, _, err = run_main(reward_profile.main, ["+input_jsonl_fpath=x", "+pass_treshold=1"], capsys)
    assert code == 2 and "Did you mean 'pass_threshold'?" in err


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(4, 3, 1, 0.75), (4, 1, 2, 0.5), (5, 2, 2, 0.7), (3, 0, 3, 0.0), (3, 3, 1, 1.0), (2, 1, 3, None)],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == (None if expected is None else pytest.approx(expected))


# ---------------------------------------------------------------------------------------------- aggregate


def test_aggregate_rollouts_over_shards_leaves_failures_out(tmp_path, capsys):
    shard0 = write_jsonl(tmp_path / "s0.jsonl", [rollout(0, 0, 1.0), rollout(0, 1, 0.0, agent="other")])
    shard1 = write_jsonl(tmp_path / "s1.jsonl", [rollout(1, 0, 1.0), {**rollout(1, 1, 0.0),
                                                                     "_ng_failure_class": "judge_failed"}])
    argv = [f"+input_jsonl_fpaths=[{shard0},{shard1}]"]
    code, out, err = run_main(aggregate.main, argv, capsys)
    assert code == 0, err
    entries = json.loads((tmp_path / "s0_aggregate_metrics.json").read_text())
    assert [e["agent_ref"]["name"] for e in entries] == ["quiz_agent", "other"]
    assert entries[0]["key_metrics"]["mean/reward"] == 1.0 and entries[1]["key_metrics"]["mean/reward"] == 0.0
    assert [g["_ng_task_index"] for g in entries[0]["group_level_metrics"]] == [0, 1]
    assert "3 aggregated, 1 infrastructure failures left out (judge_failed: 1)" in out
    code, _, err = run_main(aggregate.main, argv, capsys)
    assert code == 2 and "+overwrite=true" in err, "an existing output is never replaced silently"
    code, _, err = run_main(aggregate.main, [], capsys)
    assert code == 2 and "input_jsonl_fpath" in err


# ---------------------------------------------------------------------------------------------- e2e + gym


def test_e2e_collect_starts_collects_stops_and_the_tools_read_its_output(tmp_path, capsys):
    """The quickstart fleet (scripted LLM: tasks 0, 2, 4 right), two rollouts per row, then profile and aggregate
    of its output, which must agree with the collector's own aggregate."""
    head_port = free_port()
    out = tmp_path / "run" / "rollouts.jsonl"
    argv = ["+config_paths=[configs/quickstart.yaml]", "+input_jsonl_fpath=resources_servers/mcqa/data/example.jsonl",
            f"+output_jsonl_fpath={out}", "+num_repeats=2", f"+head_server.port={head_port}"]
    code, stdout, err = run_main(e2e_collect.main, argv, capsys)
    assert code == 0, stdout[-3000:] + err[-3000:]
    assert "Rollouts: 10 ok, 0 failed" in stdout and "Fleet stopped." in stdout
    assert (tmp_path / "run" / "rollouts_logs" / "mcqa.log").exists(), "logs beside the output"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{head_port}/", timeout=2)  # the fleet is gone

    code, stdout, err = run_main(gym.main, ["eval", "profile", f"+input_jsonl_fpath={out}"], capsys)
    assert code == 0, err
    tasks = [json.loads(line) for line in (tmp_path / "run" / "rollouts_reward_profiling.jsonl").read_text()
             .splitlines()]
    assert [(t["_ng_task_index"], t["num_rollouts"], t["pass@1"], t["variance"]) for t in tasks] == [
        (0, 2, 1.0, 0.0), (1, 2, 0.0, 0.0), (2, 2, 1.0, 0.0), (3, 2, 0.0, 0.0), (4, 2, 1.0, 0.0)]
    assert all(t["expected_num_rollouts"] == 2 and t["sample"]["expected_answer"] for t in tasks)

    mine = tmp_path / "offline_metrics.json"
    code, _, err = run_main(aggregate.main, [f"+input_jsonl_fpath={out}", f"+output_json_fpath={mine}"], capsys)
    assert code == 0, err
    collectors = json.loads((tmp_path / "run" / "rollouts_aggregate_metrics.json").read_text())
    assert json.loads(mine.read_text()) == collectors and collectors[0]["key_metrics"]["mean/reward"] == 0.6

    code, _, err = run_main(e2e_collect.main, argv, capsys)
    assert code == 2 and "+overwrite=true" in err, "an earlier run's output is refused before any fleet starts"


def test_gym_help_lists_every_command(capsys):
    code, out, _ = run_main(gym.main, ["--help"], capsys)
    assert code == 0
    for spelling in ("env start", "env validate", "env status", "env test", "env init", "eval run",
                     "eval aggregate", "eval profile", "eval reverify", "dataset collate"):
        assert f"gym {spelling}" in out
    for name in ("ng_run", "ng_status", "ng_test", "ng_init_resources_server", "ng_collect_rollouts",
                 "ng_aggregate_rollouts", "ng_reward_profile", "ng_prepare_data", "ng_e2e_collect_rollouts"):
        assert name in out


def test_gym_env_validate_is_a_dry_run_with_flags_translated(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = ["env", "validate", "--model-type", "vllm_model", "--resources-server", "mcqa", "--model", "m",
            "--model-url=http://127.0.0.1:9/v1", "--model-api-key", "k"]
    code, out, err = run_main(gym.main, argv, capsys)
    assert code == 0, err
    assert "mcqa_simple_agent" in out and "nothing started" in out and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["env", "strat"], "Did you mean 'start'?"),
        (["evla", "run"], "Did you mean 'eval'?"),
        (["eval"], "gym eval needs a command: aggregate, e2e, profile, reverify, run"),
        (["eval", "reverify", "+input_jsonl_fpath=x"], "'gym eval reverify' is not yet available"),
        (["env", "start", "--confg", "x.yaml"], "unknown flag '--confg'"),
        (["env", "start", "--config"], "--config needs a value"),
    ],
    ids=["command-typo", "group-typo", "no-command", "reverify", "flag-typo", "flag-without-value"],
)
def test_gym_usage_errors(argv, message, capsys):
    if argv[:2] == ["eval", "reverify"] and (ROOT / "gymfleet/cli/reverify.py").exists():
        message = "input_jsonl_fpath"  # ng_reverify exists now: gym routes to it
    code, _, err = run_main(gym.main, argv, capsys)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        (("env", "start"), ["--config", "a.yaml", "--config=b.yaml,c.yaml", "+x=1"],
         ["+x=1", "+config_paths=[a.yaml,b.yaml,c.yaml]"]),
        (("env", "start"), ["+config_paths=[a.yaml]", "--resources-server", "mcqa"],
         ["+config_paths=[a.yaml,resources_servers/mcqa/configs/mcqa.yaml]"]),
        (("env", "test"), ["--resources-server", "mcqa"], ["+entrypoint=resources_servers/mcqa"]),
        (("env", "init"), ["--resources-server=new_env"], ["+entrypoint=resources_servers/new_env"]),
        (("eval", "run"), ["--model-type", "vllm_model/vllm_model_for_training", "-m", "p", "--json"],
         ["+policy_model_name=p", "+json=true",
          "+config_paths=[responses_api_models/vllm_model/configs/vllm_model_for_training.yaml]"]),
        (("env", "status"), ["--help"], ["--help"]),
    ],
    ids=["configs-merged", "explicit-config-paths-kept-first", "test-entrypoint", "init-entrypoint", "model-flags",
         "help"],
)
def test_gym_flag_translation(command, args, expected):
    assert gym.translate(command, args) == expected


def test_gym_routes_to_the_same_implementation(capsys):
    """`gym env test --help` prints ng_test's help, `gym dataset collate --help` ng_prepare_data's."""
    for argv, first_line in ((["env", "test", "--help"], ng_test.__doc__), (["eval", "aggregate", "--help"],
                                                                             aggregate.__doc__)):
        code, out, _ = run_main(gym.main, argv, capsys)
        assert code == 0 and out.strip().startswith(first_line.strip().splitlines()[0])
