"""The data-tooling corner of the `nemo_gym` surface, in process (no server: these are pure functions): a folder's
`task_data.py` schema and the row checks against it (`nemo_gym.task_data`), `RewardProfiler`'s per-rollout view
(`nemo_gym.reward_profile`), `ResponsesConverter` (`nemo_gym.responses_converter`) on gymfleet's conversion, and the
rollout-record helpers (`rollout_collection`'s failure keys and rules, `path_utils`, `deliverables`)."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from nemo_gym.deliverables import IGNORE_FILES, is_deliverable
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.path_utils import aggregate_metrics_path_for, failures_path_for, materialized_path_for
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.reward_profile import RewardProfiler
from nemo_gym.rollout_collection import (
    NG_FAILURE_CLASS_KEY,
    NG_TERMINAL_KEY,
    DispatchLatencyTracker,
    get_max_rollout_attempts,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
    observed_elapsed,
)
from nemo_gym.task_data import (
    RESERVED_ROW_KEYS,
    TaskDataSchemaError,
    TaskDataValidator,
    load_task_data_schema,
    normalize_task_fields,
)

TASK_DATA = '''
from typing import Optional
from pydantic import BaseModel, ConfigDict, Field

class TaskData(BaseModel):
    model_config = ConfigDict(extra="allow")
    question: str
    answer: Optional[str] = Field(default=None, json_schema_extra={"legacy_location": "verifier_metadata"})
'''


@pytest.fixture
def schema(tmp_path):
    folder = tmp_path / "my_env"
    folder.mkdir()
    (folder / "task_data.py").write_text(TASK_DATA)
    return load_task_data_schema(folder)


def test_a_folder_without_task_data_has_no_schema_and_a_broken_one_is_named(tmp_path):
    assert load_task_data_schema(tmp_path) is None
    (tmp_path / "task_data.py").write_text("TaskDataa = int\n")
    with pytest.raises(TaskDataSchemaError, match=r"task_data\.py: exports no `TaskData`"):
        load_task_data_schema(tmp_path)
    (tmp_path / "task_data.py").write_text("import no_such_module_here\n")
    with pytest.raises(TaskDataSchemaError, match="does not import: ModuleNotFoundError"):
        load_task_data_schema(tmp_path)


def test_normalize_splices_every_container_placement_the_same_way():
    """Flat, legacy-nested and migrated rows normalize alike, for every split of the fields between places; a value
    that differs between two places is a conflict, never silently replaced."""
    fields = {"question": "q", "answer": "a", "extra": 1}
    framework = dict.fromkeys(RESERVED_ROW_KEYS, "x")
    for placement in itertools.product(("top", "verifier_metadata", "task_data"), repeat=len(fields)):
        row = dict(framework)
        for (key, value), where in zip(fields.items(), placement, strict=True):
            (row if where == "top" else row.setdefault(where, {}))[key] = value
        assert normalize_task_fields(row) == (fields, []), placement
    assert normalize_task_fields({"answer": "a", "verifier_metadata": {"answer": "b"}}) == ({"answer": "a"},
                                                                                            ["answer"])
    assert normalize_task_fields({"task_data": "not a dict"}) == ({"task_data": "not a dict"}, [])


def test_validator_reports_failures_unknown_misplaced_and_conflicting_keys(schema):
    validator = TaskDataValidator("my_env", schema, "data/example.jsonl")
    validator.validate_row(0, {"question": "q", "verifier_metadata": {"answer": "a"}})
    assert validator.report.clean, validator.report.summary()
    validator.validate_row(1, {"answer": "a"})  # no question; answer only top-level, where the server won't look
    validator.validate_row(2, {"question": "q", "colour": "red"})
    validator.validate_row(3, {"question": "q", "verifier_metadata": {"question": "other"}})
    report = validator.report
    assert (report.rows, report.error_rows) == (4, 1) and not report.clean
    assert report.errors[0].startswith("1: ") and "question" in report.errors[0]
    assert report.unknown_keys == {"colour": 1} and report.conflicting_keys == {"question": 1}
    assert report.misplaced_keys == {"answer": 1}
    summary = report.summary()
    assert summary.startswith("data/example.jsonl: 1/4 rows failed task_data validation against the `my_env`")
    assert "colour (1 rows)" in summary and "answer (1 rows)" in summary


def test_validator_reads_a_materialized_task_from_its_task_input(schema):
    validator = TaskDataValidator("my_env", schema, "x.jsonl")
    validator.validate_row(0, {"task_id": {"id": 1}, "task_input": {"task_data": {"question": "q"}, "answer": "a"}})
    validator.validate_row(1, {"task_id": {"id": 2}, "task_input": ["not", "an", "object"]})
    assert validator.report.error_rows == 1 and validator.report.errors == [
        "1: task_input must be an object, got list"]
    assert not validator.report.misplaced_keys, "a migrated row's top level is the right place"


def test_rollout_info_keeps_numbers_and_drops_private_and_nested_fields():
    rng = random.Random(23)
    for _ in range(50):
        result = {"_ng_task_index": rng.randrange(9), "_ng_rollout_index": rng.randrange(9), "reward": rng.random(),
                  "response": {"usage": {"input_tokens": 3, "output_tokens": 4, "details": {"x": 1}}},
                  "_ng_group_attempt": 2, "passed": rng.choice([True, False]), "score": 0.5, "name": "n",
                  "nested": {"a": 1}}
        info = RewardProfiler().rollout_info_from_result(result)
        assert info == {
            "rollout_id": f"{result['_ng_task_index']}:{result['_ng_rollout_index']}",
            "_ng_task_index": result["_ng_task_index"], "_ng_rollout_index": result["_ng_rollout_index"],
            "reward": result["reward"], "input_tokens": 3, "output_tokens": 4, "passed": int(result["passed"]),
            "score": 0.5,
        }
    with pytest.raises(KeyError, match="_ng_task_index"):
        RewardProfiler().rollout_info_from_result({"reward": 1.0})


def test_align_pairs_rows_and_results_by_rollout_key():
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r} for t in range(2) for r in range(2)]
    results = [{**row, "reward": 1.0} for row in reversed(rows)]
    assert [(a, b["reward"]) for a, b in RewardProfiler().align_rows_and_results(rows, results)] == [
        (row, 1.0) for row in rows]
    with pytest.raises(ValueError, match=r"no rollout result for 1 .*\(1, 1\)"):
        RewardProfiler().align_rows_and_results(rows, results[1:])
    assert len(RewardProfiler().align_rows_and_results(rows, results[1:], allow_partial_rollouts=True)) == 3
    with pytest.raises(ValueError, match="duplicate result row"):
        RewardProfiler().align_rows_and_results(rows, results + results[:1])


def test_converter_keeps_tool_results_paired_and_plain_turns_without_tool_calls():
    params = NeMoGymResponseCreateParamsNonStreaming(model="m", input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "thanks"},
    ])
    messages = ResponsesConverter(return_token_id_information=False).responses_to_chat_completion_create_params(
        params).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "user"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [messages[2]["tool_call_id"]] == ["c1"]
    assert "tool_calls" not in messages[3]


def test_relative_read_paths_resolve_under_the_working_directory_then_the_folders_tree(tmp_path, monkeypatch):
    """NeMo-Gym's search order: extra roots, the working directory (a served folder's own), then its tree
    (`PARENT_DIR`), so `resources_servers/<env>/prompts/judge.yaml` is found from inside the folder."""
    from gymfleet.serving.nemo_gym_paths import EXTRA_ROOTS_ENV, FOLDER_TREE_ENV, parent_dir
    from nemo_gym import _resolve_under_cwd_or_install
    from nemo_gym.prompt import load_prompt_config

    tree, extra = tmp_path / "tree", tmp_path / "extra"
    folder = tree / "resources_servers" / "my_env"
    (folder / "prompts").mkdir(parents=True)
    (folder / "prompts" / "judge.yaml").write_text("user: 'Is {a} right?'\n")
    (folder / "local.txt").write_text("folder's own")
    (tree / "local.txt").write_text("tree's")
    monkeypatch.chdir(folder)
    monkeypatch.setenv(FOLDER_TREE_ENV, str(tree))
    assert parent_dir() == tree
    relative = "resources_servers/my_env/prompts/judge.yaml"
    assert _resolve_under_cwd_or_install(relative) == tree / relative
    assert load_prompt_config(relative).user == "Is {a} right?"
    assert _resolve_under_cwd_or_install("local.txt").read_text() == "folder's own", "the working directory first"
    assert _resolve_under_cwd_or_install("nowhere.txt") == folder / "nowhere.txt", "missing: named where the user is"
    assert _resolve_under_cwd_or_install(tree / "local.txt") == tree / "local.txt"
    extra.mkdir()
    (extra / "local.txt").write_text("extra")
    monkeypatch.setenv(EXTRA_ROOTS_ENV, str(extra))
    assert _resolve_under_cwd_or_install("local.txt").read_text() == "extra"


def test_compute_aggregate_metrics_returns_nemo_gyms_model():
    """Folders' tests read `compute_aggregate_metrics(...).key_metrics`, as NeMo-Gym returns an `AggregateMetrics`."""
    from nemo_gym.base_resources_server import AggregateMetrics
    from nemo_gym.reward_profile import compute_aggregate_metrics

    rows = [{"reward": float(i % 2), "_ng_task_index": i, "_ng_rollout_index": 0} for i in range(4)]
    result = compute_aggregate_metrics(rows, get_key_metrics_fn=lambda agent: {"mean": agent["mean/reward"]})
    assert isinstance(result, AggregateMetrics) and result.key_metrics == {"mean": 0.5}
    assert compute_aggregate_metrics([]) == AggregateMetrics()


