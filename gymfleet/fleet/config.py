"""The NeMo-Gym-compatible global config: one dict that names every server instance and how they connect.

Sources, lowest precedence first: the YAML files listed in `config_paths` (includes flattened post-order), then
`env.yaml`, then `initial_global_config_dict` (what NeMo-RL passes), then CLI overrides in Hydra syntax
(`+config_paths=[a.yaml,b.yaml] +policy_model_name=qwen`). After the merge, the directives `_inherit_from`, `_copy`
and `_delete_key` are applied, every server instance gets a host and a free port, and all `${...}` interpolations are
resolved, so `GlobalConfig.data` is the final plain dict every server process and client sees.

The pieces: this module parses and merges the sources (the mechanics are `gymfleet.fleet.config_merge`); the
resolved config and its server instances are `gymfleet.fleet.config_instances`; checking instances, references
between servers and a server's fields is `gymfleet.fleet.config_checks`.
"""

from __future__ import annotations

import logging
import random
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gymfleet.errors import ConfigError, did_you_mean
from gymfleet.fleet import ports
from gymfleet.fleet.config_checks import _validate_instance
from gymfleet.fleet.config_instances import (
    CLI_SOURCE,
    HEAD_SERVER_KEY_NAME,
    SERVER_FOLDERS,
    SERVER_TYPES,
    GlobalConfig,
    ServerInstance,
    _discover_instances,
    client_limits,
    repository_root,
    set_folders,
)
from gymfleet.fleet.config_merge import (
    apply_directives,
    find_missing,
    interpolation_error,
    join_path,
    load_config_files,
    load_env_yaml,
    merge,
    parse_overrides,
    resolve,
    resolved_config_paths,
    to_plain,
)
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY, named_folders, server_folders

__all__ = [
    "PLACEMENTS",
    "GlobalConfigDictParserConfig",
    "client_limits",
    "find_free_port",
    "parse_global_config",
    "parse_overrides",
]

logger = logging.getLogger(__name__)

PLACEMENTS = ("local", "ray")
"""Values of the top-level `placement` key: every server on this machine, or on a Ray cluster's nodes."""
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HEAD_PORT = 11000
DEFAULT_PORT_RANGE = (10001, 20000)


@dataclass
class GlobalConfigDictParserConfig:
    """How to build the global config; NeMo-RL constructs this with the first three fields."""

    dotenv_path: Path | None = None
    initial_global_config_dict: dict | DictConfig | None = None
    skip_load_from_cli: bool = False
    skip_load_from_dotenv: bool = False
    hide_secrets: bool = False
    offline: bool = False
    cli_args: list[str] | None = None
    """Override tokens to parse; None means `sys.argv[1:]`."""

    NO_MODEL_GLOBAL_CONFIG_DICT: ClassVar[DictConfig] = DictConfig({
        "policy_base_url": "", "policy_api_key": "", "policy_model_name": "",
        "policy_model": {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}},
    })
    """NeMo-Gym's base for configs parsed without a policy model (folders' test fixtures merge it under theirs)."""


# ---------------------------------------------------------------------------------------------- parsing


