"""Server folders from anywhere (`gymfleet.fleet.folders`) and their requirements (`gymfleet.fleet.folder_env`).

A tree of our own (written under tmp_path, laid out as a NeMo-Gym checkout: `resources_servers/<env>/`, no
`resources_servers/__init__.py`) holds a folder named `mcqa` like gymfleet's built-in environment, importing a bare
sibling module and another folder of its tree. Served beside gymfleet's own `mcqa` in one fleet (forked from the
zygote, which imported gymfleet's `mcqa` and the `nemo_gym` surface), its imports must resolve in its tree. A folder
whose requirements pin a version the fleet's environment does not have runs in an environment of its own, made with
uv (a real install of a small pure-Python package from the package index).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from gymfleet.errors import ConfigError
from gymfleet.fleet.folder_env import check_requirements, folder_python
from gymfleet.fleet.zygote import ForkedProcess
from gymfleet.testing import fleet_headers, running_fleet

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_MCQA = {"builtin_mcqa": {"resources_servers": {"mcqa": {"entrypoint": "app.py", "domain": "knowledge"}}}}
PINNED = "tabulate==0.8.10"  # small, pure Python; the fleet's environment has tabulate 0.9

APP = '''
import importlib.metadata
import sys

import nemo_gym
import resources_servers
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from resources_servers.shared_helpers.helpers import ORIGIN
from util import WHICH


class TreeConfig(ResourcesServerConfig):
    pass


class TreeResponse(VerifyResponse):
    which: str
    origin: str
    package_path: list[str]
    tabulate: str
    prefix: str
    parent_dir: str


class TreeServer(ResourcesServer):
    config: TreeConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    async def verify(self, body: VerifyRequest) -> TreeResponse:
        return TreeResponse.echo(body, reward=1.0, which=WHICH, origin=ORIGIN,
                                 package_path=list(resources_servers.__path__),
                                 tabulate=importlib.metadata.version("tabulate"), prefix=sys.prefix,
                                 parent_dir=str(nemo_gym.PARENT_DIR))
'''


def make_tree(root: Path, env: str = "mcqa", requirements: str = "-e nemo-gym[dev] @ ../../\n",
              fields: str = "") -> Path:
    """A NeMo-Gym-shaped tree with folder `env` (and a helper folder it imports); returns the folder's config file."""
    folder = root / "resources_servers" / env
    (folder / "configs").mkdir(parents=True)
    (folder / "app.py").write_text(APP)
    (folder / "util.py").write_text('WHICH = "the tree\'s util"\n')
    (folder / "requirements.txt").write_text(requirements)
    helpers = root / "resources_servers" / "shared_helpers"
    helpers.mkdir()
    (helpers / "helpers.py").write_text('ORIGIN = "the tree\'s shared_helpers"\n')
    (root / "nemo_gym").mkdir()  # a wheel's tree holds NeMo-Gym's own code: it must not shadow gymfleet's surface
    (root / "nemo_gym" / "__init__.py").write_text("raise ImportError('the tree\\'s nemo_gym was imported')\n")
    config = folder / "configs" / f"{env}.yaml"
    config.write_text(textwrap.dedent(f"""\
        {env}:
          resources_servers:
            {env}:
              entrypoint: app.py
              domain: knowledge
        """) + textwrap.indent(fields, " " * 6))
    return config


