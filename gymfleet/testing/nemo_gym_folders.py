"""Run a NeMo-Gym environment folder's own shipped tests against gymfleet's `nemo_gym` surface.

A folder's tests import it as NeMo-Gym lays it out (`from resources_servers.<name>.app import ...`), and gymfleet has
a `resources_servers` package of its own. So the folder is staged: copied (caches left out) into
`<root>/resources_servers/<name>/` of a scratch tree with the `__init__.py` files that make it a package there (and
the tree's `benchmarks/` linked beside it, which folders' fixtures read configs from), and
pytest runs in the folder (as NeMo-Gym runs them) in a fresh interpreter whose path starts with the folder and the
tree (then gymfleet's checkout, whose `nemo_gym` package the folder imports). The run uses the folder's own
settings, not gymfleet's (no `filterwarnings = error`): NeMo-Gym's `asyncio_mode = auto` for its `async def` tests,
and nothing else.

`ng_test +entrypoint=<path to a NeMo-Gym folder>` runs this (`gymfleet.cli.test`); so do the compatibility tests.
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


def folder_test_command(root: Path, name: str, extra: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """The command (run in the folder, as NeMo-Gym runs them) and environment that run staged folder `name`'s tests.

    The folder itself leads the path (its tests import `from app import ...`), then the tree (`from
    resources_servers.<name>.app import ...`), then gymfleet's checkout.
    """
    from gymfleet.fleet.config import repository_root

    env = dict(os.environ)
    folder = root / "resources_servers" / name
    path = [str(folder), str(root), str(repository_root()), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path).rstrip(os.pathsep)
    env["NEMO_GYM_EXTRA_ROOTS"] = str(root)  # the folder's configs resolve in its tree, not gymfleet's checkout
    command = [sys.executable, "-m", "pytest", "-c", str(root / "pytest.ini"), "--rootdir", str(root),
               "-p", "no:cacheprovider", "tests", *extra]
    return command, env


def run_folder_tests(folder: Path, scratch: Path, extra: list[str] = (), *, capture: bool = False,
                     timeout_s: float | None = None) -> subprocess.CompletedProcess:
    """Stage `folder` under `scratch` and run its tests there (pytest's exit code in `returncode`)."""
    stage_folder(folder, scratch)
    command, env = folder_test_command(scratch, folder.name, list(extra))
    return subprocess.run(command, cwd=scratch / "resources_servers" / folder.name, env=env, check=False,
                          capture_output=capture, text=True, timeout=timeout_s)