def parse_global_config(
    parser_config: GlobalConfigDictParserConfig | None = None,
    *,
    assign_ports: bool = True,
    root: Path | None = None,
) -> GlobalConfig:
    """Build the global config from files, `env.yaml`, the initial dict and CLI overrides (see module docstring).

    Args:
        parser_config: the sources to read; defaults read `sys.argv[1:]` and the first `env.yaml` found.
        assign_ports: give every instance without a `port` a free one; off (ports stay null) for commands that
            start no servers.
        root: the repository root to resolve relative paths against (default: `repository_root()`).

    Raises:
        ConfigError: any problem, named by its dotted YAML path (and file) with a hint on how to fix it.
    """
    pc = parser_config or GlobalConfigDictParserConfig()
    root = Path(root) if root is not None else repository_root()
    roots = list(dict.fromkeys([Path.cwd(), root]))

    tokens = [] if pc.skip_load_from_cli else list(sys.argv[1:] if pc.cli_args is None else pc.cli_args)
    cli = parse_overrides(tokens)
    initial = to_plain(pc.initial_global_config_dict, "initial_global_config_dict")
    env = {} if pc.skip_load_from_dotenv else load_env_yaml(pc.dotenv_path, roots)
    top = merge(env, initial, cli, what="env.yaml, initial_global_config_dict and CLI overrides")
    files = load_config_files(resolved_config_paths(top), roots)
    check_definitions(files)
    raw = merge(*(data for _, data, _ in files), env, initial, cli, what="config files")
    folders = server_folders(((path, data) for path, data, _ in files), root, _definition, SERVER_FOLDERS)
    folders.update(named_folders(raw.get(SERVER_FOLDERS_KEY)))  # `+server_folders.<instance>=<folder>` wins
    if folders:
        raw[SERVER_FOLDERS_KEY] = folders
    sources = [*((str(path), data) for path, data, _ in files), ("env.yaml", env)]
    sources += [("initial_global_config_dict", initial), (CLI_SOURCE, cli)]
    origins = {key: [label for label, data in sources if key in data] for key in raw}
    try:
        data, instances = _build(raw, assign_ports, root)
    except ConfigError as e:
        located = _with_origin(e, origins)
        if located is e:
            raise
        raise located from None
    return GlobalConfig(data=data, instances=instances, hide_secrets=pc.hide_secrets, origins=origins,
                        referenced=_referenced_keys(raw))


_INTERPOLATED_KEY = re.compile(r"\$\{\s*([A-Za-z_][\w-]*)\s*(?=[.\[}])")


def _referenced_keys(raw: Any) -> frozenset[str]:
    """Top-level keys named by `${key...}` interpolations anywhere in `raw` (resolvers like `${oc.env:X}` aside)."""
    found: set[str] = set()
    stack = [raw]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, str) and "${" in node:
            found.update(_INTERPOLATED_KEY.findall(node))
    return frozenset(found)


def _definition(block: Any) -> tuple[str, str] | None:
    """(server type, impl) when `block` is a full instance definition (`{type: {impl: {entrypoint: ...}}}`)."""
    if not isinstance(block, dict) or len(block) != 1:
        return None
    server_type, impls = next(iter(block.items()))
    if server_type not in SERVER_TYPES or not isinstance(impls, dict) or len(impls) != 1:
        return None
    impl, fields = next(iter(impls.items()))
    return (server_type, impl) if isinstance(fields, dict) and "entrypoint" in fields else None


def _leaves(node: Any, at: str) -> dict[str, Any]:
    if isinstance(node, dict) and node:
        return {path: v for key, value in node.items() for path, v in _leaves(value, join_path(at, key)).items()}
    return {at: node}


def check_definitions(files: list[tuple[Path, dict, frozenset[Path]]]) -> None:
    """Config files may define the same server instance only identically; a changed value is never silent.

    An environment's config brings what it needs (code_gen.yaml includes sandbox.yaml), so a recipe that lists
    both files holds two definitions of `sandbox`: identical ones merge. Two *different* definitions of one instance
    are an error naming both files, unless one file includes the other (an including file overrides what it
    includes on purpose, like a recipe tuning an environment). A file that changes a value another file set,
    without including it, is logged as a warning naming both.

    Raises:
        ConfigError: an instance defined differently in two files, naming the first differing field and both files.
    """
    definitions: dict[str, tuple[Path, dict]] = {}
    values: dict[str, tuple[Path, Any]] = {}
    for path, data, _ in files:
        for name, block in data.items():
            earlier = definitions.get(name)
            if _definition(block) is not None and earlier is not None and earlier[1] != block:
                if path not in _includers(files, earlier[0]):
                    _raise_conflict(name, earlier, (path, block))
            if _definition(block) is not None and earlier is None:
                definitions[name] = (path, block)
            for leaf, value in _leaves(block, name).items():
                before = values.get(leaf)
                if before is not None and before[1] != value and path not in _includers(files, before[0]):
                    logger.warning("%s: %r from %s replaces %r from %s", leaf, value, path, before[1], before[0])
                values[leaf] = (path, value)


