"""NeMo-Gym 0.7.0's `rollout_collection_driver` hook: `ng_collect_rollouts +rollout_collection_driver=module:function`
hands the collection to a folder's own driver instead of gymfleet's collector (gdpval's multi-stage orchestrator:
`resources_servers.gdpval.multistage_orchestrator:run_rollout_collection`).

As in 0.7.0 the driver is awaited as `driver(rollout_collection_config, global_config_dict)`: 0.7.0's
`RolloutCollectionConfig` (`gymfleet.rollouts.nemo_gym_collect`) and the resolved config as a plain dict, here the
running fleet's config (from its head server) under the command's own keys. Inside it, NeMo-Gym's
`RolloutCollectionHelper` and `ServerClient` reach that fleet (`use_fleet`). The driver owns the run: its files,
its retries (`resume_from_cache` is its to honour) and its result; gymfleet's exit codes are 0 when it returns, 1
when it raises (the error printed) and 130 on Ctrl-C. Every key of the command is the driver's to read, so keys
gymfleet's collector does not know are passed on, not refused (they are listed once, in case one is a typo).

A module of a NeMo-Gym tree (`resources_servers.*`, `responses_api_agents.*`, ...) is imported from the tree of a
folder the fleet serves (`server_folders`), else from the tree in the working directory, as NeMo-Gym's installed
tree is (`gymfleet.fleet.folders.enter_tree`); any other module from `sys.path` and the working directory.

0.7.0 reads the hook in `ng_e2e_collect_rollouts` (`gym eval run`), which starts the servers itself; gymfleet's
`ng_collect_rollouts` reads it against a running fleet. A driver that cannot be loaded (not `module:function`, a
module that does not import, no such function) is one `ConfigError` naming `rollout_collection_driver` and the fix,
before anything is sent.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gymfleet import http
from gymfleet.errors import ConfigError, TransportError, did_you_mean
from gymfleet.fleet.config_checks import validate_fields
from gymfleet.fleet.config_merge import merge
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY, TREE_PACKAGES, enter_tree
from gymfleet.rollouts import nemo_gym_collect
from gymfleet.rollouts.rollout_helper import _fetch_head_config

log = logging.getLogger(__name__)

DRIVER_KEY = "rollout_collection_driver"
DRIVER_FAILED_EXIT_CODE = 1
INTERRUPTED_EXIT_CODE = 130
_FIX = ("set it to 'module.path:function' naming an async function of (rollout_collection_config, "
        "global_config_dict), importable from the working directory or a NeMo-Gym tree the fleet serves; or remove "
        "it for gymfleet's own collection")


def load_driver(path: object, fleet_config: dict[str, Any] | None = None) -> Callable[..., Awaitable[Any]]:
    """The function `path` (`module.path:function`) names.

    Raises:
        ConfigError: `path` is not `module:function`, its module does not import, or it has no such function.
    """
    if not isinstance(path, str) or path.count(":") != 1 or not all(path.partition(":")[::2]):
        raise ConfigError(f"{DRIVER_KEY} must be 'module.path:function' (got {path!r})", path=DRIVER_KEY, hint=_FIX)
    module_name, _, function_name = path.partition(":")
    _enter_tree_of(module_name, fleet_config or {})
    try:
        module = importlib.import_module(module_name)
    except (ImportError, SyntaxError) as exc:
        raise ConfigError(f"{DRIVER_KEY}={path!r}: module {module_name!r} does not import ({type(exc).__name__}: "
                          f"{exc})", path=DRIVER_KEY, hint=_FIX) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        names = [name for name in vars(module) if not name.startswith("_") and callable(getattr(module, name))]
        raise ConfigError(f"{DRIVER_KEY}={path!r}: module {module_name!r} has no function {function_name!r}."
                          f"{did_you_mean(function_name, names)}", path=DRIVER_KEY, hint=_FIX)
    return function


def _enter_tree_of(module_name: str, fleet_config: dict[str, Any]) -> None:
    """Make a NeMo-Gym tree module importable (see the module docstring); put the working directory on `sys.path`."""
    parts = module_name.split(".")
    cwd = Path.cwd()
    if str(cwd) not in sys.path:
        sys.path.append(str(cwd))
    if parts[0] not in TREE_PACKAGES or len(parts) < 2:
        return
    folders = fleet_config.get(SERVER_FOLDERS_KEY)
    trees = [Path(folder).resolve().parents[1] for folder in (folders.values() if isinstance(folders, dict) else [])]
    for tree in [*dict.fromkeys(trees), cwd]:
        folder = tree / parts[0] / parts[1]
        if folder.is_dir():
            enter_tree(folder)
            os.chdir(cwd)  # enter_tree moves to the folder, as a server starts; the command's paths stay the user's
            log.info("importing %s from the NeMo-Gym tree %s", module_name, tree)
            return


def driver_config(command_data: dict[str, Any], host: str, port: int) -> dict[str, Any]:
    """The running fleet's config (from its head server) under the command's keys.

    Raises:
        ConfigError: the head server cannot be reached.
    """
    try:
        fleet = _fetch_head_config(host, port)
    except TransportError as exc:
        raise ConfigError(f"cannot reach the head server at {host}:{port}: {exc}", path="head_server",
                          hint="Start the fleet with ng_run, or point +head_server={host: <host>, port: <port>} "
                               "at it.") from None
    return merge(fleet or {}, command_data, what="the fleet's config and the command's keys")


def run_driver(command_data: dict[str, Any], host: str, port: int, unknown: list[str] = ()) -> int:
    """Load and await the driver `command_data` names against the fleet at `host:port`; the exit code.

    Raises:
        ConfigError: the driver cannot be loaded, the head server cannot be reached, or the collection keys are
            invalid (nothing is sent).
    """
    config = driver_config(command_data, host, port)
    driver = load_driver(config.get(DRIVER_KEY), config)
    collection = validate_fields(nemo_gym_collect.RolloutCollectionConfig, config, "")
    if unknown:
        log.warning("keys gymfleet's collector does not read, passed to %s: %s", config[DRIVER_KEY], unknown)
    log.info("rollout collection by %s", config[DRIVER_KEY])

    async def drive() -> None:
        try:
            with nemo_gym_collect.use_fleet({"host": host, "port": port}, config):
                await driver(collection, config)
        finally:
            await http.close()

    try:
        asyncio.run(drive())
    except ConfigError:
        raise
    except KeyboardInterrupt:
        print(f"Interrupted: {config[DRIVER_KEY]} stopped; what it wrote is kept (it resumes with "
              "+resume_from_cache=true if it honours that key).", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except Exception as exc:  # noqa: BLE001 - the driver's own failure: reported and exit code 1, not a traceback
        log.error("%s failed", config[DRIVER_KEY], exc_info=True)
        print(f"error: {config[DRIVER_KEY]} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return DRIVER_FAILED_EXIT_CODE
    return 0
