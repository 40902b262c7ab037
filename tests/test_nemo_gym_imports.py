"""Every `nemo_gym` name NeMo-Gym 0.7.0's environment folders import resolves on gymfleet's surface: the folders'
own modules and tests, and the modules of NeMo-Gym's agent and model folders they import in turn (legal_agent_bench's
tests import harbor_agent, gdpval's openai_model), read from the wheel's sources; a name that does not resolve is
one of `KNOWN_GAPS`, each with why. Then the parts this added, on their own: NeMo-Gym's model-server base served for
real, the training item variants, the shared collection config's completion rule, and a test's patched
`server_utils.get_global_config_dict` seen by `get_server_url`."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request

from gymfleet.testing import serve
from gymfleet.testing.nemo_gym_wheel import nemo_gym_wheel

KNOWN_GAPS = {
    ("nemo_gym.config_types", "DatasetConfig"):
        "nemo_user_sim's tests; the folder needs the network first (a git requirement, nemo-usersim)",
}
"""Names a folder imports that gymfleet's surface lacks, and why it may."""


_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)$", re.M)


def _imports_in(path: Path) -> list[str]:
    """Every module `path` imports (`from m import n` gives `m` and `m.n`; relative imports left out), read with a
    pattern per statement (parsing all 1,200 files' syntax trees costs seconds)."""
    text = path.read_text(errors="replace")
    found = []
    for module, names in _FROM_IMPORT.findall(text):
        names = re.sub(r"#[^\n]*", "", names).strip("()")
        found += [module] + [f"{module}.{name.split()[0]}" for name in names.split(",") if name.strip()]
    for modules in _IMPORT.findall(text):
        found += [name.split()[0] for name in modules.split(",") if name.strip()]
    return found


def _source_of(tree: Path, module: str) -> Path | None:
    base = tree.joinpath(*module.split("."))
    return next((path for path in (base.with_suffix(".py"), base / "__init__.py") if path.is_file()), None)


def _imports_of_the_corpus() -> dict[tuple[str, str | None], set[str]]:
    """What the wheel's environment folders import from `nemo_gym` (their tests included), and what the modules of
    NeMo-Gym's agent and model folders they import import, followed from module to module: (module, name) -> files."""
    tree = nemo_gym_wheel()
    todo = list((tree / "resources_servers").rglob("*.py"))
    seen = set(todo)
    need: dict[tuple[str, str | None], set[str]] = defaultdict(set)
    while todo:
        path = todo.pop()
        for module in _imports_in(path):
            top = module.split(".")[0]
            if top == "nemo_gym":
                parent, _, name = module.rpartition(".")
                if parent.startswith("nemo_gym") and _source_of(tree, module) is None:
                    need[(parent, name)].add(str(path.relative_to(tree)))  # a name from a module
                else:
                    need[(module, None)].add(str(path.relative_to(tree)))
            elif top in ("responses_api_agents", "responses_api_models"):
                source = _source_of(tree, module)
                if source is not None and source not in seen:
                    seen.add(source)
                    todo.append(source)
    return need


def _unresolved(need: dict[tuple[str, str | None], set[str]]) -> dict[tuple[str, str | None], list[str]]:
    missing = {}
    for module_name, name in need:
        try:
            module = importlib.import_module(module_name)
            if name is not None and not hasattr(module, name):
                raise ImportError(name)
        except ImportError:
            missing[(module_name, name)] = sorted(need[(module_name, name)])[:3]
    return missing


def test_every_nemo_gym_name_the_corpus_imports_resolves_or_is_a_known_gap():
    need = _imports_of_the_corpus()
    assert len(need) > 100 and ("nemo_gym.base_resources_server", "SimpleResourcesServer") in need
    assert ("nemo_gym.openai_utils", "NeMoGymResponseOutputMessageForTraining") in need  # via harbor_agent
    assert ("nemo_gym.base_responses_api_model", "SimpleResponsesAPIModel") in need  # via openai_model
    missing = _unresolved(need)
    assert {key: files for key, files in missing.items() if key not in KNOWN_GAPS} == {}, (
        "names NeMo-Gym folders import that gymfleet's nemo_gym surface lacks (add them, with 0.7.0's behaviour)")
    assert set(KNOWN_GAPS) <= set(missing), f"no longer gaps, drop from KNOWN_GAPS: {set(KNOWN_GAPS) - set(missing)}"