def _includers(files: list[tuple[Path, dict, frozenset[Path]]], path: Path) -> frozenset[Path]:
    return next((found for file, _, found in files if file == path), frozenset())


def _raise_conflict(name: str, first: tuple[Path, dict], second: tuple[Path, dict]) -> None:
    (path1, block1), (path2, block2) = first, second
    leaves1, leaves2 = _leaves(block1, name), _leaves(block2, name)
    differing = [leaf for leaf in dict.fromkeys([*leaves1, *leaves2]) if leaves1.get(leaf) != leaves2.get(leaf)]
    leaf = differing[0]
    raise ConfigError(
        f"server instance {name!r} is defined differently in {path1} and {path2}: {leaf} is "
        f"{leaves1.get(leaf, '(absent)')!r} in the first, {leaves2.get(leaf, '(absent)')!r} in the second"
        + (f" ({len(differing) - 1} more differences)." if len(differing) > 1 else "."),
        path=leaf,
        hint=f"Keep one definition of {name!r} (list one of the files), rename one instance, or change single "
        f"fields with ++{leaf}=<value> on the command line, in env.yaml, or in a file whose config_paths "
        "lists the other.",
    )


def _build(raw: dict, assign_ports: bool, root: Path) -> tuple[dict, dict[str, ServerInstance]]:
    """Directives, `???` check, instance discovery, hosts and ports, resolution and validation."""
    raw = apply_directives(raw)
    missing = find_missing(raw)
    if missing:
        raise ConfigError(
            "missing values (???) at: " + ", ".join(missing),
            path=missing[0],
            hint="Set them on the command line: " + " ".join(f"++{path}=<value>" for path in missing),
        )
    found = _discover_instances(raw, strict=raw.get("error_on_almost_servers", True) is not False)
    _check_placement(raw.get("placement"))
    _fill_hosts_and_ports(raw, found, assign_ports)
    data = resolve(raw)
    instances = {
        name: ServerInstance(name, server_type, impl, data[name][server_type][impl], root)
        for name, (server_type, impl) in found.items()
    }
    set_folders(instances, data)
    for inst in instances.values():
        _validate_instance(inst, instances)
    return data, instances


def _check_placement(value: Any) -> None:
    """`placement` is unset, `local` or `ray` (whether Ray can serve it is checked when the fleet starts)."""
    if value is not None and value not in PLACEMENTS:
        raise ConfigError(
            f"placement: unknown value {value!r}; choices: {', '.join(PLACEMENTS)}."
            + did_you_mean(str(value), PLACEMENTS),
            path="placement",
            hint="Use +placement=local (every server on this machine) or +placement=ray (on the Ray cluster's nodes, "
            "see ray_head_node_address); leave it out to choose ray exactly when ray_head_node_address is set.",
        )


def _with_origin(error: ConfigError, origins: dict[str, list[str]]) -> ConfigError:
    """The same error, with the sources that define its top-level key appended to the message."""
    labels = origins.get(re.split(r"[.\[]", error.path or "", maxsplit=1)[0])
    if not labels:
        return error
    return type(error)(f"{error.message} (set in {', '.join(labels)})", path=error.path, hint=error.hint)


