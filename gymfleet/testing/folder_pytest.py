"""pytest plugin that runs a NeMo-Gym folder's own tests in place, as NeMo-Gym does (`cd <folder> && pytest`):
`-p gymfleet.testing.folder_pytest` with `GYMFLEET_TEST_FOLDER=<folder>` makes the session import as the folder's
server does (`gymfleet.fleet.folders.enter_tree`): bare sibling imports (`from app import ...`, `from utils import
...`) find the folder, and `resources_servers.<other>` is the tree's folder, never gymfleet's environment of that name.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gymfleet.fleet.folders import enter_tree

FOLDER_ENV = "GYMFLEET_TEST_FOLDER"


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    """Enter the tree before pytest imports the first conftest: a folder's `tests/conftest.py` is loaded here, before
    `pytest_configure`, and one that imports `resources_servers.<name>.app` where gymfleet has an environment of that
    name (genrm_compare's) would otherwise bind gymfleet's module for the whole session."""
    folder = os.environ.get(FOLDER_ENV)
    if folder:
        # The surface's pydantic classes read their attribute docstrings through `inspect.getmodule`, which on
        # Python 3.11 raises "is a built-in module" once a namespace package (the tree's `resources_servers`) is in
        # sys.modules: build them first, as `ng_run` does, whatever the folder's tests import first.
        import gymfleet.serving.nemo_gym_server  # noqa: F401

        enter_tree(Path(folder))