def test_a_nemo_gym_model_server_serves_its_routes_validates_and_refuses_a_stream():
    from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
    from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponse
    from nemo_gym.server_utils import ServerClient

    class EchoModel(SimpleResponsesAPIModel):
        async def chat_completions(self, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> dict[str, Any]:
            text = f"{body.model}:{body.messages[-1]['content']}:{body.model_extra.get('thinking_budget')}"
            return {"id": "c", "object": "chat.completion", "created": 0, "model": body.model or "",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}]}

        async def responses(self, request: Request, body: Any) -> NeMoGymResponse:  # the `request=` form
            return NeMoGymResponse(id="r", created_at=0, model=request.url.path, object="response", output=[],
                                   parallel_tool_calls=False, tool_choice="auto", tools=[])

    config = BaseResponsesAPIModelConfig(host="127.0.0.1", port=0, name="echo_model", entrypoint="app.py")
    model = EchoModel(config=config, server_client=ServerClient(head_server_config=None, global_config_dict={}))
    with serve(model.setup_webserver()) as url:
        chat = httpx.post(f"{url}/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "thinking_budget": 7})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"] == "m:hi:7"
        answer = httpx.post(f"{url}/v1/responses", json={"input": "hi"})
        assert answer.status_code == 200 and answer.json()["model"] == "/v1/responses"
        bad = httpx.post(f"{url}/v1/chat/completions", json={"model": "m"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "messages"]
        for route in ("/v1/chat/completions", "/v1/responses"):
            streamed = httpx.post(f"{url}{route}", json={"messages": [], "input": "x", "stream": True})
            assert streamed.status_code == 400 and "stream" in streamed.json()["detail"]


@pytest.mark.parametrize("base_name", ["NeMoGymEasyInputMessage", "NeMoGymMessage", "NeMoGymResponseOutputMessage",
                                       "NeMoGymResponseFunctionToolCall", "NeMoGymResponseReasoningItem"])
def test_each_training_variant_requires_the_token_fields_and_is_its_item(base_name):
    from pydantic import ValidationError

    import nemo_gym.openai_utils as utils

    base = getattr(utils, base_name)
    variant = utils.training_variant_of(base)
    assert variant is getattr(utils, f"{base_name}ForTraining") and issubclass(variant, base)
    item = {"NeMoGymEasyInputMessage": {"role": "user", "content": "q"},
            "NeMoGymMessage": {"role": "user", "content": "q"},
            "NeMoGymResponseOutputMessage": {"id": "m", "content": []},
            "NeMoGymResponseFunctionToolCall": {"call_id": "c", "name": "f", "arguments": "{}"},
            "NeMoGymResponseReasoningItem": {"id": "r", "summary": []}}[base_name]
    tokens = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}
    for left_out in utils.REQUIRED_TOKEN_METADATA_FIELDS:
        with pytest.raises(ValidationError, match=left_out):
            variant.model_validate({**item, **{k: v for k, v in tokens.items() if k != left_out}})
    trained = variant.model_validate({**item, **tokens, "routed_experts": "nrlre1:opaque"})
    assert trained.generation_token_ids == [3] and trained.routed_experts == "nrlre1:opaque"
    assert variant.model_validate(trained.model_dump()) == trained


def test_an_item_without_a_training_variant_is_named():
    from nemo_gym.openai_utils import NeMoGymResponseOutputText, training_variant_of

    with pytest.raises(NotImplementedError, match="NeMoGymResponseOutputText has no ForTraining variant"):
        training_variant_of(NeMoGymResponseOutputText)


