"""Every bench after `pip install -e .` alone: with the packages only the extras bring made unimportable, each
`bench/*.py` still prints its `--help`, and a bench that does need an extra (Ray, the test tools) stops with one line
naming what is missing and the install command, before it starts anything: not a traceback half-way through a run.

The packages are those `pyproject.toml`'s optional dependencies name and its dependencies do not (a fresh virtual
environment with `pip install -e .` alone has none of them); a bench is run as `python bench/x.py` runs it
(`runpy`, as `__main__`), in a child process where each of those modules is set to None in `sys.modules`.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHES = sorted(path.name for path in (ROOT / "bench").glob("*.py") if not path.name.startswith("_"))

NEEDS_AN_EXTRA = {"fuzz_soak.py": "pip install -e '.[test]'"}
"""Benches that cannot even print their help without an extra (they import the test suite's generators)."""


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def extras_only_modules() -> list[str]:
    """Top-level modules of the distributions only the extras install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_dist_name(req) for req in project["dependencies"]}
    extra = {_dist_name(req) for reqs in project["optional-dependencies"].values() for req in reqs} - base
    modules = {name.replace("-", "_") for name in extra}
    for module, dists in importlib.metadata.packages_distributions().items():
        if any(dist.lower().replace("_", "-") in extra for dist in dists) and module.isidentifier():
            modules.add(module)
    return sorted(modules)


RUN_EACH = """
import contextlib, io, json, runpy, sys
blocked, benches, root = json.loads(sys.argv[1])
for name in blocked:
    sys.modules[name] = None
argv = sys.argv[2:] or ["--help"]
results = {}
for bench in benches:
    sys.argv = [f"bench/{bench}", *argv]
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(f"{root}/bench/{bench}", run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:
        code = f"raised {type(exc).__name__}: {exc}"
    results[bench] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(results))
"""


def run_benches(benches: list[str], *argv: str) -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-c", RUN_EACH, json.dumps([extras_only_modules(), benches, str(ROOT)]),
                           *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_blocked_modules_are_the_extras_and_none_the_base_install_needs():
    blocked = extras_only_modules()
    assert {"ray", "hypothesis", "pytest", "docker", "mcp", "uv"} <= set(blocked)
    assert not {"httpx", "aiohttp", "fastapi", "matplotlib", "psutil"} & set(blocked)


def test_every_bench_prints_its_help_without_the_extras():
    results = run_benches(BENCHES)
    assert sorted(results) == BENCHES and len(BENCHES) >= 20
    for bench, result in results.items():
        if bench in NEEDS_AN_EXTRA:
            assert result["code"] == (f"bench/{bench} needs hypothesis and pytest, which `pip install -e .` does not "
                                      f"install: {NEEDS_AN_EXTRA[bench]}"), result
            continue
        assert result["code"] == 0, f"bench/{bench} --help without the extras: {result}"
        assert result["out"].startswith("usage:"), f"bench/{bench} printed no usage: {result}"


@pytest.mark.parametrize(("bench", "argv", "install"), [
    ("fuzz_soak.py", ["--minutes", "0.01"], "pip install -e '.[test]'"),
    ("ray_placement.py", ["--rollouts", "1"], "pip install -e '.[ray]'"),
    ("rollouts_at_scale.py", ["--sizes", "1", "--ray-nodes", "2"], "pip install -e '.[ray]'"),
    ("rollouts_at_scale.py", ["--sizes", "1", "--placement", "ray"], "pip install -e '.[ray]'"),
    ("swebench_backends.py", ["--repeats", "1"],
     "pip install -e '.[docker]' (or pip install 'docker>=7.0'), or use backend: bwrap."),
    ("nemo_gym_corpus.py", ["--folders", "mcqa", "--requirements", "venv"],
     "pip install -e '.[test]' (or without what needs them: --no-tests, --requirements check)"),
])
def test_a_bench_that_needs_an_extra_says_which_and_how_before_it_starts(bench, argv, install):
    result = run_benches([bench], *argv)[bench]
    message = result["code"]
    assert isinstance(message, str) and message.startswith(f"bench/{bench}"), result
    assert message.endswith(install) and "\n" not in message, message
    assert "not install" in message, "it says what is missing"
    assert "started" not in result["out"] + result["err"], "it started a fleet before saying what it needs"
