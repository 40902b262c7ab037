"""configs/super3_rlvr.yaml as `ng_run` starts it: the Super 3 RLVR mix that exists here, as one fleet.

The recipe lists NeMo-RL's config paths verbatim (examples/nemo_gym/nemotron-3-super/stage1_rlvr.yaml, spec
environments.md §0.1), every one of them now built; an environment that is not built must fail loudly when listed.
The fleet starts for real with the scripted model as the policy (and so as every judge: the judged environments ask
policy_model) and math_formal_lean's stand-in Lean checker (its tests' `/execute` server) as the Lean sandbox,
`ng_status` must find every instance live, and every agent with example rows runs one rollout: a finite reward and
no infrastructure failure from each, and the right answer scored 1.0 where the test scripts one (math, code in the
sandbox, a multiple-choice letter, a Lean proof).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from pathlib import Path

import httpx
import pytest
import yaml

from gymfleet.cli.run import main as run_main
from gymfleet.errors import ConfigError
from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config
from gymfleet.testing import fleet_headers, ng_status_all_live, running_fleet, scripted_policy, serve
from resources_servers.math_formal_lean.tests.stand_in_checker import checker_app

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs/super3_rlvr.yaml"

# The 22 resources-server configs of NeMo-RL's Super 3 RLVR recipe (spec environments.md §0.1 and §2), plus
# terminal_pivot from the Nemotron repository's copy of it.
SUPER3_CONFIGS = [
    "resources_servers/math_with_judge/configs/math_with_judge.yaml",
    "resources_servers/code_gen/configs/code_gen.yaml",
    "resources_servers/workplace_assistant/configs/workplace_assistant.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
    "resources_servers/instruction_following/configs/instruction_following.yaml",
    "resources_servers/structured_outputs/configs/structured_outputs_json.yaml",
    "resources_servers/equivalence_llm_judge/configs/lc_judge.yaml",
    "resources_servers/calendar/configs/calendar.yaml",
    "resources_servers/genrm_compare/configs/genrm_compare.yaml",
    "resources_servers/equivalence_llm_judge/configs/nl2bash-equivalency.yaml",
    "resources_servers/equivalence_llm_judge/configs/equivalence_llm_judge.yaml",
    "resources_servers/single_step_tool_use_with_argument_comparison/configs/"
    "single_step_tool_use_with_argument_comparison.yaml",
    "resources_servers/reasoning_gym/configs/reasoning_gym.yaml",
    "resources_servers/ns_tools/configs/ns_tools.yaml",
    "resources_servers/math_formal_lean/configs/math_formal_lean_multi_turn.yaml",
    "resources_servers/swerl_gen/configs/swerl_gen.yaml",
    "resources_servers/jailbreak_detection/configs/jailbreak_detection_nemotron_combined_reward_tp8.yaml",
    "resources_servers/over_refusal_detection/configs/over_refusal_detection_nemotron_tp8.yaml",
    "resources_servers/multichallenge/configs/multichallenge.yaml",
    "resources_servers/inverse_if/configs/inverse_if.yaml",
    "resources_servers/single_step_tool_use_with_argument_comparison/configs/"
    "search_pivot_single_step_tool_use_with_argument_comparison.yaml",
    "resources_servers/single_step_tool_use_with_argument_comparison/configs/"
    "toolcall_schema_single_step_tool_use_with_argument_comparison.yaml",
    "resources_servers/terminal_pivot/configs/terminal_pivot.yaml",
]
NOT_BUILT = [path for path in SUPER3_CONFIGS if not (ROOT / path).is_file()]
NEVER_BUILT = "resources_servers/isabelle_proofs/configs/isabelle_proofs.yaml"
"""An environment of no recipe, for the error a recipe listing one must stop with."""

# Right answers to the first example row of three environments (matched on the last user message); every other
# rollout gets the default and must still come back as a reward, never as a failure.
SCRIPT = [
    {"match": "sum of the first 20 positive odd integers",
     "text": "1 + 3 + ... + 39 = 20^2, so the sum is $\\boxed{400}$."},
    {"match": "largest value of a_j - a_i",
     "text": "```python\nn = int(input())\nbest, low = 0, None\nfor x in map(int, input().split()):\n"
             "    if low is not None:\n        best = max(best, x - low)\n"
             "    low = x if low is None else min(low, x)\nprint(best)\n```"},
    {"match": "shortest orbital period", "text": "Mercury is closest to the Sun.\n\n\\boxed{B}"},
    {"match": "Adding zero to a natural number leaves it unchanged",
     "text": "By simp.\n\n```lean4\ntheorem nat_add_zero_self (n : ℕ) : n + 0 = n := by\n  simp\n```"},
    # As a judge (the equivalence_llm_judge family fails a verdict-less judge reply as judge_failed, by design):
    # the labels its prompts ask for, so a reply of "I am not sure." from the policy is judged, not an outage.
    {"match": r"\[\[A!=B\]\]", "match_in": "transcript", "text": "The answers differ.\n[[A!=B]]"},
    {"match": "INCORRECT", "match_in": "transcript", "text": "INCORRECT"},
]
SCORED_RIGHT = {"math_with_judge_simple_agent", "code_gen_simple_agent", "mcqa_simple_agent",
                "math_formal_lean_refinement_agent"}
SCRIPTED_POLICY = scripted_policy(SCRIPT)


def _recipe_paths() -> list[str]:
    return yaml.safe_load(RECIPE.read_text())["config_paths"]


def test_recipe_lists_every_environment_of_the_mix_by_nemo_rl_path():
    paths = _recipe_paths()
    assert paths[0] == "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
    for path in paths:
        assert (ROOT / path).is_file(), path
    assert NOT_BUILT == [], "every environment of the mix is built"
    assert [path for path in paths if path.startswith("resources_servers/")] == SUPER3_CONFIGS
    assert "sandbox/configs/sandbox.yaml" in paths, "code_gen, ns_tools and swerl_gen share the fleet's sandbox"


def test_the_comment_leaves_no_environment_out():
    """The recipe's comment once listed the environments not built; none is left, so it names none as missing."""
    comment = "\n".join(line for line in RECIPE.read_text().splitlines() if line.startswith("#"))
    assert "Not built yet" not in comment and "left out" not in comment
    assert "all 22 are built here" in comment


