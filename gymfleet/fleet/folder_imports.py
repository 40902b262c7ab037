"""What a NeMo-Gym folder imports from NeMo-Gym's own dependencies without listing it.

A folder's venv under NeMo-Gym is made from its `requirements.txt`, whose `-e nemo-gym[dev] @ ../../` line brings
NeMo-Gym's own dependencies (its wheel's `Requires-Dist` and what those require): a folder can import `pandas` (which
`datasets` and `mlflow` pull in) without listing it, and workplace_assistant does. gymfleet stands in for that line
with its own, smaller, stack (gymfleet does not depend on pandas), so such an import would fail at start with a bare
`ModuleNotFoundError`. `implied_requirements(folder)` finds them: the modules the folder's server imports when it
starts (module-level imports of its entrypoint, followed through the folder's own modules; an import guarded by
`try`, or inside a function, is not needed to start) and, with `tests=True`, its `tests/` too, that are not
importable here and that NeMo-Gym 0.7.0's dependencies provide (`NEMO_GYM_PROVIDES`). `gymfleet.fleet.folder_env`
counts each as a requirement of the folder that is missing here, so the folder's requirements policy applies: ng_run
stops with one line naming the package, the folder's file that imports it and the fix (`check`), installs it
(`install`) or gives the folder an environment of its own with it (`venv`).
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

NEMO_GYM_PROVIDES = {
    # import name: the requirement NeMo-Gym 0.7.0 brings it with (its own specifier where it names the package
    # itself, else the bare name of a package its dependencies require). The closure of its wheel's Requires-Dist
    # (`uv pip compile`, Python 3.11) less what gymfleet's own dependencies already bring. `scipy` is a direct
    # Requires-Dist of NeMo-Gym's that gymfleet's stack does not bring (a fresh `.[test]` environment has none).
    "aiohttp_cors": "aiohttp-cors", "alembic": "alembic", "anthropic": "anthropic<=0.109.2",
    "cachetools": "cachetools", "colorful": "colorful", "databricks": "databricks-sdk", "datasets": "datasets",
    "devtools": "devtools", "dill": "dill", "distlib": "distlib", "distro": "distro",
    "docstring_parser": "docstring-parser", "fsspec": "fsspec", "git": "GitPython>=3.1.61", "gitdb": "gitdb",
    "graphene": "graphene", "graphql_relay": "graphql-relay", "grpc": "grpcio", "gunicorn": "gunicorn",
    "huey": "huey", "huggingface_hub": "huggingface-hub", "importlib_metadata": "importlib-metadata",
    "mako": "mako", "mlflow": "mlflow>=3.16.1", "multiprocess": "multiprocess", "narwhals": "narwhals",
    "opencensus": "opencensus", "opentelemetry": "opentelemetry-sdk", "pandas": "pandas",
    "platformdirs": "platformdirs", "prettytable": "prettytable", "proto": "proto-plus", "pyarrow": "pyarrow>=23.0.1",
    "pyasn1_modules": "pyasn1-modules", "pydot": "pydot", "scipy": "scipy>=1.14.1", "sklearn": "scikit-learn",
    "skops": "skops",
    "smart_open": "smart-open", "smmap": "smmap", "sqlalchemy": "sqlalchemy", "sqlparse": "sqlparse>=0.6.0",
    "threadpoolctl": "threadpoolctl", "virtualenv": "virtualenv", "wandb": "wandb>=0.30.0", "xxhash": "xxhash",
    "yappi": "yappi>=1.7.6", "zipp": "zipp",
}


def implied_requirements(folder: Path, entrypoint: str = "app.py", tests: bool = False) -> dict[str, str]:
    """`{requirement: "<file>:<line>"}` for what the folder imports from NeMo-Gym's dependencies (module docstring)
    that this environment cannot import, each with the first place that imports it."""
    folder = Path(folder)
    starts = [folder / entrypoint]
    if tests and (folder / "tests").is_dir():
        starts += sorted((folder / "tests").rglob("*.py"))
    found: dict[str, str] = {}
    seen: set[Path] = set()
    todo = [path for path in starts if path.is_file()]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        for name, line in _module_level_imports(path):
            local = _local_module(folder, name)
            if local is not None:
                todo.append(local)
                continue
            top = name.partition(".")[0]
            requirement = NEMO_GYM_PROVIDES.get(top)
            if requirement and requirement not in found and not _importable(top):
                found[requirement] = f"{path.relative_to(folder)}:{line}"
    return found


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _local_module(folder: Path, name: str) -> Path | None:
    """The folder's own file that module `name` is (`util`, `resources_servers.<folder>.util`, a package), if any."""
    parts = name.split(".")
    if parts[:2] == [folder.parent.name, folder.name]:
        parts = parts[2:]
    if not parts or parts[0] in sys.stdlib_module_names:
        return None
    base = folder.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_level_imports(path: Path) -> list[tuple[str, int]]:
    """The absolute imports `path` runs when imported: its module body's, and those under a module-level `if` (not
    `if TYPE_CHECKING:`), `with` or `else`; not those in a `try` (guarded: optional) or in a function or class."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError:
        log.warning("%s does not parse; its imports are not looked at", path)
        return []
    found: list[tuple[str, int]] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            body += node.body + node.orelse
        elif isinstance(node, ast.With):
            body += node.body
    return found