ROW = {"responses_create_params": {"input": [{"role": "user", "content": "hi"}]},
       "response": {"id": "r", "output": [], "created_at": 0, "model": "m", "object": "response",
                    "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}}


def verify(url: str) -> dict:
    reply = httpx.post(url + "/verify", json=ROW, timeout=30, headers=fleet_headers())
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_folder_of_another_tree_is_served_from_its_tree_beside_the_builtin_environment_of_its_name(tmp_path):
    config = make_tree(tmp_path / "tree")
    with running_fleet([str(config)], BUILTIN_MCQA) as fleet:
        assert fleet.config.instance("mcqa").dir == tmp_path / "tree/resources_servers/mcqa"
        assert fleet.config.instance("builtin_mcqa").folder is None
        body = verify(fleet.config.instance("mcqa").url)
        assert body["which"] == "the tree's util" and body["origin"] == "the tree's shared_helpers"
        assert body["package_path"] == [str(tmp_path / "tree/resources_servers")]
        assert body["reward"] == 1.0 and body["prefix"] == sys.prefix
        # In the fleet's environment it is forked from the zygote, which imported the nemo_gym surface (not the
        # folder) before the tree was known: NeMo-Gym's PARENT_DIR still reads the folder's tree.
        assert isinstance(fleet.children["mcqa"].process, ForkedProcess)
        assert body["parent_dir"] == str(tmp_path / "tree")
        row = {**ROW, "options": [{"A": "yes"}, {"B": "no"}], "expected_answer": "A"}
        builtin = httpx.post(fleet.config.instance("builtin_mcqa").url + "/verify", json=row, timeout=30,
                             headers=fleet_headers(fleet))
        assert builtin.status_code == 200, builtin.text
        assert "which" not in builtin.json() and "extracted_answer" in builtin.json()


def _ng_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gymfleet.cli.run", *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_dry_run_says_which_folder_serves_an_instance_and_validates_it_in_its_own_interpreter(tmp_path):
    config = make_tree(tmp_path / "tree")
    done = _ng_run(f"+config_paths=[{config}]", "+dry_run=true")
    assert done.returncode == 0, done.stderr
    assert (f"mcqa: served by the folder {tmp_path}/tree/resources_servers/mcqa, not gymfleet's built-in "
            "resources_servers/mcqa") in done.stdout
    bad = make_tree(tmp_path / "bad", fields="grading_mod: strict\n")
    done = _ng_run(f"+config_paths=[{bad}]", "+dry_run=true")
    assert done.returncode != 0 and "mcqa.resources_servers.mcqa.grading_mod" in done.stderr


NESTED_REFS = """\
verifiers:
  judge: {type: resources_servers, name: absent_verifier}
fallbacks:
  - {type: responses_api_models, name: absent_model}
"""


def test_a_folders_nested_server_references_are_read_as_nemo_gym_reads_them(tmp_path, caplog):
    """NeMo-Gym 0.7.0 checks the server references in a folder's top-level fields only: one nested deeper (ns_tools'
    `verifiers: {math_with_judge: {type, name}}`, in a mapping or a list) names a server the folder looks up when it
    calls it, so the folder starts without it, and start-up names each dangling one. A top-level one, and any in
    gymfleet's own environments, still stops the config."""
    from gymfleet.errors import ServerRefError
    from gymfleet.fleet.config import GlobalConfigDictParserConfig, parse_global_config

    def parse(config: Path, initial: dict | None = None):
        return parse_global_config(GlobalConfigDictParserConfig(
            cli_args=[f"+config_paths=[{config}]"], initial_global_config_dict=initial, skip_load_from_dotenv=True),
            assign_ports=False, root=ROOT)

    with caplog.at_level("WARNING"):
        config = parse(make_tree(tmp_path / "nested", fields=NESTED_REFS))
    assert config.instance("mcqa").folder is not None
    warned = caplog.text
    assert "mcqa.resources_servers.mcqa.verifiers.judge" in warned and "'absent_verifier'" in warned
    assert "mcqa.resources_servers.mcqa.fallbacks[0]" in warned and "'absent_model'" in warned
    top = make_tree(tmp_path / "top", fields="judge_server: {type: resources_servers, name: absent_verifier}\n")
    with pytest.raises(ServerRefError, match=r"mcqa\.resources_servers\.mcqa\.judge_server"):
        parse(top)
    builtin = {"builtin_mcqa": {"resources_servers": {"mcqa": {
        **BUILTIN_MCQA["builtin_mcqa"]["resources_servers"]["mcqa"],
        "verifiers": {"judge": {"type": "resources_servers", "name": "absent_verifier"}}}}}}
    with pytest.raises(ServerRefError, match=r"builtin_mcqa\.resources_servers\.mcqa\.verifiers\.judge"):
        parse(make_tree(tmp_path / "beside"), builtin)


def test_nemo_gym_stays_gymfleets_surface_when_a_folder_puts_its_tree_first_on_sys_path(tmp_path):
    """A folder's test may insert its tree's root first on sys.path (competitive_coding_challenges' do); the tree's
    own `nemo_gym/` (NeMo-Gym's code: here one that raises) must not shadow gymfleet's surface."""
    config = make_tree(tmp_path / "tree")
    code = textwrap.dedent(f"""\
        import sys
        from gymfleet.fleet.folders import enter_tree
        enter_tree({str(config.parents[1])!r})
        sys.path.insert(0, {str(tmp_path / "tree")!r})
        import nemo_gym.openai_utils
        print(nemo_gym.__file__)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(ROOT / "nemo_gym" / "__init__.py")


def test_requirements_are_sorted_against_this_environment(tmp_path):
    (tmp_path / "more.txt").write_text("pyyaml>=5  # satisfied\n")
    (tmp_path / "requirements.txt").write_text(textwrap.dedent(f"""\
        -e nemo-gym[dev,sandbox] @ ../../
        # a comment
        {PINNED}
        gymfleet-no-such-package-xyz>=1
        colorama; python_version < "3"
        -r more.txt
        --index-url https://example.invalid/simple
        """))
    reqs = check_requirements(tmp_path)
    installed = importlib.metadata.version("tabulate")
    assert reqs.conflicting == [f"{PINNED} (installed {installed})"]
    assert reqs.missing == ["gymfleet-no-such-package-xyz>=1"]
    assert reqs.satisfied == ["pyyaml>=5"]
    assert reqs.unsupported == ["'--index-url https://example.invalid/simple' (requirements.txt:7)"]
    assert reqs.lines == [PINNED, "gymfleet-no-such-package-xyz>=1", "pyyaml>=5"]


def test_requirements_from_elsewhere_than_the_index_are_installed_from_there_not_refused(tmp_path):
    """What NeMo-Gym's venv installs from a URL or a local path (a direct reference, a bare git or wheel URL, a
    vendored project beside the requirements file) is missing until installed, with what uv installs; a local path
    that does not exist is named."""
    vendored = tmp_path / "vendored"
    vendored.mkdir()
    (vendored / "pyproject.toml").write_text('[project]\nname = "pyyaml"\nversion = "1"\n')  # installed here
    (tmp_path / "other").mkdir()
    (tmp_path / "requirements.txt").write_text(textwrap.dedent("""\
        thing @ git+https://example.invalid/thing.git@abc
        pyyaml @ https://example.invalid/pyyaml.whl
        git+https://example.invalid/tale.git@main#egg=tale-suite
        https://example.invalid/model-3.8.0-py3-none-any.whl
        -e ./vendored[extra]
        ./other
        -e ./gone
        """))
    reqs = check_requirements(tmp_path)
    assert reqs.missing == ["thing @ git+https://example.invalid/thing.git@abc",
                            "git+https://example.invalid/tale.git@main#egg=tale-suite",
                            "https://example.invalid/model-3.8.0-py3-none-any.whl", f"{tmp_path / 'other'}"]
    assert reqs.satisfied == ["pyyaml @ https://example.invalid/pyyaml.whl", f"{vendored}[extra]"]
    assert reqs.unsupported == ["'./gone' (requirements.txt:7: no such folder)"]
    assert len(reqs.lines) == 6
    project = tmp_path / "tree" / "resources_servers" / "fim"  # NeMo-Gym's pyproject layout, in a tree:
    project.mkdir(parents=True)  # [tool.uv.sources] says where each dependency comes from
    (tmp_path / "tree" / "nemo_gym").mkdir()
    (project / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [project]
        dependencies = ["nemo-gym[dev]", "human-eval-infilling", "vendored[x]", "pyyaml>=5"]
        [tool.uv.sources]
        nemo-gym = {{ path = "../..", editable = true }}
        human-eval-infilling = {{ git = "https://example.invalid/hei.git", rev = "abc" }}
        vendored = {{ path = "{vendored}" }}
        """))
    reqs = check_requirements(project)
    assert reqs.missing == ["human-eval-infilling @ git+https://example.invalid/hei.git@abc"]
    assert reqs.satisfied == [f"{vendored}[x]", "pyyaml>=5"]


