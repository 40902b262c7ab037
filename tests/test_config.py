"""Global config: sources and precedence, directives, ports, references and error messages, on real YAML files."""

import random
import socket
import textwrap
from pathlib import Path

import pydantic
import pytest
import yaml

from gymfleet.errors import ConfigError, ServerRefError, did_you_mean
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config, parse_overrides
from gymfleet.fleet.config_checks import resolve_server_ref, validate_fields
from gymfleet.fleet.config_instances import HEAD_SERVER_KEY_NAME

FIXTURES = Path(__file__).parent / "fixtures" / "config"

MODEL = {"responses_api_models": {"scripted_model": {"entrypoint": "app.py"}}}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # cwd is the first root; keep any env.yaml in the repo out of these tests


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def parse(tmp_path, cli=(), initial=None, env=None, root=None, **kwargs):
    if env is not None:
        write(tmp_path / "env.yaml", env)
    parser_config = GlobalConfigDictParserConfig(
        dotenv_path=tmp_path / "env.yaml", initial_global_config_dict=initial, cli_args=list(cli)
    )
    return parse_global_config(parser_config, root=root or tmp_path, **kwargs)


def resources(name="mcqa", impl="mcqa", **fields):
    return {name: {"resources_servers": {impl: {"entrypoint": "app.py", "domain": "knowledge", **fields}}}}


# ---------------------------------------------------------------------------------------------- sources


def test_includes_flatten_post_order(tmp_path):
    write(tmp_path / "root.yaml", "config_paths: [inc1.yaml, inc2.yaml]\nv: root\n")
    write(tmp_path / "inc1.yaml", "v: inc1\na: inc1\n")
    write(tmp_path / "inc2.yaml", "config_paths: [inc3.yaml, inc1.yaml]\nv: inc2\na: inc2\nb: inc2\n")
    write(tmp_path / "inc3.yaml", "b: inc3\nc: inc3\n")

    data = parse(tmp_path, cli=["+config_paths=[root.yaml]"]).data

    # inc1 (its second listing is skipped), inc3, inc2 (overrides what it includes), root (overrides all).
    assert (data["v"], data["a"], data["b"], data["c"]) == ("root", "inc2", "inc2", "inc3")
    assert data["config_paths"] == ["root.yaml"]


def test_precedence_cli_over_initial_over_env_over_files(tmp_path):
    write(tmp_path / "a.yaml", "x: {from_file: 1, v: file}\n")
    env = "config_paths: [a.yaml]\nx: {v: env, from_env: 1}\n"
    initial = {"x": {"v": "initial", "from_initial": 1}}

    assert parse(tmp_path, env=env).data["x"]["v"] == "env"
    assert parse(tmp_path, env=env, initial=initial).data["x"]["v"] == "initial"
    data = parse(tmp_path, env=env, initial=initial, cli=["++x.v=cli"]).data
    assert data["x"] == {"from_file": 1, "v": "cli", "from_env": 1, "from_initial": 1}


def test_config_paths_resolve_against_repository_root(tmp_path):
    config = parse(tmp_path, cli=["+config_paths=[mcqa.yaml]"], root=FIXTURES)

    assert sorted(config.instances) == ["mcqa", "mcqa_simple_agent", "scripted_llm"]
    model = config.instance("scripted_llm")
    agent = config.instance("mcqa_simple_agent").fields
    assert agent["base_url"] == f"http://{model.host}:{model.port}/v1"
    assert config.instance("mcqa_simple_agent").dir == FIXTURES / "agents" / "simple_agent"


def test_missing_dotenv_file_is_fine(tmp_path):
    config = parse(tmp_path, initial={"policy_model": MODEL}, env=None)
    assert list(config.instances) == ["policy_model"]


def test_missing_config_file_names_path_roots_and_suggestion(tmp_path):
    write(tmp_path / "configs" / "mcqa.yaml", "{}\n")

    with pytest.raises(ConfigError) as err:
        parse(tmp_path, cli=["+config_paths=[configs/mcqa.yml]"], root=FIXTURES)

    message = str(err.value)
    assert "'configs/mcqa.yml'" in message
    assert str(tmp_path / "configs" / "mcqa.yml") in message and str(FIXTURES / "configs" / "mcqa.yml") in message
    assert "Did you mean 'configs/mcqa.yaml'?" in message


# ---------------------------------------------------------------------------------------------- CLI overrides


