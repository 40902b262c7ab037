"""gymfleet/ is grouped by role, and the groups are layered: a module imports only from its own group or lower ones.

From the bottom: the root modules (errors, http, replicas, metrics, wire, progress, masking: what every part uses),
`grading/` (the environment author's toolkit), `serving/` (what every server is made of), `fleet/` (running a fleet),
`rollouts/` (working with rollouts), `testing/`, `cli/`. Function-level imports count too, and no two modules import
each other, however indirectly.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gymfleet"
LAYERS = ["root", "grading", "serving", "fleet", "rollouts", "testing", "cli"]
ROOT_MODULES = {"__init__", "auth", "connections", "errors", "http", "http_types", "replicas", "metrics", "wire",
                "openai_items", "progress", "masking"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "root"


def _modules() -> dict[str, Path]:
    """Every gymfleet module -> its file."""
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


@functools.cache
def _imports() -> dict[str, set[str]]:
    """Every gymfleet module -> the gymfleet modules it imports (at any depth of its code). Parsed on first use, not
    at collection: every xdist worker collects this file, one runs it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gymfleet":
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "gymfleet")
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def test_root_holds_only_the_shared_basics():
    root = {path.stem for path in PACKAGE.glob("*.py")}
    assert root <= ROOT_MODULES, f"new root module(s) {sorted(root - ROOT_MODULES)}: put them in a group"
    groups = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert groups == set(LAYERS) - {"root"}


def test_no_module_imports_a_higher_layer():
    upward = [f"{module} ({_layer(module)}) imports {target} ({_layer(target)})"
              for module, targets in _imports().items() for target in targets
              if LAYERS.index(_layer(target)) > LAYERS.index(_layer(module))]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_no_import_circle(module):
    graph = _imports()
    seen, stack = set(), [(target, (module, target)) for target in graph[module]]
    while stack:
        current, path = stack.pop()
        assert current != module, "import circle: " + " -> ".join(path)
        if current not in seen:
            seen.add(current)
            stack.extend((target, (*path, target)) for target in graph[current])