def test_a_missing_requirement_stops_with_the_install_command(tmp_path):
    (tmp_path / "requirements.txt").write_text("gymfleet-no-such-package-xyz>=1\n")
    with pytest.raises(ConfigError, match=r"(?s)not installed here: gymfleet-no-such-package-xyz>=1.*"
                                          r"pip install 'gymfleet-no-such-package-xyz>=1'"):
        folder_python(tmp_path)
    assert folder_python(tmp_path.parent) == sys.executable  # no requirements.txt: nothing to install


def test_what_a_folder_imports_from_nemo_gyms_own_dependencies_without_listing_it_is_a_missing_requirement(
        tmp_path):
    """Under NeMo-Gym a folder's venv holds NeMo-Gym's own dependencies (workplace_assistant imports pandas, which
    `datasets` brings, without listing it). Every package of that closure (`NEMO_GYM_PROVIDES`) that this environment
    cannot import, imported when the server starts (through the folder's own modules) or, for its tests, by its
    tests, is a requirement missing here: `check` stops naming it, the file that imports it and the fix. One that is
    listed, importable here, guarded by `try` or imported inside a function is not."""
    import importlib.util

    from gymfleet.fleet.folder_imports import NEMO_GYM_PROVIDES

    absent = {name: req for name, req in NEMO_GYM_PROVIDES.items() if importlib.util.find_spec(name) is None}
    present = [name for name in NEMO_GYM_PROVIDES if name not in absent]
    assert "pandas" in absent, "gymfleet's own dependencies must not bring pandas (the brief: not a core dependency)"
    folder = tmp_path / "resources_servers" / "assistant"
    (folder / "tools").mkdir(parents=True)
    (folder / "tests").mkdir()
    special = {"dill", "sklearn", "wandb", "sqlparse"}  # guarded, in a function, in tests only, listed
    assert special <= set(absent)
    names = sorted(set(absent) - special)
    (folder / "app.py").write_text(
        "import json\nfrom tools import analytics\nimport resources_servers.assistant.more\n"
        + "".join(f"import {name}\n" for name in present)
        + "try:\n    import dill\nexcept ImportError:\n    dill = None\n\n\ndef later():\n    import sklearn\n")
    (folder / "tools" / "__init__.py").write_text("")
    (folder / "tools" / "analytics.py").write_text("".join(f"import {name}.sub\n" for name in names[::2]))
    (folder / "more.py").write_text("".join(f"from {name} import thing\n" for name in names[1::2]))
    (folder / "tests" / "test_app.py").write_text("import wandb\n")
    (folder / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\nsqlparse\n")
    expected = {absent[name] for name in names}
    reqs = check_requirements(folder)
    assert set(reqs.implied) == expected and set(reqs.missing) >= expected and set(reqs.lines) >= expected
    assert reqs.implied[absent["pandas"]].startswith(("tools/analytics.py:", "more.py:"))
    assert set(check_requirements(folder, tests=True).implied) == expected | {absent["wandb"]}
    with pytest.raises(ConfigError, match=r"(?s)not installed here: .*pandas.*imported without being listed: .*"
                                          r"pandas by (tools/analytics|more)\.py:\d+.*pip install"):
        folder_python(folder)


def test_a_conflicting_pin_runs_in_an_environment_of_its_own_made_once(tmp_path):
    assert importlib.metadata.version("tabulate") != PINNED.split("==")[1]
    config = make_tree(tmp_path / "tree", env="pinned", requirements=f"-e nemo-gym[dev] @ ../../\n{PINNED}\n")
    with running_fleet([str(config)]) as fleet:
        body = verify(fleet.config.instance("pinned").url)
    assert body["tabulate"] == "0.8.10" and "folder_envs" in body["prefix"] and body["prefix"] != sys.prefix
    said = []
    assert folder_python(config.parents[1], say=said.append) == f"{body['prefix']}/bin/python"
    assert said == []  # cached: the second start makes nothing