def test_parse_overrides_add_force_lists_and_types():
    tokens = [
        "+a.b.c=1",
        "++a.b.d=x",
        "e=true",
        "+f=null",
        "+g=1.5",
        "+h='hello, world'",
        "+config_paths=[a.yaml,sub/b.yaml]",
        "+url=http://127.0.0.1:8000/v1",
        "+ref=${policy_model_name}",
    ]
    assert parse_overrides(tokens) == {
        "a": {"b": {"c": 1, "d": "x"}},
        "e": True,
        "f": None,
        "g": 1.5,
        "h": "hello, world",
        "config_paths": ["a.yaml", "sub/b.yaml"],
        "url": "http://127.0.0.1:8000/v1",
        "ref": "${policy_model_name}",
    }


@pytest.mark.parametrize("token", ["+config_paths=[a.yaml", "policy_model", "+a=1,2", "~a"])
def test_malformed_override_names_token_and_correct_form(token):
    with pytest.raises(ConfigError) as err:
        parse_overrides([token])
    assert repr(token) in str(err.value)
    assert "+key=value" in str(err.value) or "++key=null" in str(err.value)


# ---------------------------------------------------------------------------------------------- interpolation


def test_oc_env_with_and_without_default(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFLEET_TEST_KEY", "sk-123")
    monkeypatch.delenv("GYMFLEET_TEST_UNSET", raising=False)
    env = "key: ${oc.env:GYMFLEET_TEST_KEY}\nfallback: ${oc.env:GYMFLEET_TEST_UNSET,dflt}\n"

    data = parse(tmp_path, env=env).data

    assert (data["key"], data["fallback"]) == ("sk-123", "dflt")


def test_list_valued_interpolation(tmp_path):
    model = {"responses_api_models": {"vllm_model": {"entrypoint": "app.py", "base_url": "${policy_base_url}"}}}
    initial = {"policy_base_url": ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"], "policy_model": model}

    config = parse(tmp_path, initial=initial)

    assert config.instance("policy_model").fields["base_url"] == initial["policy_base_url"]


def test_bad_interpolation_names_path_and_text(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial=resources(judge_url="${judge_model_url}"))
    assert "mcqa.resources_servers.mcqa.judge_url" in str(err.value)
    assert "${judge_model_url}" in str(err.value)


def test_missing_value_lists_paths_with_hint(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial={"policy_api_key": "???", **resources(grading_mode="???")})
    assert err.value.path == "policy_api_key"
    assert "++policy_api_key=<value>" in str(err.value)
    assert "++mcqa.resources_servers.mcqa.grading_mode=<value>" in str(err.value)


# ---------------------------------------------------------------------------------------------- directives


def test_copy_keeps_source_and_merges_overrides(tmp_path):
    write(
        tmp_path / "recipe.yaml",
        """
        policy_model:
          responses_api_models:
            vllm_model: {entrypoint: app.py, chat_template_kwargs: {enable_thinking: true}, temperature: 1.0}
        policy_model_reasoning_off:
          _copy: policy_model
          responses_api_models:
            vllm_model:
              chat_template_kwargs: {enable_thinking: false}
        """,
    )
    config = parse(tmp_path, cli=["+config_paths=[recipe.yaml]"])

    off = config.instance("policy_model_reasoning_off").fields
    assert off["chat_template_kwargs"] == {"enable_thinking": False} and off["temperature"] == 1.0
    assert config.instance("policy_model").fields["chat_template_kwargs"] == {"enable_thinking": True}
    assert off["port"] != config.instance("policy_model").port


def test_inherit_from_moves_source(tmp_path):
    initial = {
        "templates": {"judge": MODEL},
        "judge_model": {"_inherit_from": "templates.judge"},
        "alias": "${copy:templates}",
    }
    write(tmp_path / "env.yaml", "")
    config = parse(tmp_path, initial=initial)

    assert "judge" not in config.data["templates"]
    assert config.instance("judge_model").impl == "scripted_model"
    assert config.data["alias"] == {}


def test_inherit_from_unknown_source_suggests(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial={"policy_model": MODEL, "other": {"_copy": "policy_modle"}})
    assert "other" in str(err.value) and "Did you mean 'policy_model'?" in str(err.value)


def test_delete_key_removes_keys_after_copy(tmp_path):
    base = {"responses_api_models": {"vllm_model": {"entrypoint": "app.py", "a": 1, "b": 2, "c": 3}}}
    initial = {
        "policy_model": base,
        "slim": {"_copy": "policy_model", "responses_api_models": {"vllm_model": {"_delete_key": "a, b"}}},
    }
    fields = parse(tmp_path, initial=initial).instance("slim").fields
    assert "a" not in fields and "b" not in fields and fields["c"] == 3 and "_delete_key" not in fields


# ---------------------------------------------------------------------------------------------- instances


def test_scalars_and_unknown_blocks_are_not_servers(tmp_path):
    initial = {"num_gpu_nodes": 7, "wandb": {"project": "x"}, "policy_model": MODEL, HEAD_SERVER_KEY_NAME: None}
    config = parse(tmp_path, initial=initial)
    assert list(config.instances) == ["policy_model"]
    assert config.data["num_gpu_nodes"] == 7


@pytest.mark.parametrize(
    "block, fragment",
    [
        (
            {"resources_servers": {"a": {"entrypoint": "app.py"}, "b": {"entrypoint": "app.py"}}},
            "mcqa.resources_servers",
        ),
        (
            {"resources_servers": {"mcqa": {"domain": "knowledge"}}},
            "mcqa.resources_servers.mcqa: missing `entrypoint`",
        ),
        ({"resources_servers": {"mcqa": {"entrypoint": "app.py"}}, "extra": 1}, "exactly one key"),
    ],
    ids=["two-impls", "no-entrypoint", "extra-key"],
)
def test_almost_server_is_an_error(tmp_path, block, fragment):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial={"mcqa": block})
    assert fragment in str(err.value)


def test_resources_server_needs_domain(tmp_path):
    initial = {"mcqa": {"resources_servers": {"mcqa": {"entrypoint": "app.py"}}}}
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial=initial)
    assert err.value.path == "mcqa.resources_servers.mcqa.domain"
    assert "knowledge" in err.value.hint