def test_listing_an_environment_not_built_names_it(tmp_path, capsys, monkeypatch):
    missing = NEVER_BUILT
    recipe = tmp_path / "super3_full.yaml"
    recipe.write_text(yaml.safe_dump({"config_paths": [str(RECIPE), missing]}))
    with pytest.raises(ConfigError) as error:
        parse_global_config(GlobalConfigDictParserConfig(
            initial_global_config_dict={"config_paths": [str(recipe)]}, skip_load_from_cli=True,
            skip_load_from_dotenv=True), assign_ports=False)
    env = Path(missing).parts[1]
    message = str(error.value)
    assert f"environment {env!r}, which is not built here" in message
    assert "math_with_judge" in message and "code_gen" in message, "it lists the environments that exist"
    assert "Did you mean" not in message, "no guess at a different environment"
    # ng_run says the same and stops before starting anything
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_:
        run_main([f"+config_paths=[{recipe}]", "+dry_run=true"])
    out = capsys.readouterr()
    assert exit_.value.code != 0 and f"environment {env!r}, which is not built here" in out.err
    assert "nothing started" not in out.out


def test_a_misspelt_environment_gets_a_did_you_mean():
    with pytest.raises(ConfigError) as error:
        parse_global_config(GlobalConfigDictParserConfig(
            initial_global_config_dict={"config_paths": ["resources_servers/mcqq/configs/mcqa.yaml"]},
            skip_load_from_cli=True, skip_load_from_dotenv=True), assign_ports=False)
    assert "environment 'mcqq', which is not built here" in str(error.value)
    assert "Did you mean 'mcqa'?" in str(error.value)


def test_a_missing_file_of_an_existing_environment_is_still_a_path_error():
    """The check is about environments: a typo in the file name of one that exists keeps the did-you-mean."""
    with pytest.raises(ConfigError) as error:
        parse_global_config(GlobalConfigDictParserConfig(
            initial_global_config_dict={"config_paths": ["resources_servers/mcqa/configs/mcqa_typo.yaml"]},
            skip_load_from_cli=True, skip_load_from_dotenv=True), assign_ports=False)
    assert "not found" in str(error.value) and "not built" not in str(error.value)


