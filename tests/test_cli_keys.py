"""A `+key=value` that nothing reads is an error with a did-you-mean, in every command, before any work starts."""

from __future__ import annotations

import pytest

from gymfleet.cli import collect, dump_config, prepare_data, quickstart, run, status

MCQA = "resources_servers/mcqa/configs/mcqa.yaml"
FLEET = f"responses_api_models/vllm_model/configs/vllm_model.yaml,{MCQA}"
POLICY = ["+policy_base_url=http://127.0.0.1:9/v1", "+policy_api_key=k", "+policy_model_name=m"]


def exit_code_and_stderr(main, argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "argv", "typo", "meant"),
    [
        (collect.main, ["+input_jsonl_fpath=in.jsonl", "+output_jsonl_fpath=out.jsonl", "+num_repeat=3"],
         "num_repeat", "num_repeats"),
        (collect.main, ["+input_jsonl_fpath=in.jsonl", "+output_jsonl_fpath=out.jsonl", "+resume_form_cache=true"],
         "resume_form_cache", "resume_from_cache"),
        (run.main, [f"+config_paths=[{FLEET}]", *POLICY, "+dry_rn=true"], "dry_rn", "dry_run"),
        (status.main, ["+jsn=true"], "jsn", "json"),
        (prepare_data.main, [f"+config_paths=[{MCQA}]", "+output_dirpath=out", "+mode=example_validation",
                             "+skip_invalid_row=true"], "skip_invalid_row", "skip_invalid_rows"),
        (dump_config.main, [f"+config_paths=[{FLEET}]", *POLICY, "+mcqa_agnet=1"], "mcqa_agnet", "mcqa_simple_agent"),
        (quickstart.main, ["+num_repeat=2"], "num_repeat", "num_repeats"),
    ],
    ids=["collect", "collect_resume", "run", "status", "prepare_data", "dump_config_instance", "quickstart"],
)
def test_a_misspelled_key_is_an_error_with_did_you_mean(command, argv, typo, meant, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written or started: a fresh directory shows it
    code, err = exit_code_and_stderr(command, argv, capsys)
    assert code == 2
    assert "unknown key for ng_" in err and f"{typo!r} (+{typo}=...). Did you mean {meant!r}?" in err
    assert list(tmp_path.iterdir()) == []


def test_keys_the_config_defines_or_interpolates_are_accepted(capsys, monkeypatch, tmp_path):
    """`policy_*` are read through `${...}` by the model config; instance overrides name a known instance."""
    monkeypatch.chdir(tmp_path)
    argv = [f"+config_paths=[{FLEET}]", *POLICY,
            "++mcqa.resources_servers.mcqa.grading_mode=strict_single_letter_boxed", "+dry_run=true"]
    code, err = exit_code_and_stderr(run.main, argv, capsys)
    assert code == 0, err


@pytest.mark.parametrize(("env", "accepted"), [("example_weather", False), ("mcqa", True)])
def test_num_workers_is_refused_for_an_environment_that_keeps_sessions_in_memory(env, accepted, capsys, monkeypatch,
                                                                                  tmp_path):
    """A rollout's calls to one port spread over its workers, so an environment whose tools read per-session memory
    (example_weather records the calls) cannot run as several; a stateless one (mcqa) can."""
    monkeypatch.chdir(tmp_path)
    config = f"resources_servers/{env}/configs/{env}.yaml"
    argv = [f"+config_paths=[responses_api_models/vllm_model/configs/vllm_model.yaml,{config}]", *POLICY,
            f"+{env}.resources_servers.{env}.num_workers=2", "+dry_run=true"]
    code, err = exit_code_and_stderr(run.main, argv, capsys)
    if accepted:
        assert code == 0, err
        return
    assert code == 2
    assert f"{env}.resources_servers.{env}.num_workers: 2: ExampleWeatherServer keeps each rollout's session" in err
    assert "num_replicas" in err
