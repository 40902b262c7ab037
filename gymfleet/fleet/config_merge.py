"""The mechanics behind `gymfleet.fleet.config`: building the merged, still unresolved config tree, and reporting on
it.

Parsing Hydra-style CLI overrides into a nested dict, finding and loading YAML files (with their own `config_paths`
includes), merging with OmegaConf, applying the NeMo-Gym directives `_inherit_from`, `_copy` and `_delete_key`,
finding `???` values and masking secrets (`gymfleet.fleet.config_checks` turns pydantic errors into YAML-path
messages). Trees are plain dicts
whose `${...}` interpolations are kept as text; `gymfleet.fleet.config` resolves them once, after ports are assigned.
"""

from __future__ import annotations

import copy
import difflib
import functools
import logging
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gymfleet.errors import ConfigError, did_you_mean

if typing.TYPE_CHECKING:
    from omegaconf.errors import OmegaConfBaseException

# omegaconf is imported by the functions that merge, load and resolve, not here: a server (forked by the zygote or a
# fresh `python -m gymfleet.fleet.launch`) imports this module through `config_checks`, reads a resolved JSON
# config and never needs omegaconf (~70 ms of import on the zygote's path to its first fork).

logger = logging.getLogger(__name__)

MISSING = "???"
OVERRIDE_FORMS = (
    "Use +key=value to add a key, ++key=value to force-set it, dotted keys for nesting "
    "(+policy_model.responses_api_models.vllm_model.port=8000), brackets for lists "
    "(+config_paths=[a.yaml,b.yaml]) and quotes around values with special characters (+key='a,b')."
)
# A whole value of the form `${inherit_from:a.b}` or `${copy:a.b}`; embedded in a longer string it is an error.
_DIRECTIVE_STRING = re.compile(r"^\$\{\s*(inherit_from|copy)\s*:\s*([^}]+?)\s*\}$")
# `a.b[1].c` -> ("a", None), ("b", None), (None, "1"), ("c", None)
_FULL_KEY_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def join_path(prefix: str, key: object) -> str:
    """Dotted YAML path of `key` under `prefix` (`a.b` + `c` -> `a.b.c`, `a.b` + 0 -> `a.b[0]`)."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else str(key)


def get_at(data: Any, full_key: str | None) -> Any:
    """The value at an OmegaConf-style full key (`a.b[1].c`), or None if there is none."""
    node = data
    for key, index in _FULL_KEY_PART.findall(full_key or ""):
        try:
            node = node[int(index)] if index else node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


# ---------------------------------------------------------------------------------------------- CLI overrides


@functools.cache
def _overrides_parser() -> Any:
    """Hydra's override parser, imported on first use: only CLI commands parse overrides, and Hydra's import costs
    ~0.3 CPU s in each of the fleet's server processes, which read a resolved config instead."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_overrides(tokens: list[str]) -> dict:
    """Parse Hydra override tokens (`+a.b=1`, `++c=[x,y]`, `d='e f'`) into a nested dict.

    The base config is empty, so plain `key=value` is accepted and means the same as `+key=value`; a later token
    for the same key wins.

    Raises:
        ConfigError: a token that is not a valid override, or one using Hydra features a config dict cannot hold
            (deletion `~key`, sweeps `a=1,2`, packages `key@pkg`).
    """
    from hydra.errors import HydraException

    result: dict = {}
    for token in tokens:
        try:
            override = _overrides_parser().parse_override(token)
        except HydraException as e:
            reason = str(e).splitlines()[0]
            raise ConfigError(f"malformed override {token!r}: {reason}.", hint=OVERRIDE_FORMS) from None
        if override.is_delete():
            raise ConfigError(
                f"override {token!r}: deleting keys from the command line is not supported.",
                hint="Set the key to null (++key=null) or list it in a `_delete_key` directive in YAML.",
            )
        if override.is_sweep_override():
            raise ConfigError(f"override {token!r}: sweeps (a=1,2) are not supported.", hint=OVERRIDE_FORMS)
        if override.package is not None:
            raise ConfigError(f"override {token!r}: packages (key@pkg) are not supported.", hint=OVERRIDE_FORMS)
        key = override.key_or_group
        if key == "hydra" or key.startswith("hydra."):
            logger.debug("ignoring Hydra runtime override %r", token)
            continue
        node = result
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = override.value()
    return result


# ---------------------------------------------------------------------------------------------- merging