@pytest.mark.parametrize("failure_class", [None, "timeout_exceeded", "reference_missing", "eval_missing",
                                           "transport_ineligible", "skipped", "judge_failed"])
@pytest.mark.parametrize("stamped", [False, True])
def test_terminal_failures_follow_the_stamp_unless_the_retry_opt_in_names_the_class(failure_class, stamped):
    row = {NG_FAILURE_CLASS_KEY: failure_class, NG_TERMINAL_KEY: stamped}
    assert is_terminal_failure(row) is stamped
    expected = {"timeout_exceeded": False, "reference_missing": False, "eval_missing": False,
                "transport_ineligible": False, "skipped": True}.get(failure_class, stamped)
    assert is_terminal_failure(row, retry_terminal_timeouts=True) is expected


def test_record_helpers_elapsed_attempts_sidecars_and_deliverables(monkeypatch, tmp_path, caplog):
    assert observed_elapsed({"elapsed_seconds": "2.5"}) == 2.5
    assert observed_elapsed({"elapsed_seconds": 0, "response": {"metadata": {"elapsed_seconds": 4}}}) == 4.0
    assert observed_elapsed({"elapsed_seconds": "x", "response": None}) is None
    for raw, attempts in (("", 3), ("5", 5), ("0", 3), ("-2", 3), ("many", 3)):
        monkeypatch.setenv("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", raw)
        assert get_max_rollout_attempts() == attempts, raw
    assert "'many' is not a positive integer" in caplog.text
    out = tmp_path / "results" / "rollouts.jsonl"
    assert [p.name for p in (failures_path_for(out), materialized_path_for(out), aggregate_metrics_path_for(out))] == [
        "rollouts_failures.jsonl", "rollouts_materialized_inputs.jsonl", "rollouts_aggregate_metrics.json"]
    (tmp_path / "report.docx").write_text("x")
    (tmp_path / "history.json").write_text("x")
    assert [p.name for p in sorted(tmp_path.iterdir()) if is_deliverable(p)] == ["report.docx"]
    assert "history.json" in IGNORE_FILES


