"""Server folders from anywhere: a NeMo-Gym tree's `resources_servers/<env>/` served where it lies.

`ng_run "+config_paths=[<tree>/resources_servers/foo/configs/foo.yaml]"` serves folder `foo` of that tree. The tree
of an instance is found from the config file that defines it: the nearest folder above the file holding
`<server type>/<impl>/<entrypoint>` (NeMo-Gym resolves `<type>/<impl>` against the working directory or its install
root; a config file inside a tree names its own folder, wherever the command runs). `server_folders(files, root)`
maps such instances to their folder when it lies outside gymfleet's own root; the parsed config keeps that map under
the top-level key `server_folders` (`{instance: folder}`), so every child process sees it; a config written
elsewhere names a folder there itself (`+server_folders.<instance>=<folder>`, `named_folders`). A resources server's
folder wins over gymfleet's built-in environment of the same name (for that instance; `describe` is the start-up line
that says which implementation serves it). An agent or model named in another folder's config (a resources folder's
`<env>_simple_agent` block) keeps gymfleet's implementation where gymfleet has one of that name; one defined by a
config file inside its own folder (`<tree>/responses_api_agents/simple_agent/configs/simple_agent.yaml`), or named
with `+server_folders`, is served from its tree (NeMo-Gym's own agents:
`gymfleet.serving.nemo_gym_agent_server`), as is a folder with no built-in of its name.

Imports inside a folder resolve as under NeMo-Gym (which runs `python app.py` in the folder, with the tree
installed): bare sibling imports (`from util import ...`) find the folder, and the tree's top-level packages
(`resources_servers`, `responses_api_agents`, `environments`, ...) are the tree's, never gymfleet's folders of the
same name; `nemo_gym` stays gymfleet's surface even where the folder puts its tree first on `sys.path`. One Python
process can hold one `resources_servers` package, so a foreign folder runs in a process of its own, never built in
the supervisor: forked from the zygote when it runs in the fleet's environment (the zygote imports the `nemo_gym`
surface, never the folder; the forked server enters the tree), else a fresh interpreter of the folder's own
environment (`gymfleet.fleet.folder_env`). `enter_tree` is the first thing that process does with the folder, and
`gymfleet.fleet.launch.check_in_fresh_interpreter` is how a dry run and the supervisor validate one.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gymfleet.errors import ConfigError
from gymfleet.fleet import folder_ray
from gymfleet.serving.nemo_gym_paths import FOLDER_TREE_ENV

log = logging.getLogger(__name__)

SERVER_FOLDERS_KEY = "server_folders"
"""Top-level key of the resolved config: `{instance name: absolute folder}` for folders outside gymfleet's root."""


def tree_of(config_file: Path, type_folder: str, impl: str, entrypoint: str) -> Path | None:
    """The nearest folder above `config_file` that holds `<type_folder>/<impl>/<entrypoint>`, if any."""
    for parent in Path(config_file).resolve().parents:
        if (parent / type_folder / impl / entrypoint).is_file():
            return parent
    return None


def server_folders(files: Iterable[tuple[Path, dict]], root: Path, definition, type_folders: dict[str, str],
                   ) -> dict[str, str]:
    """`{instance: folder}` for the instances whose folder lies in a tree outside `root` (gymfleet's own).

    `files` are the loaded config files in merge order (a later definition of an instance wins), `definition(block)`
    gives `(server type, impl)` of an instance block or None, and `type_folders` maps a server type to the folder
    gymfleet keeps its implementations in (agents live in `agents/`).
    """
    root = Path(root).resolve()
    found: dict[str, str] = {}
    for path, data in files:
        for name, block in data.items():
            kind = definition(block)
            if kind is None:
                continue
            server_type, impl = kind
            entrypoint = str(block[server_type][impl].get("entrypoint") or "app.py")
            tree = tree_of(path, server_type, impl, entrypoint)
            if tree is None or tree == root:
                found.pop(name, None)
                continue
            folder = tree / server_type / impl
            builtin = root / type_folders.get(server_type, server_type) / impl
            if server_type != "resources_servers" and builtin.is_dir() and folder not in Path(path).resolve().parents:
                found.pop(name, None)  # gymfleet's agent/model of that name serves it
                continue
            found[name] = str(folder)
    return found