def to_plain(value: Any, what: str = "config") -> dict:
    """A plain dict from a dict or DictConfig (None -> {}), interpolations kept as text."""
    if value is None:
        return {}
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        if isinstance(value, Mapping) and not isinstance(value, DictConfig):
            value = OmegaConf.create(dict(value))
        if not isinstance(value, DictConfig):
            raise ConfigError(f"{what} must be a mapping, got {type(value).__name__}.")
        return OmegaConf.to_container(value, resolve=False)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{what}: {str(e).splitlines()[0]}") from None


def merge(*configs: dict, what: str = "config") -> dict:
    """Merge plain dicts with OmegaConf semantics: later wins, dicts merge deeply, lists are replaced."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.merge(*(OmegaConf.create(c) for c in configs))
        return OmegaConf.to_container(merged, resolve=False)
    except OmegaConfBaseException as e:
        raise ConfigError(
            f"cannot merge {what}: {str(e).splitlines()[0]}", path=getattr(e, "full_key", None)
        ) from None


# ---------------------------------------------------------------------------------------------- files


def load_yaml(path: Path) -> dict:
    """Load one YAML file as a plain dict (an empty file is `{}`).

    Raises:
        ConfigError: the file cannot be read or parsed, holds a list at top level, or has a key that YAML reads
            as something other than a string (see `check_yaml_keys`).
    """
    from omegaconf import ListConfig, OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        text = Path(path).read_text()
        check_yaml_keys(text, path)
        loaded = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except (OSError, UnicodeDecodeError, yaml.YAMLError, OmegaConfBaseException) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    if isinstance(loaded, ListConfig):
        raise ConfigError(f"config file {path} must hold a mapping at top level, not a list.")
    return OmegaConf.to_container(loaded, resolve=False)


_STR_TAG = "tag:yaml.org,2002:str"
FAST_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def check_yaml_keys(text: str, path: Path | str) -> None:
    """Refuse mapping keys that YAML does not read as strings, naming the file, line and the fix.

    YAML 1.1 (PyYAML, and so OmegaConf and Hydra) reads unquoted `on`, `off`, `yes`, `no`, `y`, `n`, `true`,
    `false` and `null` as booleans or null, and `1`, `1.5` as numbers: a key written `on:` arrives as `True`, and
    becomes `"true"` on the way to a server. No gymfleet or NeMo-Gym config uses such keys, so each is an error.

    Raises:
        ConfigError: `<file>:<line>:<column>: key 'on' is read by YAML 1.1 as the boolean True ...`.
    """
    try:
        try:  # libyaml's parser where PyYAML has it: the same nodes, tags and marks, a tenth of the CPU
            root = yaml.compose(text, Loader=FAST_SAFE_LOADER)
        except yaml.YAMLError:
            root = yaml.compose(text, Loader=yaml.SafeLoader)  # raises PyYAML's own message for the error
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse config file {path}: {e}") from None
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag not in (_STR_TAG, _MERGE_TAG):
                    kind = key.tag.rsplit(":", 1)[-1]
                    mark = key.start_mark
                    raise ConfigError(
                        f"{path}:{mark.line + 1}:{mark.column + 1}: key {key.value!r} is read by YAML 1.1 as a "
                        f"{kind} ({yaml.safe_load(key.value)!r}), not the string {key.value!r}.",
                        hint=f"Quote it ('{key.value}': ...) or use another key name.",
                    )
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _path_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ConfigError(
        f"{where} must be a list of YAML file paths, got {value!r}.",
        path="config_paths",
        hint="Example: +config_paths=[responses_api_models/vllm_model/configs/vllm_model.yaml,my_env.yaml]",
    )


def _suggest_path(rel: Path, roots: list[Path]) -> str:
    """Did-you-mean for the first path component that does not exist under any root."""
    for root in roots:
        here = root
        for i, part in enumerate(rel.parts):
            if (here / part).exists():
                here = here / part
                continue
            if here.is_dir():
                match = difflib.get_close_matches(part, [c.name for c in here.iterdir()], n=1)
                if match:
                    return f" Did you mean {str(Path(*rel.parts[:i], match[0], *rel.parts[i + 1 :]))!r}?"
            break
    return ""


def find_config_file(value: str, roots: list[Path], listed_in: str, included_from: Path | None = None) -> Path:
    """Resolve a `config_paths` entry: absolute as is, else against each root in order (then the including dir)."""
    rel = Path(value).expanduser()
    tried = [rel] if rel.is_absolute() else [root / rel for root in roots]
    if included_from is not None and not rel.is_absolute():
        tried.append(included_from.parent / rel)
    for candidate in dict.fromkeys(tried):
        if candidate.is_file():
            return candidate.resolve()
    search_roots = [] if rel.is_absolute() else [*roots, *([included_from.parent] if included_from else [])]
    missing_env = _missing_environment(rel, search_roots)
    if missing_env:
        raise ConfigError(
            f"config file {value!r} (listed in {listed_in}) names {missing_env}",
            path="config_paths",
            hint="Drop the entry, or build the environment first (ng_init_resources_server).",
        )
    raise ConfigError(
        f"config file {value!r} (listed in {listed_in}) not found; tried: {', '.join(map(str, dict.fromkeys(tried)))}."
        + _suggest_path(rel, search_roots),
        path="config_paths",
        hint="Paths are relative to the working directory or the repository root; fix the path or drop the entry.",
    )


def _missing_environment(rel: Path, roots: list[Path]) -> str:
    """For `resources_servers/<env>/...` when no root has that environment: which, and the ones that exist."""
    if len(rel.parts) < 3 or rel.parts[0] != "resources_servers":
        return ""
    folders = [root / "resources_servers" for root in roots if (root / "resources_servers").is_dir()]
    if not folders or any((folder / rel.parts[1]).is_dir() for folder in folders):
        return ""
    built = sorted({child.name for folder in folders for child in folder.iterdir()
                    if child.is_dir() and (child / "configs").is_dir()})
    return (f"environment {rel.parts[1]!r}, which is not built here (no resources_servers/{rel.parts[1]}/)."
            f"{did_you_mean(rel.parts[1], built)} Environments that exist: {', '.join(built)}.")


def load_config_files(paths: Any, roots: list[Path]) -> list[tuple[Path, dict, frozenset[Path]]]:
    """Load the files named by `config_paths` and their includes, flattened post-order.

    An including file comes after (so overrides) what it includes, later siblings come after earlier ones, and a
    file reached twice is loaded once, at its first position (an environment's config may include the servers it
    needs, e.g. code_gen.yaml includes sandbox.yaml, and a recipe may list both). Each file's own `config_paths`
    key is removed. Each entry is `(path, data, includers)`: `includers` are the files that include it, directly
    or not, whatever the route (they may override it; see `gymfleet.fleet.config.check_definitions`).
    """
    loaded: dict[Path, dict] = {}  # insertion order is the post-order
    parents: dict[Path, set[Path]] = {}
    started: set[Path] = set()

    def visit(value: str, listed_in: str, included_from: Path | None, chain: tuple[Path, ...]) -> None:
        path = find_config_file(value, roots, listed_in, included_from)
        if path in chain:
            raise ConfigError(
                f"config file {path} includes itself: {' -> '.join(map(str, (*chain, path)))}.",
                path="config_paths",
                hint="Remove the entry that closes the loop from one of those files' config_paths.",
            )
        parents.setdefault(path, set()).update(chain[-1:])
        if path in started:
            logger.debug("config file %s is listed more than once; loading it once", path)
            return
        started.add(path)
        data = load_yaml(path)
        for include in _path_list(data.pop("config_paths", None), f"config_paths in {path}"):
            visit(include, str(path), path, (*chain, path))
        loaded[path] = data

    for value in _path_list(paths, "config_paths"):
        visit(value, "config_paths", None, ())

    def ancestors(path: Path) -> frozenset[Path]:
        found: set[Path] = set()
        todo = list(parents.get(path, ()))
        while todo:
            parent = todo.pop()
            if parent not in found:
                found.add(parent)
                todo.extend(parents.get(parent, ()))
        return frozenset(found)

    return [(path, data, ancestors(path)) for path, data in loaded.items()]


def load_env_yaml(dotenv_path: Path | None, roots: list[Path]) -> dict:
    """`dotenv_path` if given (a missing file is fine), else the first `env.yaml` under `roots`, else `{}`."""
    if dotenv_path is not None:
        path = Path(dotenv_path)
        return load_yaml(path) if path.is_file() else {}
    for root in roots:
        if (root / "env.yaml").is_file():
            return load_yaml(root / "env.yaml")
    return {}


def resolved_config_paths(top: dict) -> Any:
    """`top["config_paths"]`, with interpolations in it resolved against `top`."""
    value = top.get("config_paths")
    if not isinstance(value, str | list) or "${" not in str(value):
        return value
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(top).config_paths, resolve=True)
    except OmegaConfBaseException as e:
        raise interpolation_error(e, top) from None


# ---------------------------------------------------------------------------------------------- resolution


def resolve(raw: dict) -> dict:
    """Resolve every interpolation; a failure names the YAML path and the interpolation text."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(OmegaConf.create(raw), resolve=True)
    except OmegaConfBaseException as e:
        raise interpolation_error(e, raw) from None