def test_dispatch_latency_tracker_quantiles_margin_and_summary():
    tracker = DispatchLatencyTracker()
    assert tracker.quantile(0.5) is None and tracker.drain_margin(None) is None
    assert "No completed rollouts" in tracker.summary()
    values = [random.Random(seed).uniform(1, 600) for seed in range(9)]
    for i, value in enumerate(values):
        tracker.record(value)
        tracker.record(-value)  # not a duration: ignored
        tracker.record(0)
        ordered = sorted(values[:i + 1])
        for q in (0.0, 0.25, 0.5, 0.75, 0.9, 1.0):  # linear between the closest ranks, as NeMo-Gym's
            at = (len(ordered) - 1) * q
            low, high = int(at), min(int(at) + 1, len(ordered) - 1)
            assert tracker.quantile(q) == pytest.approx(ordered[low] + (ordered[high] - ordered[low]) * (at - low))
        assert tracker.drain_margin(None) == (tracker.quantile(0.75) if i + 1 >= 5 else None)
        assert tracker.drain_margin(7.0) == 7.0
    tracker.record_drained()
    assert tracker.drained == 1
    summary = tracker.summary()
    assert f"over {len(values)} completed rollout(s)" in summary and f"max {max(values) / 60:.1f} min" in summary
    assert "Drained (not dispatched, no time left in the budget): 1." in summary


def test_invalid_judge_rows_move_to_the_failures_sidecar_once(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    assert migrate_invalid_judge_main_rows(out) == 0  # no file yet
    kept = {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}
    delivered = tmp_path / "task1"
    delivered.mkdir()
    (delivered / "report.docx").write_text("x")
    (tmp_path / "task2").mkdir()
    (tmp_path / "task2" / "history.json").write_text("run state, not a deliverable")
    invalid = [
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "invalid_judge_response": True, "reward": 0.0,
         NG_TERMINAL_KEY: True, "deliverables_dir": str(delivered)},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "invalid_judge_response": True, NG_FAILURE_CLASS_KEY: "x",
         "deliverables_dir": str(tmp_path / "task2"), "reuse_cached_deliverable": True},
    ]
    out.write_text("".join(json.dumps(row) + "\n" for row in [kept, *invalid]))
    out.chmod(0o640)
    assert migrate_invalid_judge_main_rows(out) == 2
    assert [json.loads(line) for line in out.read_text().splitlines()] == [kept]
    assert out.stat().st_mode & 0o777 == 0o640
    moved = [json.loads(line) for line in failures_path_for(out).read_text().splitlines()]
    assert [row[NG_FAILURE_CLASS_KEY] for row in moved] == ["judge_invalid", "x"]
    assert all(row["_ng_migrated_invalid_judge_response"] and NG_TERMINAL_KEY not in row for row in moved)
    assert moved[0]["reuse_cached_deliverable"] is True and "reuse_cached_deliverable" not in moved[1]
    out.write_text("".join(json.dumps(row) + "\n" for row in [kept, *invalid]))  # the legacy rows come back
    assert migrate_invalid_judge_main_rows(out) == 2
    assert len(failures_path_for(out).read_text().splitlines()) == 2, "a migrated row is not moved twice"
    assert [json.loads(line) for line in out.read_text().splitlines()] == [kept]
    assert migrate_invalid_judge_main_rows(out) == 0
    assert not list(tmp_path.glob(".rollouts.jsonl.migrate-*"))
