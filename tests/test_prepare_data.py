"""`ng_prepare_data` on mcqa's own example rows and on NeMo-Gym's, with real config files."""

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from gymfleet.cli.prepare_data import main as prepare_main
from gymfleet.fleet.config_instances import repository_root
from gymfleet.rollouts.prepare_data import dataset_metrics, metric_differences
from gymfleet.testing import nemo_gym_examples
from gymfleet.testing.fleets import datasets_config

ROOT = repository_root()
NEMO_GYM_ROWS = nemo_gym_examples("mcqa")
INVALID = Path(__file__).parent / "fixtures/data/mcqa_invalid_rows.jsonl"
AGENT_REF = {"type": "responses_api_agents", "name": "mcqa_simple_agent"}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # datasets resolve against cwd first, so metrics files land in tmp_path


def prepare(*args: str, config: str = "resources_servers/mcqa/configs/mcqa.yaml", mode="example_validation") -> int:
    with pytest.raises(SystemExit) as exited:
        prepare_main([f"+config_paths=[{config}]", "+output_dirpath=out", f"+mode={mode}", *args])
    return exited.value.code


def lines(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def agent_config(tmp_path: Path, datasets: str) -> str:
    """A config with mcqa's servers and the given `datasets:` YAML on its agent."""
    datasets_config(tmp_path / "cfg.yaml", "resources_servers/mcqa/configs/mcqa.yaml", "mcqa_simple_agent",
                    "simple_agent", yaml.safe_load(textwrap.dedent(datasets)))
    return "cfg.yaml"


def copy_rows(source: Path, tmp_path: Path, name: str = "example.jsonl") -> Path:
    target = tmp_path / "data" / name
    target.parent.mkdir(exist_ok=True)
    shutil.copy(source, target)
    return target


def test_example_validation_on_mcqa_example(tmp_path, capsys):
    source = ROOT / "resources_servers/mcqa/data/example.jsonl"
    copy = tmp_path / "resources_servers/mcqa/data/example.jsonl"
    copy.parent.mkdir(parents=True)
    shutil.copy(source, copy)

    assert prepare() == 0

    rows = lines("out/example.jsonl")
    assert [{k: v for k, v in r.items() if k != "agent_ref"} for r in rows] == lines(source)
    assert all(r["agent_ref"] == AGENT_REF for r in rows)
    metrics = json.loads((copy.parent / "example_metrics.json").read_text())
    assert metrics["name"] == "example" and metrics["type"] == "example" and metrics["Number of examples"] == 5
    assert metrics["Number of turns"]["Average"] == 1.0
    assert metrics["uuid"] == {"unique_count": 5, "total_count": 5}
    assert json.loads(Path("out/example_metrics.json").read_text())["Number of examples"] == 5
    assert "Wrote 5 example rows to out/example.jsonl" in capsys.readouterr().out


def test_quickstart_config_needs_no_running_model(tmp_path):
    copy_rows(ROOT / "resources_servers/mcqa/data/example.jsonl", tmp_path)
    (tmp_path / "quick.yaml").write_text(textwrap.dedent(f"""\
        config_paths: [{ROOT / "configs/quickstart.yaml"}]
        mcqa_simple_agent:
          responses_api_agents:
            simple_agent:
              datasets: [{{name: e, type: example, jsonl_fpath: data/example.jsonl}}]
        """))
    assert prepare(config="quick.yaml") == 0
    assert len(lines("out/example.jsonl")) == 5


def test_nemo_gym_rows_in_both_modes(tmp_path):
    copy_rows(NEMO_GYM_ROWS / "example.jsonl", tmp_path)
    copy_rows(NEMO_GYM_ROWS / "example.jsonl", tmp_path, "ex.jsonl")  # its own metrics file
    copy_rows(NEMO_GYM_ROWS / "example_with_template_metadata.jsonl", tmp_path, "validation.jsonl")
    config = agent_config(tmp_path, """\
        - {name: train, type: train, jsonl_fpath: data/example.jsonl, num_repeats: 2, license: Apache 2.0}
        - {name: val, type: validation, jsonl_fpath: data/validation.jsonl, license: Apache 2.0}
        - {name: ex, type: example, jsonl_fpath: data/ex.jsonl}
        """)

    assert prepare(config=config, mode="train_preparation") == 0

    source = lines(tmp_path / "data/example.jsonl")
    train = lines("out/train.jsonl")
    assert len(train) == 10 and train[0] == train[1] == {**source[0], "agent_ref": AGENT_REF}, "abc -> aabbcc"
    assert train[8]["uuid"] == source[4]["uuid"]
    assert len(lines("out/validation.jsonl")) == 5 and not Path("out/example.jsonl").exists()
    assert json.loads(Path("out/train_metrics.json").read_text())["Number of examples"] == 10
    assert json.loads((tmp_path / "data/example_metrics.json").read_text())["license"] == "Apache 2.0"

    assert prepare(config=config) == 0
    assert len(lines("out/example.jsonl")) == 5


def test_every_invalid_line_is_reported_and_nothing_written(tmp_path, capsys):
    rows = copy_rows(INVALID, tmp_path)
    config = agent_config(tmp_path, "- {name: ex, type: example, jsonl_fpath: data/example.jsonl}\n")

    assert prepare(config=config) == 2

    err = capsys.readouterr().err
    assert "4 invalid rows" in err
    assert f"{rows.relative_to(tmp_path)}:2: not valid JSON" in err
    assert "data/example.jsonl:3: expected a JSON object, got list" in err
    assert "data/example.jsonl:4: responses_create_params: input" in err
    assert "data/example.jsonl:5: not a valid MCQARequest: expected_answer: Field required" in err
    assert not Path("out").exists() and not (tmp_path / "data/example_metrics.json").exists()


def test_skip_invalid_rows_keeps_the_good_ones_and_counts_the_rest(tmp_path, capsys):
    copy_rows(INVALID, tmp_path)
    config = agent_config(tmp_path, "- {name: ex, type: example, jsonl_fpath: data/example.jsonl}\n")

    assert prepare("+skip_invalid_rows=true", config=config) == 0

    assert len(lines("out/example.jsonl")) == 1
    metrics = json.loads((tmp_path / "data/example_metrics.json").read_text())
    assert metrics["Number of examples"] == 1 and metrics["Number of skipped rows"] == 4
    assert capsys.readouterr().out.count("skipped invalid row data/example.jsonl:") == 4


def test_metrics_conflicts_fail_until_overwritten(tmp_path, capsys):
    rows = copy_rows(ROOT / "resources_servers/mcqa/data/example.jsonl", tmp_path)
    config = agent_config(tmp_path, "- {name: ex, type: example, jsonl_fpath: data/example.jsonl}\n")
    assert prepare(config=config) == 0
    assert prepare(config=config) == 0, "same data, same metrics: no conflict"
    rows.write_text(rows.read_text() + rows.read_text().splitlines(keepends=True)[0])

    assert prepare(config=config) == 2
    assert "Number of examples: 5 -> 6" in capsys.readouterr().err
    conflict = tmp_path / "data/example_metrics_conflict.json"
    assert json.loads(conflict.read_text())["Number of examples"] == 6

    assert prepare("+overwrite_metrics_conflicts=true", config=config) == 0
    assert not conflict.exists()
    assert json.loads((tmp_path / "data/example_metrics.json").read_text())["Number of examples"] == 6


def test_declaration_problems_name_their_yaml_path(tmp_path, capsys):
    copy_rows(ROOT / "resources_servers/mcqa/data/example.jsonl", tmp_path)
    config = agent_config(tmp_path, "- {name: t, type: train, jsonl_fpath: data/example.jsonl}\n")
    assert prepare(config=config, mode="train_preparation") == 2
    assert "simple_agent.datasets[0].license: train datasets must name a license" in capsys.readouterr().err

    config = agent_config(tmp_path, "- {name: e, type: example, jsonl_fpath: data/missing.jsonl}\n")
    assert prepare(config=config) == 2
    assert "datasets[0].jsonl_fpath: data/missing.jsonl does not exist" in capsys.readouterr().err
    assert prepare(config=config, mode="train_preparation") == 2
    assert "no train or validation datasets declared on any agent" in capsys.readouterr().err

    config = agent_config(tmp_path, """\
        - {name: a, type: example, jsonl_fpath: data/example.jsonl}
        - {name: b, type: example, jsonl_fpath: data/example.jsonl, num_repeats: 2}
        """)
    assert prepare(config=config) == 2
    assert "two datasets would write different metrics to data/example_metrics.json" in capsys.readouterr().err


def test_dataset_metrics_blocks():
    rows = [
        {"responses_create_params": {"input": "hi", "temperature": 0.5, "tools": [{"name": "f", "type": "function"}]},
         "score": 1, "flag": True, "tags": ["a", "b"], "nested": {"x": 1}, "maybe": None},
        {"responses_create_params": {"input": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                               {"role": "user", "content": "v"}]},
         "score": 3.0, "flag": False, "tags": ["a"]},
    ]
    metrics = dataset_metrics(rows)
    assert metrics["Number of examples"] == 2
    assert metrics["Number of tools"] == {"Total # non-null values": 2, "Average": 0.5, "Min": 0.0, "Max": 1.0,
                                          "Standard deviation": 0.7071}
    assert metrics["Number of turns"]["Max"] == 2.0 and metrics["Temperature"]["Total # non-null values"] == 1
    assert metrics["score"]["Average"] == 2.0 and metrics["flag"]["Average"] == 0.5
    assert metrics["tags"] == {"unique_count": 2, "total_count": 3}
    assert "nested" not in metrics and "maybe" not in metrics