def named_folders(value: Any) -> dict[str, str]:
    """The folders named explicitly with `server_folders: {instance: folder}` (absolute, each a NeMo-Gym-shaped
    `<tree>/<server type>/<impl>` folder), for a config written outside the folder's tree.

    Raises:
        ConfigError: not a mapping, or a folder that does not exist.
    """
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{SERVER_FOLDERS_KEY}: must map instance names to folders, not {value!r}",
                          path=SERVER_FOLDERS_KEY, hint="+server_folders.<instance>=/path/to/resources_servers/foo")
    found = {}
    for name, folder in value.items():
        path = Path(str(folder)).expanduser().resolve()
        if not path.is_dir():
            where = f"{SERVER_FOLDERS_KEY}.{name}"
            raise ConfigError(f"{where}: {folder} is not a folder", path=where)
        found[str(name)] = str(path)
    return found


def describe(instance: Any, how: str) -> str:
    """The start-up line that says which implementation serves `instance` (a `ServerInstance` with a `folder`) and
    `how` its process started (forked from the zygote, or a fresh interpreter and why)."""
    builtin = dataclasses.replace(instance, folder=None).dir
    shadowed = f", not gymfleet's built-in {builtin.parent.name}/{builtin.name}" if builtin.is_dir() else ""
    return f"{instance.name}: served by the folder {instance.folder}{shadowed} ({how})"


# ------------------------------------------------------------------------------------------ inside the child


class _TreeFinder(importlib.abc.MetaPathFinder):
    """Finds the tree's top-level packages (and their submodules) in the tree only: gymfleet's folders of the same
    name (a regular package `resources_servers/__init__.py`) would otherwise win over the tree's namespace package."""

    def __init__(self, tree: Path, names: frozenset[str]) -> None:
        self.tree = str(tree)
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname.partition(".")[0] not in self.names:
            return None
        if "." not in fullname:
            return importlib.machinery.PathFinder.find_spec(fullname, [self.tree])
        return None  # submodules: the parent package's __path__ lies in the tree already

    def __repr__(self) -> str:
        return f"_TreeFinder({self.tree!r})"


class _SurfaceFinder(importlib.abc.MetaPathFinder):
    """Finds `nemo_gym` where gymfleet's surface lies, whatever the folder puts first on `sys.path`: a folder's test
    that inserts its tree's root (`sys.path.insert(0, GYM_ROOT)`, as competitive_coding_challenges' do) would
    otherwise import the tree's own `nemo_gym/` (NeMo-Gym's code, with NeMo-Gym's dependencies)."""

    def __init__(self, where: str) -> None:
        self.where = where

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != "nemo_gym":
            return None  # submodules follow the package's __path__, which lies here
        return importlib.machinery.PathFinder.find_spec(fullname, [self.where])

    def __repr__(self) -> str:
        return f"_SurfaceFinder({self.where!r})"


def _surface_location() -> str | None:
    """The folder holding gymfleet's `nemo_gym` package (found before any tree is entered), if it is importable."""
    module = sys.modules.get("nemo_gym")
    locations = list(getattr(module, "__path__", None) or [])
    if not locations:
        spec = importlib.machinery.PathFinder.find_spec("nemo_gym")
        locations = list(spec.submodule_search_locations or []) if spec else []
    return str(Path(locations[0]).parent) if locations else None


TREE_PACKAGES = ("resources_servers", "responses_api_agents", "responses_api_models", "environments",
                 "environment_servers", "benchmarks")
"""The top-level packages of a NeMo-Gym tree (those its wheel installs, less `nemo_gym` itself: gymfleet's `nemo_gym`
surface stands in for it). In a folder's process these names are the tree's."""


