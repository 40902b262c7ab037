"""A NeMo-Gym folder's Ray tasks import as the folder does: Ray workers enter the folder's tree before they run one.

A folder's `@ray.remote` function defined in a module it imports by its tree name (spider2_lite's
`resources_servers.spider2_lite.eval_utils.execute_sqlite_remote`) is run by a Ray worker, a fresh interpreter that
imports that module by name. Under NeMo-Gym the tree is installed, so any process finds it; under gymfleet only the
folder's own process finds it (`gymfleet.fleet.folders.enter_tree`: import hooks, not `sys.path`), so the worker
failed with `No module named 'resources_servers.spider2_lite'`.

`enter_tree` therefore also records the folder (`RAY_FOLDER_ENV`) and names `runtime_env_hook` as Ray's runtime-env
hook (`RAY_RUNTIME_ENV_HOOK`, read by `ray.init` in that process, explicit or implicit; one set already is kept).
The hook adds to the job's runtime environment a worker setup hook and the folder as an environment variable of its
workers, so each worker enters the same tree when it starts (`folders.enter_tree_in_ray_worker`): on a cluster the
folder's process starts, and on one it joins.

The setup hook is a function Ray ships by value (`worker_setup`: a closure, which Ray's cloudpickle cannot name and so
copies), not a name for the worker to import: a worker may not find gymfleet by name. gymfleet run from a checkout
is found through `PYTHONPATH`, and a folder's task may replace its workers' `PYTHONPATH` (code_gen's
`check_correctness_remote` sets `runtime_env={"env_vars": {"PYTHONPATH": <its folder>}}`, so its `lcb_integration`
imports): every worker then failed its setup hook with `No module named 'gymfleet'` and the task with
`WorkerCrashedError`. The shipped function puts gymfleet's root back on the worker's `sys.path` (last: the task's own
paths stay first) before it imports the named hook.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

RAY_FOLDER_ENV = "GYMFLEET_RAY_FOLDER"
RAY_HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
WORKER_SETUP = "gymfleet.fleet.folders.enter_tree_in_ray_worker"
"""Ray's worker setup hook: enter the folder's tree, as its process did (`gymfleet.fleet.folders`)."""
GYMFLEET_ROOT = str(Path(__file__).resolve().parents[2])
"""Where gymfleet's packages lie (the directory holding `gymfleet/`), which a worker's `sys.path` may lack."""


def install(folder: Path) -> None:
    """Make the Ray jobs this process starts from now on enter `folder`'s tree in their workers."""
    os.environ[RAY_FOLDER_ENV] = str(folder)
    os.environ.setdefault(RAY_HOOK_ENV, "gymfleet.fleet.folder_ray.runtime_env_hook")


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """Ray's runtime-env hook: `runtime_env` with the worker setup hook and the folder's variable (any the caller
    set are kept)."""
    runtime_env = dict(runtime_env or {})
    folder = os.environ.get(RAY_FOLDER_ENV)
    if folder:
        runtime_env.setdefault("worker_process_setup_hook", worker_setup(GYMFLEET_ROOT))
        runtime_env["env_vars"] = {RAY_FOLDER_ENV: folder, **(runtime_env.get("env_vars") or {})}
    return runtime_env


def worker_setup(root: str, hook: str = WORKER_SETUP) -> Callable[[], None]:
    """The worker setup function Ray ships by value: `root` on `sys.path` if missing, then the function `hook` names
    (imported by name, as Ray imports a named hook) is called."""

    def enter_folder_tree() -> None:
        import importlib
        import sys

        if root not in sys.path:
            sys.path.append(root)
        module, _, name = hook.rpartition(".")
        getattr(importlib.import_module(module), name)()

    return enter_folder_tree