def test_metric_differences_tolerate_float_noise_and_list_order():
    old = {"a": 1.0, "b": {"Average": 0.3333}, "c": ["x", "y"], "d": "s"}
    assert metric_differences(old, {"a": 1.0004, "b": {"Average": 0.3334}, "c": ["y", "x"], "d": "s"}) == []
    assert metric_differences(old, {**old, "a": 1.1, "d": "t", "e": 1}) == [
        "a: 1.0 -> 1.1", "d: 's' -> 't'", "e: only in one of them"]


def test_responses_parameters_nobody_knows_are_named_once_each(tmp_path, caplog):
    """Unknown `responses_create_params` keys pass (newer clients add some), but a typo is named with its line."""
    rows = [json.loads(line) for line in (ROOT / "resources_servers/mcqa/data/example.jsonl").read_text().splitlines()]
    rows[1]["responses_create_params"]["temprature"] = 0.6
    rows[3]["responses_create_params"]["temprature"] = 0.6
    rows[2]["responses_create_params"]["prompt_cache_retention"] = "24h"  # a real parameter of newer clients
    target = tmp_path / "data/example.jsonl"
    target.parent.mkdir()
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = agent_config(tmp_path, "- {name: e, type: example, jsonl_fpath: data/example.jsonl}\n")

    assert prepare(config=config) == 0

    warnings = [r.getMessage() for r in caplog.records if "responses_create_params." in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("data/example.jsonl:2: responses_create_params.temprature (in 2 rows)")
    assert warnings[0].endswith("Did you mean 'temperature'?")
    assert len(lines("out/example.jsonl")) == 5