@pytest.fixture(scope="module")
def lean_checker():
    """math_formal_lean's stand-in Lean checker (a real `/execute` server), the fleet's Lean sandbox."""
    app = checker_app()
    with serve(app) as url:
        yield app, url


@pytest.fixture(scope="module")
def fleet(lean_checker):
    lean = {"math_formal_lean": {"resources_servers": {"math_formal_lean": {"checker_url": lean_checker[1]}}}}
    with running_fleet([str(RECIPE)], {**SCRIPTED_POLICY, **lean}) as running:
        yield running


@pytest.fixture(scope="module")
def published(fleet):
    head = f"http://127.0.0.1:{fleet.config.head_port}"
    return yaml.safe_load(httpx.get(head + "/global_config_dict_yaml", timeout=30,
                                    headers=fleet_headers(fleet)).json())


def test_ng_status_shows_every_instance_live(fleet):
    # on a loaded 2-core machine one of 55 servers may miss ng_status' 2 s probe: asked again until all are live
    report = json.loads(ng_status_all_live(fleet.config.head_port, "+json=true").stdout)
    names = {item["process_name"] for item in report["instances"]}
    assert names == set(fleet.config.instances), names ^ set(fleet.config.instances)
    assert report["live"] == report["total"] == len(fleet.config.instances)
    envs = {Path(path).parts[1] for path in _recipe_paths() if path.startswith("resources_servers/")}
    impls = {item.impl for item in fleet.config.instances.values() if item.server_type == "resources_servers"}
    assert impls == envs, "one resources server (at least) per environment of the recipe"


def test_recipe_settings_reach_the_servers(published):
    policy = published["policy_model"]["responses_api_models"]["vllm_model"]
    assert policy["return_token_id_information"] is True
    assert published["math_with_judge"]["resources_servers"]["math_with_judge"]["should_use_judge"] is True
    genrm = published["genrm_compare_resources_server"]["resources_servers"]["genrm_compare"]
    assert genrm["num_rollouts_per_prompt"] == 16


def _agents_with_examples(published: dict) -> dict[str, tuple[dict, Path]]:
    """Agent instance name -> (its fields, its example rows), for every agent with an example dataset."""
    found = {}
    for name, block in published.items():
        agents = block.get("responses_api_agents", {}) if isinstance(block, dict) else {}
        for agent in agents.values():
            for dataset in agent.get("datasets") or []:
                if dataset.get("type") == "example":
                    found[name] = (agent, ROOT / dataset["jsonl_fpath"])
    return found


def _rollout(agent: dict, row: dict) -> dict:
    answer = httpx.post(f"http://{agent['host']}:{agent['port']}/run", json=row, timeout=300,
                        headers=fleet_headers())
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_one_rollout_through_every_agent_with_examples(published, lean_checker):
    agents = _agents_with_examples(published)
    assert len(agents) >= 22, sorted(agents)
    jobs = []
    for name, (agent, path) in agents.items():
        row = {**json.loads(path.read_text().splitlines()[0]),
               "agent_ref": {"type": "responses_api_agents", "name": name}}
        # GenRM scores a whole group of one prompt: the recipe's 16 rollouts of the same row.
        copies = published[agent["resources_server"]["name"]]["resources_servers"].get("genrm_compare", {}).get(
            "num_rollouts_per_prompt", 1)
        jobs += [(name, agent, row)] * copies
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda job: (job[0], _rollout(job[1], job[2])), jobs))
    assert {name for name, _ in results} == set(agents)
    for name, result in results:
        summary = {key: value for key, value in result.items() if key != "responses_create_params"}
        assert "_ng_failure_class" not in result, (name, summary)
        assert isinstance(result["reward"], float | int) and math.isfinite(result["reward"]), (name, summary)
        assert result["response"]["model"] == "scripted", name
        if name in SCORED_RIGHT:
            assert result["reward"] == 1.0, (name, summary)
    lean = next(result for name, result in results if name == "math_formal_lean_refinement_agent")
    assert lean["total_turns"] == 1 and lean["all_attempts"][0]["proof_status"] == "completed"
    assert [body["generated_code"] for body in lean_checker[0].state.requests] == [
        lean["header"] + lean["formal_statement"] + "  simp"], "the proof reached the Lean checker"
