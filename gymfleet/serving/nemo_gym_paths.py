"""Where NeMo-Gym's folders look for their files: `nemo_gym.PARENT_DIR`, `CACHE_DIR` and
`_resolve_under_cwd_or_install`.

Under NeMo-Gym, `PARENT_DIR` is the checkout (or installed tree) the folders live in, and a relative read path
(`resources_servers/<env>/prompts/judge.yaml`, a prompt file, a data file) is found under the first of: the roots in
`NEMO_GYM_EXTRA_ROOTS`, the working directory (a served folder's own), `PARENT_DIR`. Here a folder of another tree
(`gymfleet.fleet.folders.enter_tree`) has that tree as its `PARENT_DIR` (`FOLDER_TREE_ENV` carries it to the server
process and to what it starts, its tests included); gymfleet's own folders have gymfleet's checkout. `CACHE_DIR` is
`<PARENT_DIR>/cache`. Read paths only: nothing is written under `PARENT_DIR` by these.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHE_DIR", "EXTRA_ROOTS_ENV", "FOLDER_TREE_ENV", "PARENT_DIR", "parent_dir",
           "resolve_under_cwd_or_install", "search_roots"]

FOLDER_TREE_ENV = "GYMFLEET_FOLDER_TREE"
"""The tree (holding `resources_servers/`) of the folder this process serves or tests, when it is another tree."""
EXTRA_ROOTS_ENV = "NEMO_GYM_EXTRA_ROOTS"
"""NeMo-Gym's extra search roots (`os.pathsep`-separated), searched first."""
_OWN_ROOT = Path(__file__).resolve().parents[2]


def parent_dir() -> Path:
    """NeMo-Gym's `PARENT_DIR` for this process now: the folder's tree, else gymfleet's checkout."""
    tree = os.environ.get(FOLDER_TREE_ENV)
    return Path(tree) if tree else _OWN_ROOT


PARENT_DIR = parent_dir()
"""NeMo-Gym's `nemo_gym.PARENT_DIR`, as this process started (see `parent_dir`)."""
CACHE_DIR = PARENT_DIR / "cache"
"""NeMo-Gym's `nemo_gym.CACHE_DIR`: `<PARENT_DIR>/cache`."""


def search_roots() -> list[Path]:
    """`NEMO_GYM_EXTRA_ROOTS`, the working directory, `PARENT_DIR`: in that order, each once."""
    extra = [Path(root) for root in os.environ.get(EXTRA_ROOTS_ENV, "").split(os.pathsep) if root]
    return list(dict.fromkeys([*extra, Path.cwd(), parent_dir()]))


def resolve_under_cwd_or_install(rel_path: str | Path, *, validator: Callable[[Path], bool] | None = None) -> Path:
    """NeMo-Gym's `_resolve_under_cwd_or_install`: an absolute path as it is; a relative one under the first search
    root where it exists (`validator` instead of `Path.exists` when given), else under the first root, so an error
    names the user's own place."""
    path = Path(rel_path)
    if path.is_absolute():
        return path
    valid = validator or Path.exists
    roots = search_roots()
    return next((root / path for root in roots if valid(root / path)), roots[0] / path)
