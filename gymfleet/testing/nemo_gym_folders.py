"""Run a NeMo-Gym environment folder's own shipped tests against gymfleet's `nemo_gym` surface, and stage folders.

A folder's tests import it as NeMo-Gym lays it out (`from resources_servers.<name>.app import ...`, other folders of
its tree, `environment_servers.<x>`), and gymfleet has a `resources_servers` package of its own. `run_folder_tests`
runs them where the folder lies (as NeMo-Gym runs them: pytest in the folder, in a fresh interpreter) with the plugin
`gymfleet.testing.folder_pytest`, which enters the folder's tree before the first conftest loads: the tree's packages
win over gymfleet's folders of the same names, `nemo_gym` stays gymfleet's surface. The run uses the folder's own
settings, not gymfleet's (no `filterwarnings = error`): NeMo-Gym's `asyncio_mode = auto` for its `async def` tests,
and nothing else. `ng_test +entrypoint=<path to a NeMo-Gym folder>` runs this (`gymfleet.cli.test`); so does the
corpus bench (`gymfleet.testing.nemo_gym_corpus.run_tests_in_place`, in the folder's own environment).

`stage_folder` copies a folder (caches left out) into `<root>/resources_servers/<name>/` of a scratch tree with the
`__init__.py` files that make it a package there (and the tree's `benchmarks/` linked beside it, which folders'
fixtures read configs from): what the compatibility tests serve folders from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

FOLDER_PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""
"""NeMo-Gym's pytest settings for its folders' tests (async tests run without markers)."""


def is_nemo_gym_folder(folder: Path) -> bool:
    """Whether `folder` is a NeMo-Gym environment folder: an `app.py` that imports `nemo_gym`."""
    app = folder / "app.py"
    return app.is_file() and "nemo_gym" in app.read_text(errors="replace")


def stage_folder(folder: Path, root: Path) -> Path:
    """Copy `folder` to `<root>/resources_servers/<name>/` (a package there); returns the copy."""
    target = root / "resources_servers" / folder.name
    shutil.copytree(folder, target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.pyc"))
    for package in (root / "resources_servers", target):
        (package / "__init__.py").touch()
    source = folder.resolve()
    benchmarks = source.parents[1] / "benchmarks"
    if source.parent.name == "resources_servers" and benchmarks.is_dir() and not (root / "benchmarks").exists():
        (root / "benchmarks").symlink_to(benchmarks, target_is_directory=True)  # the tree's benchmark configs
    (root / "pytest.ini").write_text(FOLDER_PYTEST_INI)
    return target


def folder_test_command(folder: Path, scratch: Path, python: str | None = None, extra: list[str] = (),
                        ) -> tuple[list[str], dict[str, str]]:
    """The command (run in `folder`, as NeMo-Gym runs them) and environment that run `folder`'s own tests where the
    folder lies: NeMo-Gym's pytest settings (written to `scratch`), imports resolving in the folder's tree
    (`gymfleet.testing.folder_pytest`: bare sibling imports, `resources_servers.<name>` and the tree's other packages
    such as `environment_servers`, never gymfleet's folders of those names), gymfleet's `nemo_gym` surface."""
    from gymfleet.fleet.config import repository_root
    from gymfleet.testing.folder_pytest import FOLDER_ENV

    scratch.mkdir(parents=True, exist_ok=True)
    ini = scratch / "pytest.ini"
    ini.write_text(FOLDER_PYTEST_INI)
    env = {**os.environ, FOLDER_ENV: str(folder),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(repository_root()), os.environ.get("PYTHONPATH")]))}
    command = [python or sys.executable, "-m", "pytest", "-c", str(ini), "--rootdir", str(folder), "-p",
               "gymfleet.testing.folder_pytest", "-p", "no:cacheprovider", "tests", *extra]
    return command, env


def run_folder_tests(folder: Path, scratch: Path, extra: list[str] = (), *, capture: bool = False,
                     timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """Run `folder`'s own tests where it lies (`folder_test_command`; pytest's exit code in `returncode`)."""
    command, env = folder_test_command(Path(folder), scratch, extra=list(extra))
    return subprocess.run(command, cwd=folder, env=env, check=False, capture_output=capture, text=True,
                          timeout=timeout_s)