def test_shared_collection_config_counts_distinct_completed_samples():
    from nemo_gym.global_config import ROLLOUT_INDEX_KEY_NAME as ROLLOUT
    from nemo_gym.global_config import TASK_INDEX_KEY_NAME as TASK
    from nemo_gym.rollout_collection import NG_FAILURE_CLASS_KEY, SharedRolloutCollectionConfig, _attach_ng_perf

    rows = [{TASK: task, ROLLOUT: rollout} for task in range(2) for rollout in range(2)]
    rows += [dict(rows[0]), {TASK: 5, ROLLOUT: 0, NG_FAILURE_CLASS_KEY: "judge_failed"}]  # a repeat, a failure
    SharedRolloutCollectionConfig(output_jsonl_fpath="o.jsonl").check_completion(expected=9, results=rows)
    strict = SharedRolloutCollectionConfig(output_jsonl_fpath="o.jsonl", require_complete=True)
    strict.check_completion(expected=4, results=rows)
    with pytest.raises(RuntimeError, match="4/5 samples completed. Partial artifacts retained at o.jsonl"):
        strict.check_completion(expected=5, results=rows)
    with pytest.raises(ValueError, match="environment_server_name is required"):
        SharedRolloutCollectionConfig(output_jsonl_fpath="o.jsonl", environment_routing_mode="legacy")
    result: dict[str, Any] = {}
    _attach_ng_perf(result, observability_enabled=False)
    assert result == {}
    with pytest.raises(NotImplementedError, match="observability_enabled=true"):
        _attach_ng_perf(result, observability_enabled=True)


def test_a_patched_server_utils_config_is_what_get_server_url_reads(monkeypatch):
    from nemo_gym import server_utils

    with pytest.raises(RuntimeError, match="serves no fleet"):
        server_utils.get_server_url("judge")
    config = {"judge": {"responses_api_models": {"openai_model": {"host": "127.0.0.9", "port": 12001}}}}
    monkeypatch.setattr(server_utils, "get_global_config_dict", lambda: config)
    assert server_utils.get_server_url("judge") == "http://127.0.0.9:12001"
    assert server_utils.ServerClient.load_from_global_config().global_config_dict == config


def test_a_folders_ray_workers_enter_its_tree(tmp_path):
    """spider2_lite's `@ray.remote` function lives in `resources_servers.spider2_lite.eval_utils`: a Ray worker must
    import it from the folder's tree. A process that entered the tree names gymfleet's runtime-env hook to `ray.init`;
    the hook's worker setup, shipped by value as Ray ships it (cloudpickle), runs in a fresh interpreter (as a worker
    is) whose `PYTHONPATH` a task replaced with its folder only (code_gen's `check_correctness_remote`) and that cannot
    import gymfleet while it loads the setup: it imports the tree's module, not gymfleet's environment of that name."""
    folder = tmp_path / "resources_servers" / "mcqa"
    folder.mkdir(parents=True)
    (folder / "app.py").write_text("")
    (folder / "remote_part.py").write_text("WHERE = 'tree'\n")
    shipped = tmp_path / "setup.pickle"
    driver = ("import os, json, ray.cloudpickle as cp; from gymfleet.fleet.folders import enter_tree; enter_tree("
              f"__import__('pathlib').Path({str(folder)!r})); from gymfleet.fleet import folder_ray; "
              "env = folder_ray.runtime_env_hook({'env_vars': {'A': '1'}}); "
              f"open({str(shipped)!r}, 'wb').write(cp.dumps(env.pop('worker_process_setup_hook'))); "
              "print(json.dumps([os.environ[folder_ray.RAY_HOOK_ENV], env]))")
    hook, runtime_env = json.loads(subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, check=True).stdout)
    assert hook == "gymfleet.fleet.folder_ray.runtime_env_hook"
    assert runtime_env == {"env_vars": {"GYMFLEET_RAY_FOLDER": str(folder), "A": "1"}}
    worker = ("import sys, pickle\n"
              "class NoGymfleet:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name.partition('.')[0] == 'gymfleet': raise ImportError('gymfleet while loading')\n"
              "sys.path = [p for p in sys.path if p not in ('', '.')]; sys.meta_path.insert(0, NoGymfleet())\n"
              f"setup = pickle.loads(open({str(shipped)!r}, 'rb').read()); sys.meta_path.pop(0); setup()\n"
              "import resources_servers.mcqa.remote_part as part; print(part.WHERE, part.__file__)")
    env = {**os.environ, **runtime_env["env_vars"], "PYTHONPATH": str(folder)}
    done = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tree", str(folder / "remote_part.py")]