def test_bad_domain_suggests_closest(tmp_path):
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, initial=resources(domain="maths"))
    assert "mcqa.resources_servers.mcqa.domain: unknown domain 'maths'. Did you mean 'math'?" in str(err.value)


def test_error_names_the_file_that_set_the_key(tmp_path):
    write(tmp_path / "envs" / "mcqa.yaml", "mcqa: {resources_servers: {mcqa: {entrypoint: app.py, domain: maths}}}\n")
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, cli=["+config_paths=[envs/mcqa.yaml]"])
    assert f"(set in {tmp_path / 'envs' / 'mcqa.yaml'})" in str(err.value)


# ---------------------------------------------------------------------------------------------- ports


def test_ports_unique_in_range_and_avoid_head_port(tmp_path):
    low = random.randrange(30000, 60000, 100)
    initial = {
        "port_range_low": low,
        "port_range_high": low + 40,
        HEAD_SERVER_KEY_NAME: {"port": low + 1},
        **{f"model_{i}": MODEL for i in range(8)},
    }
    config = parse(tmp_path, initial=initial)

    ports = [inst.port for inst in config.instances.values()]
    assert len(set(ports)) == 8 and all(low <= p <= low + 40 for p in ports) and low + 1 not in ports
    assert config.head_port == low + 1 and config.head_host == "127.0.0.1"
    assert set(config.data["disallowed_ports"]) == {*ports, low + 1}


def test_explicit_port_and_default_host_kept(tmp_path):
    initial = {
        "default_host": "0.0.0.0",
        "m": {"responses_api_models": {"x": {"entrypoint": "app.py", "port": 18555}}},
    }
    config = parse(tmp_path, initial=initial)
    assert config.instance("m").url == "http://0.0.0.0:18555"
    assert config.data[HEAD_SERVER_KEY_NAME] == {"host": "0.0.0.0", "port": 11000}


def test_busy_port_is_skipped(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"no free port for host '127.0.0.1' in \[{taken}, {taken}\]"):
            parse(tmp_path, initial={"port_range_low": taken, "port_range_high": taken, "a": MODEL})


def test_no_ports_assigned_when_disabled(tmp_path):
    initial = {"a": MODEL, "url": "http://${a.responses_api_models.scripted_model.port}"}
    config = parse(tmp_path, initial=initial, assign_ports=False)
    assert config.instance("a").port is None and config.data["url"] == "http://None"


# ---------------------------------------------------------------------------------------------- references