def _fill_hosts_and_ports(raw: dict, found: dict[str, tuple[str, str]], assign_ports: bool) -> None:
    """Give the head server and every instance a host and (if `assign_ports`) a port; write `disallowed_ports`."""
    cfg = OmegaConf.create(raw)  # snapshot for resolving scalars that are themselves interpolations

    def scalar(path: str, default: Any = None) -> Any:
        try:
            value = OmegaConf.select(cfg, path, throw_on_resolution_failure=True)
        except OmegaConfBaseException as e:
            raise interpolation_error(e, raw) from None
        return default if value is None else value

    def port_of(path: str) -> int:
        value = scalar(path)
        if isinstance(value, bool) or not str(value).isdigit() or not 0 < int(value) < 65536:
            raise ConfigError(f"{path}: port must be an integer in 1..65535, got {value!r}.", path=path)
        return int(value)

    default_host = scalar("default_host")
    if default_host is None and scalar("use_absolute_ip", False):
        default_host = socket.gethostbyname(socket.gethostname())
    default_host = default_host or DEFAULT_HOST
    low, high = (
        int(scalar("port_range_low", DEFAULT_PORT_RANGE[0])),
        int(scalar("port_range_high", DEFAULT_PORT_RANGE[1])),
    )
    if raw.get(HEAD_SERVER_KEY_NAME) is None:
        raw[HEAD_SERVER_KEY_NAME] = {}
    head = raw[HEAD_SERVER_KEY_NAME]
    if not isinstance(head, dict):
        raise ConfigError(f"head_server must be a mapping {{host, port}}, got {head!r}.", path=HEAD_SERVER_KEY_NAME)
    head["host"] = scalar("head_server.host", default_host)
    head["port"] = port_of("head_server.port") if head.get("port") is not None else DEFAULT_HEAD_PORT
    used = [int(p) for p in scalar("disallowed_ports", [])] + [head["port"]]

    blocks = {name: (f"{name}.{t}.{impl}", raw[name][t][impl]) for name, (t, impl) in found.items()}
    owners: dict[tuple[str, int], str] = {(head["host"], head["port"]): HEAD_SERVER_KEY_NAME}
    for name, (path, fields) in blocks.items():
        fields["host"] = scalar(f"{path}.host", default_host)
        if fields.get("port") is not None:
            fields["port"] = port_of(f"{path}.port")
            if (fields["host"], fields["port"]) in owners:
                other = owners[(fields["host"], fields["port"])]
                raise ConfigError(
                    f"{path}.port: port {fields['port']} is also used by {other!r}.", path=f"{path}.port"
                )
            owners[(fields["host"], fields["port"])] = name
            used.append(fields["port"])
    for _, fields in blocks.values():
        if fields.get("port") is None:  # left null without assign_ports, so `${x.port}` still resolves
            fields["port"] = find_free_port(fields["host"], low, high, set(used)) if assign_ports else None
            used.append(fields["port"])
    raw["disallowed_ports"] = [port for port in dict.fromkeys(used) if port is not None]
    raw.setdefault("port_range_low", low)
    raw.setdefault("port_range_high", high)


RANDOM_PORT_DRAWS = 64
"""Random ports `find_free_port` tries before it goes through the rest of the range."""


def _hold_if_free(host: str, port: int) -> bool:
    """Whether `port` is free on `host`; if so it is held for its server (`gymfleet.fleet.ports.reserve`)."""
    probe = ports.bind_probe(host, port)
    if probe is None:
        return False
    sock, exact = probe
    if exact:
        ports.reserve(host, sock)
    else:
        sock.close()
    return True


def find_free_port(host: str, low: int, high: int, disallowed: set[int]) -> int:
    """A random port in [low, high], not in `disallowed`, free on `host` right now and held for its server from now
    on (`gymfleet.fleet.ports`: the supervisor hands the bound socket to the server, so nothing takes it between)."""
    tried: set[int] = set()
    for _ in range(min(RANDOM_PORT_DRAWS, high - low + 1)):  # a free port is nearly always among the first draws
        port = random.randint(low, high)
        if port not in disallowed and port not in tried:
            tried.add(port)
            if _hold_if_free(host, port):
                return port
    # A crowded range: every other port, in random order (building and shuffling the whole range costs milliseconds,
    # which once per server was a tenth of a CPU second of `ng_run`'s start).
    candidates = [port for port in range(low, high + 1) if port not in disallowed and port not in tried]
    for port in random.sample(candidates, len(candidates)):
        if _hold_if_free(host, port):
            return port
    raise ConfigError(
        f"no free port for host {host!r} in [{low}, {high}] ({len(disallowed)} disallowed).",
        path="port_range_low",
        hint="Widen the range with ++port_range_low=<n> ++port_range_high=<m>, or set ports explicitly.",
    )
