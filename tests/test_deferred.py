"""gymfleet.grading.deferred: modules and names imported on first use; what the fleet's zygote no longer imports."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gymfleet.grading.deferred import defer_module, deferred_names

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """A folder on sys.path for throwaway modules; every module it held is forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(name: str, code: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(code))
        written.append(name)

    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_a_deferred_module_runs_once_on_its_first_name_and_stays_the_same_object(modules):
    modules("gf_deferred_counter", """
        import builtins
        builtins.gf_deferred_runs = getattr(builtins, "gf_deferred_runs", 0) + 1
        VALUE = 42
    """)
    import builtins

    assert defer_module("gf_deferred_counter")
    import gf_deferred_counter  # binds the deferred module, runs nothing
    import gf_deferred_counter as again  # a second import statement reads __spec__: still nothing runs

    assert getattr(builtins, "gf_deferred_runs", 0) == 0
    assert again is gf_deferred_counter
    assert gf_deferred_counter.VALUE == 42
    assert gf_deferred_counter.VALUE == 42 and builtins.gf_deferred_runs == 1
    assert sys.modules["gf_deferred_counter"] is again
    with pytest.raises(AttributeError):
        gf_deferred_counter.missing  # noqa: B018
    del builtins.gf_deferred_runs


def test_a_deferred_module_that_fails_is_forgotten_and_raises_its_own_error(modules):
    modules("gf_deferred_broken", "raise ValueError('broken on purpose')\n")
    assert defer_module("gf_deferred_broken")
    import gf_deferred_broken

    with pytest.raises(ValueError, match="broken on purpose"):
        gf_deferred_broken.anything  # noqa: B018
    assert "gf_deferred_broken" not in sys.modules


def test_defer_module_leaves_imported_missing_and_dotted_modules_alone():
    assert not defer_module("json")  # imported already
    assert not defer_module("gf_no_such_module_anywhere")
    assert not defer_module("email.mime")
    assert "gf_no_such_module_anywhere" not in sys.modules


def test_deferred_names_stand_in_until_used_and_leave_no_trace(modules):
    modules("gf_deferred_heavy", """
        def double(x):
            return 2 * x
        class Table:
            size = 3
        table = Table()
    """)
    modules("gf_deferred_user", "from gf_deferred_heavy import double, table\n")
    with deferred_names("gf_deferred_heavy"):
        import gf_deferred_user
    assert "gf_deferred_heavy" not in sys.modules  # the block imported nothing, and left no placeholder
    assert "imported on first use" in repr(gf_deferred_user.double)
    assert gf_deferred_user.double(21) == 42  # a call imports it
    assert "gf_deferred_heavy" in sys.modules
    assert gf_deferred_user.table.size == 3  # an attribute read forwards too


def test_deferred_names_is_a_no_op_for_a_module_already_imported():
    import json as real

    with deferred_names("json"):
        from json import dumps
    assert dumps is real.dumps


def test_the_zygote_imports_no_plotting_stack_and_no_scipy_stats():
    """What reasoning_gym's and instruction_following's servers import (as the zygote does, models preloaded) leaves
    out matplotlib and scipy.stats; both still work when used (a game_of_life board, nltk's fisher_exact)."""
    code = textwrap.dedent("""
        import json, sys
        import resources_servers.reasoning_gym.app
        import resources_servers.instruction_following.app as instruction_following
        instruction_following.InstructionFollowingServer.preload()
        before = {name: name in sys.modules for name in ("matplotlib", "matplotlib.pyplot", "scipy.stats")}
        import reasoning_gym
        from nltk.metrics.association import fisher_exact
        board = reasoning_gym.create_dataset("game_of_life", size=1, seed=3)[0]["answer"]
        print(json.dumps({"before": before, "board": board, "fisher": fisher_exact([[8, 2], [1, 5]]).pvalue}))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["before"] == {"matplotlib": False, "matplotlib.pyplot": False, "scipy.stats": False}
    assert found["board"].startswith("[[")
    assert found["fisher"] == pytest.approx(0.034965034965)


NANO3_APPS = ("responses_api_models.vllm_model.app", "resources_servers.math_with_judge.app",
              "resources_servers.code_gen.app", "sandbox.app", "resources_servers.instruction_following.app",
              "resources_servers.structured_outputs.app", "resources_servers.reasoning_gym.app",
              "resources_servers.calendar.app", "resources_servers.mcqa.app",
              "resources_servers.workplace_assistant.app", "agents.simple_agent.app")


def test_the_nano3_zygote_imports_no_openai_nltk_reasoning_gym_or_sympy(tmp_path):
    """What the zygote imports before the Nano 3 fleet's first fork (the shared stack, every server class, each
    `preload`) leaves out what no server needs to start: the `openai` package, and what instruction_following and
    reasoning_gym load once they are up (`Server.warm_up`), reasoning-gym's task names coming from the cache."""
    version = importlib.metadata.version("reasoning-gym")
    (tmp_path / f"reasoning-gym-{version}-tasks.json").write_text('["basic_arithmetic"]')
    code = textwrap.dedent(f"""
        import importlib, inspect, json, sys
        from gymfleet.fleet.zygote_main import import_shared
        from gymfleet.serving.server import Server
        import_shared()
        for name in {NANO3_APPS!r}:
            module = importlib.import_module(name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if issubclass(cls, Server) and cls.__module__ == name:
                    cls.preload()
        print(json.dumps(sorted(m for m in ("openai", "nltk", "langdetect", "reasoning_gym", "sympy")
                                if m in sys.modules)))
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            check=False, env={**os.environ, "GYMFLEET_CACHE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