def interpolation_error(e: OmegaConfBaseException, raw: dict) -> ConfigError:
    """A ConfigError for an OmegaConf resolution failure, quoting the raw text at the failing key."""
    full_key = getattr(e, "full_key", None) or None
    text = get_at(raw, full_key)
    reason = str(e).splitlines()[0]
    return ConfigError(
        f"{full_key}: cannot resolve {text!r}: {reason}",
        path=full_key,
        hint="Define the referenced key (e.g. ++key=value), export the environment variable, or give a default: "
        "${oc.env:VAR,default}.",
    )


# ---------------------------------------------------------------------------------------------- directives


def _locate(root: dict, src: str, at: str) -> tuple[dict, str]:
    node: Any = root
    parts = src.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            known = list(node) if isinstance(node, dict) else []
            raise ConfigError(
                f"{at}: source {src!r} does not exist (no key {'.'.join(parts[: i + 1])!r})."
                + did_you_mean(part, known),
                path=at,
                hint="Sources are absolute dotted paths from the top of the config, e.g. _copy: policy_model",
            )
        if i < len(parts) - 1:
            node = node[part]
    return node, parts[-1]


def _split_keys(value: Any, at: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [k.strip() for k in value.split(",") if k.strip()]
    if isinstance(value, list):
        return [str(k) for k in value]
    raise ConfigError(f"{join_path(at, '_delete_key')}: expected 'k1,k2' or a list of keys, got {value!r}.", path=at)


def apply_directives(data: dict) -> dict:
    """Apply `_inherit_from` / `${inherit_from:..}` (move), `_copy` / `${copy:..}` (copy) and `_delete_key`.

    `{_copy: a.b, ...overrides}` becomes the subtree at `a.b` with the overrides merged on top; `_inherit_from`
    does the same and removes `a.b`. A source is processed before it is copied, so chains work; cycles are errors.
    `{_delete_key: "k1,k2"}` removes those keys from the mapping that holds it, after any merge.
    """
    root = copy.deepcopy(data)

    def source(src: str, at: str, stack: tuple[str, ...], move: bool) -> Any:
        if any(p == src or p.startswith((src + ".", src + "[")) for p in (*stack, at)):
            raise ConfigError(f"{at}: directive source {src!r} is this key, one of its parents or a cycle.", path=at)
        parent, key = _locate(root, src, at)
        parent[key] = visit(parent[key], src, (*stack, at))
        value = copy.deepcopy(parent[key])
        if move:
            del parent[key]
        return value

    def visit(node: Any, at: str, stack: tuple[str, ...]) -> Any:
        if isinstance(node, str):
            match = _DIRECTIVE_STRING.match(node)
            return source(match[2], at, stack, match[1] == "inherit_from") if match else node
        if isinstance(node, list):
            return [visit(item, join_path(at, i), stack) for i, item in enumerate(node)]
        if not isinstance(node, dict):
            return node
        kinds = [k for k in ("_inherit_from", "_copy") if k in node]
        if len(kinds) > 1:
            raise ConfigError(f"{at}: use either _inherit_from or _copy, not both.", path=at)
        if kinds:
            src = str(node.pop(kinds[0]))
            base = source(src, at, stack, kinds[0] == "_inherit_from")
            if not isinstance(base, dict):
                raise ConfigError(f"{at}: {kinds[0]} source {src!r} must be a mapping, got {base!r}.", path=at)
            node = merge(base, node, what=at)
        deletes = _split_keys(node.pop("_delete_key", None), at)
        for key in list(node):
            if key in node:  # a sibling's _inherit_from may have moved it away
                node[key] = visit(node[key], join_path(at, key), stack)
        for key in deletes:
            node.pop(key, None)
        return node

    return visit(root, "", ())


def find_missing(node: Any, at: str = "") -> list[str]:
    """Dotted paths of every value still equal to `???`."""
    if isinstance(node, str):
        return [at] if node == MISSING else []
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [path for key, value in items for path in find_missing(value, join_path(at, key))]