def test_unknown_ref_suggests_closest(tmp_path):
    agent = {"entrypoint": "app.py", "resources_server": {"type": "resources_servers", "name": "mcqa2"}}
    initial = {**resources(), "mcqa_simple_agent": {"responses_api_agents": {"simple_agent": agent}}}

    with pytest.raises(ServerRefError) as err:
        parse(tmp_path, initial=initial)

    assert str(err.value).startswith(
        "unknown server 'mcqa2' at mcqa_simple_agent.responses_api_agents.simple_agent.resources_server; "
        "known resources_servers: ['mcqa']. Did you mean 'mcqa'?"
    )


def test_resolve_server_ref_accepts_names_and_checks_type(tmp_path):
    config = parse(tmp_path, initial={**resources(), "policy_model": MODEL})

    assert resolve_server_ref("mcqa", "resources_servers", config, "x.resources_server") == "mcqa"
    assert resolve_server_ref({"type": "resources_servers", "name": "mcqa"}, None, config.data, "x") == "mcqa"
    with pytest.raises(ServerRefError, match="'policy_model' at x.model is a responses_api_models, not a resources"):
        resolve_server_ref("policy_model", "resources_servers", config, "x.model")
    with pytest.raises(ServerRefError, match="Did you mean 'policy_model'"):
        config.instance("policy_modle")


# ---------------------------------------------------------------------------------------------- output & validation


def test_to_yaml_hides_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("GYMFLEET_TEST_KEY", "sk-123")
    initial = {"policy_api_key": "${oc.env:GYMFLEET_TEST_KEY}", "hf_token": "hf-1", "max_tokens": 5, "a": MODEL}
    config = parse(tmp_path, initial=initial)

    hidden = yaml.safe_load(config.to_yaml(hide_secrets=True))
    assert (hidden["policy_api_key"], hidden["hf_token"], hidden["max_tokens"]) == ("****", "****", 5)
    assert "sk-123" not in config.to_yaml(hide_secrets=True)
    assert yaml.safe_load(config.to_yaml()) == config.data