def tree_packages(tree: Path) -> frozenset[str]:
    """The NeMo-Gym top-level packages (`TREE_PACKAGES`) that `tree` has."""
    return frozenset(name for name in TREE_PACKAGES if (Path(tree) / name).is_dir())


def enter_tree(folder: Path) -> None:
    """Make this interpreter import as NeMo-Gym's `python app.py` in `folder` would: the folder first on `sys.path`
    (bare sibling imports), and its tree's packages (`TREE_PACKAGES`) found in the tree only, so they shadow
    gymfleet's folders of the same name. The tree itself is not put on `sys.path`: its `nemo_gym/` (NeMo-Gym's own
    code, in a wheel's tree) must not shadow gymfleet's `nemo_gym` surface.

    Call it before importing anything from the folder; modules of those names already imported are dropped.
    """
    folder = Path(folder).resolve()
    tree = folder.parents[1]
    names = tree_packages(tree)
    known = getattr(sys.modules.get("inspect"), "_filesbymodname", {})  # `inspect.getmodule`'s cache of files
    for module in [m for m in sys.modules if m.partition(".")[0] in names]:
        del sys.modules[module]
        known.pop(module, None)  # else it reads the tree's namespace package (no file) as a changed built-in module
    surface = _surface_location()
    if surface is not None:
        sys.meta_path.insert(0, _SurfaceFinder(surface))
    sys.meta_path.insert(0, _TreeFinder(tree, names))
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))
    os.chdir(folder)  # NeMo-Gym starts the server in its folder: relative data paths resolve there
    os.environ[FOLDER_TREE_ENV] = str(tree)  # ... else in its tree (NeMo-Gym's PARENT_DIR): nemo_gym_paths
    folder_ray.install(folder)  # the folder's Ray tasks run in workers that enter the same tree
    paths = sys.modules.get("gymfleet.serving.nemo_gym_paths")
    if paths is not None and paths.PARENT_DIR != tree:  # imported already (a server forked from the zygote)
        _follow(paths.PARENT_DIR, tree)


def enter_tree_in_ray_worker() -> None:
    """Ray's worker setup hook (`gymfleet.fleet.folder_ray`): enter the tree of the folder whose process started the
    job, so the folder's remote functions import in the worker as in that process."""
    folder = os.environ.get(folder_ray.RAY_FOLDER_ENV)
    if folder:
        import gymfleet.serving.nemo_gym_server  # noqa: F401 - built before the tree's packages (folder_pytest says why)

        enter_tree(Path(folder))


PATH_COPIES = ("gymfleet.serving.nemo_gym_paths", "gymfleet.serving.nemo_gym_types", "nemo_gym")
"""The modules holding `PARENT_DIR` and `CACHE_DIR` as values (`nemo_gym_paths` and the two that import them from
it), which `enter_tree` repoints. Named rather than searched for: reading every module of a forked server copies
about 7 MiB of the zygote's pages into it (their reference counts), measured."""


def _follow(old: Path, tree: Path) -> None:
    """Point `PARENT_DIR` and `CACHE_DIR` at `tree` in the modules of `PATH_COPIES` already imported, so a server
    forked from the zygote, which imported the surface before the folder's tree was known, reads the tree as a fresh
    interpreter would."""
    values = {"PARENT_DIR": (old, tree), "CACHE_DIR": (old / "cache", tree / "cache")}
    for name in PATH_COPIES:
        module = sys.modules.get(name)
        for attribute, (before, after) in values.items():
            if module is not None and getattr(module, attribute, None) == before:
                setattr(module, attribute, after)


def module_name(folder: Path, entrypoint: str) -> str:
    """The dotted name the entrypoint has in its tree (`resources_servers.mcqa.app`), so an import of that name
    elsewhere in the folder finds the same module rather than a second copy."""
    folder = Path(folder).resolve()
    parts = [folder.parent.name, folder.name, *Path(entrypoint).with_suffix("").parts]
    return ".".join(parts) if all(part.isidentifier() for part in parts) else f"gymfleet_folder_{folder.name}"