class GradingConfig(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    grading_mode: str = "strict_boxed"
    max_retries: int = 3


def test_validate_fields_names_path_and_suggests_field():
    path = "mcqa.resources_servers.mcqa"
    with pytest.raises(ConfigError) as err:
        validate_fields(GradingConfig, {"grading_mod": "lenient", "max_retries": "many"}, path)
    message = str(err.value)
    assert "mcqa.resources_servers.mcqa.grading_mod: unknown field. Did you mean 'grading_mode'?" in message
    assert "mcqa.resources_servers.mcqa.max_retries: " in message and "'many'" in message
    assert validate_fields(GradingConfig, {"max_retries": 1}, path).max_retries == 1


def test_did_you_mean():
    assert did_you_mean("grading_mod", ["grading_mode", "domain"]) == " Did you mean 'grading_mode'?"
    assert did_you_mean("zzz", ["grading_mode"]) == ""


# ---------------------------------------------------------------------------------------------- YAML 1.1 keys


@pytest.mark.parametrize("key", ["on", "off", "yes", "no", "true", "null", "1"])
def test_a_key_yaml_reads_as_a_non_string_names_file_line_and_fix(tmp_path, key):
    write(tmp_path / "model.yaml", f"""\
        scripted_llm:
          responses_api_models:
            scripted_model:
              entrypoint: app.py
              rules:
                - match: x
                  {key}: last_message
        """)
    with pytest.raises(ConfigError) as error:
        parse(tmp_path, cli=["+config_paths=[model.yaml]"])
    message = str(error.value)
    assert f"model.yaml:7:11: key '{key}' is read by YAML 1.1 as a" in message
    assert f"Quote it ('{key}': ...)" in message


def test_quoted_yaml_keys_and_merge_keys_are_strings(tmp_path):
    write(tmp_path / "a.yaml", """\
        base: &base {x: 1}
        thing:
          <<: *base
          'on': quoted
          "yes": also quoted
        """)
    data = parse(tmp_path, cli=["+config_paths=[a.yaml]"]).data
    assert data["thing"] == {"x": 1, "on": "quoted", "yes": "also quoted"}


def test_env_yaml_keys_are_checked_too(tmp_path):
    with pytest.raises(ConfigError, match=r"env\.yaml:1:1: key 'no'"):
        parse(tmp_path, env="no: 1\n")


# ---------------------------------------------------------------------------------------------- definitions


def sandbox_yaml(runs_per_core=2):
    return f"sandbox:\n  sandbox_servers:\n    sandbox: {{entrypoint: app.py, runs_per_core: {runs_per_core}}}\n"


def test_an_environment_config_brings_what_it_needs(tmp_path):
    """Listed alone (as NeMo-RL's recipes list it), an environment's config still has its sandbox."""
    write(tmp_path / "sandbox.yaml", sandbox_yaml())
    write(tmp_path / "env.yaml", "")
    sandbox_ref = {"type": "sandbox_servers", "name": "sandbox"}
    env_config = {"config_paths": ["sandbox.yaml"], **resources("code", "code_gen", sandbox=sandbox_ref)}
    write(tmp_path / "code.yaml", yaml.safe_dump(env_config))
    alone = parse(tmp_path, cli=["+config_paths=[code.yaml]"])
    assert set(alone.instances) == {"code", "sandbox"}
    both = parse(tmp_path, cli=["+config_paths=[code.yaml,sandbox.yaml]"])
    assert both.instance("sandbox").fields["runs_per_core"] == alone.instance("sandbox").fields["runs_per_core"] == 2


def test_identical_definitions_in_two_files_merge(tmp_path, caplog):
    write(tmp_path / "a.yaml", sandbox_yaml())
    write(tmp_path / "b.yaml", sandbox_yaml())
    config = parse(tmp_path, cli=["+config_paths=[a.yaml,b.yaml]"])
    assert config.instance("sandbox").fields["runs_per_core"] == 2
    assert "replaces" not in caplog.text


def test_conflicting_definitions_name_both_files(tmp_path):
    write(tmp_path / "a.yaml", sandbox_yaml(2))
    write(tmp_path / "b.yaml", sandbox_yaml(4))
    with pytest.raises(ConfigError) as error:
        parse(tmp_path, cli=["+config_paths=[a.yaml,b.yaml]"])
    message = str(error.value)
    assert "'sandbox' is defined differently in" in message
    assert str(tmp_path / "a.yaml") in message and str(tmp_path / "b.yaml") in message
    assert "sandbox.sandbox_servers.sandbox.runs_per_core is 2 in the first, 4 in the second" in message
    assert "++sandbox.sandbox_servers.sandbox.runs_per_core=<value>" in message


def test_a_file_that_includes_another_may_override_it(tmp_path, caplog):
    write(tmp_path / "a.yaml", sandbox_yaml(2))
    write(tmp_path / "recipe.yaml", "config_paths: [a.yaml]\n" + sandbox_yaml(4))
    assert parse(tmp_path, cli=["+config_paths=[recipe.yaml]"]).instance("sandbox").fields["runs_per_core"] == 4
    assert "replaces" not in caplog.text


def test_a_sibling_that_changes_a_value_is_named_in_a_warning(tmp_path, caplog):
    write(tmp_path / "a.yaml", sandbox_yaml(2))
    write(tmp_path / "tweak.yaml", "sandbox: {sandbox_servers: {sandbox: {runs_per_core: 8}}}\n")
    config = parse(tmp_path, cli=["+config_paths=[a.yaml,tweak.yaml]"])
    assert config.instance("sandbox").fields["runs_per_core"] == 8
    assert "sandbox.sandbox_servers.sandbox.runs_per_core: 8 from" in caplog.text
    assert "tweak.yaml replaces 2 from" in caplog.text


def test_an_include_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.yaml", "config_paths: [b.yaml]\n")
    write(tmp_path / "b.yaml", "config_paths: [a.yaml]\n")
    with pytest.raises(ConfigError, match=r"includes itself: .*a\.yaml -> .*b\.yaml -> .*a\.yaml"):
        parse(tmp_path, cli=["+config_paths=[a.yaml]"])


# ---------------------------------------------------------------------------------------------- unknown CLI keys


def test_cli_keys_nothing_reads_are_reported(tmp_path):
    write(tmp_path / "a.yaml", "x: ${policy_model_name}\nlisted: 1\n" + yaml.safe_dump(resources()))
    config = parse(tmp_path, cli=["+config_paths=[a.yaml]", "+num_repeat=3", "+listed=2", "+policy_model_name=m",
                                  "+mcqa.resources_servers.mcqa.domain=math", "+dry_run=true", "+mine=1",
                                  "+_private=1"])
    assert config.unknown_cli_keys(["mine"]) == ["num_repeat"]


def test_keys_from_env_yaml_are_not_checked(tmp_path):
    config = parse(tmp_path, env="my_team_setting: 1\n", cli=["+my_team_setting=2"])
    assert config.unknown_cli_keys([]) == []
