"""The NeMo-Gym-compatible global config: one dict that names every server instance and how they connect.

Sources, lowest precedence first: the YAML files listed in `config_paths` (includes flattened post-order), then
`env.yaml`, then `initial_global_config_dict` (what NeMo-RL passes), then CLI overrides in Hydra syntax
(`+config_paths=[a.yaml,b.yaml] +policy_model_name=qwen`). After the merge, the directives `_inherit_from`, `_copy`
and `_delete_key` are applied, every server instance gets a host and a free port, and all `${...}` interpolations are
resolved, so `GlobalConfig.data` is the final plain dict every server process and client sees.

An instance is a top-level key shaped like its folder path:

```yaml
mcqa:                       # instance name
  resources_servers:        # server type (exactly one)
    mcqa:                   # implementation folder (exactly one)
      entrypoint: app.py
      domain: knowledge
```

Servers refer to each other with `{type: resources_servers, name: mcqa}` or just `mcqa`.
"""

from __future__ import annotations

import errno
import json
import logging
import random
import re
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gymfleet.errors import ConfigError, ServerRefError, did_you_mean
from gymfleet.fleet.config_merge import (
    apply_directives,
    describe_validation_error,
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
from gymfleet.masking import mask_secrets

if TYPE_CHECKING:
    from gymfleet.http import ClientLimits

__all__ = [
    "DOMAINS",
    "GLOBAL_KEYS",
    "BaseServerConfig",
    "HEAD_SERVER_KEY_NAME",
    "PLACEMENTS",
    "RESERVED_KEYS",
    "SERVER_TYPES",
    "GlobalConfig",
    "GlobalConfigDictParserConfig",
    "ServerInstance",
    "client_limits",
    "find_free_port",
    "parse_global_config",
    "parse_overrides",
    "repository_root",
    "resolve_server_ref",
    "validate_fields",
]

logger = logging.getLogger(__name__)

SERVER_TYPES = ("responses_api_models", "resources_servers", "responses_api_agents", "sandbox_servers")
# Where each server type's implementations live; our agents sit in agents/ (responses_api_agents/ also works), and
# the code sandbox (gymfleet's own server type, `{sandbox_servers: {sandbox: ...}}`) is the top-level sandbox/.
SERVER_FOLDERS = {
    "responses_api_models": "responses_api_models",
    "resources_servers": "resources_servers",
    "responses_api_agents": "agents",
    "sandbox_servers": "",
}
HEAD_SERVER_KEY_NAME = "head_server"
RESERVED_KEYS = frozenset(
    {
        "config_paths", "entrypoint", "default_host", HEAD_SERVER_KEY_NAME, "disallowed_ports", "head_server_deps",
        "python_version", "pip_install_verbose", "use_absolute_ip", "uv_pip_set_python", "skip_venv_if_present",
        "hf_token", "ray_head_node_address", "port_range_low", "port_range_high", "dry_run",
        "model_endpoint_readiness_timeout_seconds", "allow_openai_version_skew", "uv_cache_dir", "uv_venv_dir",
        "results_dir", "cache_dir", "_inherit_from", "_copy", "_delete_key", "nemo_gym_log_dir", "verbose", "json",
        "query", "observability_enabled", "model_call_capture_dir", "token_id_capture", "component_name",
        "skip_verification", "skip_verification_reward", "error_on_almost_servers",
    }
)  # fmt: skip
# Global keys gymfleet reads besides RESERVED_KEYS (NeMo-Gym's): the policy endpoint every recipe interpolates,
# the HTTP pool limits, the access log switch, the restart budget, where servers run (`placement`, see
# `gymfleet.fleet.ray_placement`) and how the fleet starts its server processes (`server_start`, read by `gymfleet.fleet.supervisor`).
GLOBAL_KEYS = frozenset(
    {
        "policy_base_url", "policy_api_key", "policy_model_name", "global_aiohttp_connector_limit",
        "global_aiohttp_connector_limit_per_host", "uvicorn_logging_show_200_ok", "restart_crashed_servers",
        "exit_on_server_failure", "placement", "server_start",
    }
)  # fmt: skip
PLACEMENTS = ("local", "ray")
"""Values of the top-level `placement` key: every server on this machine, or on a Ray cluster's nodes."""
CLI_SOURCE = "the command line"
DOMAINS = (
    "math", "coding", "agent", "knowledge", "instruction_following", "long_context", "safety", "games",
    "translation", "e2e", "rlhf", "other",
)  # fmt: skip
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HEAD_PORT = 11000
DEFAULT_PORT_RANGE = (10001, 20000)


def repository_root() -> Path:
    """The directory that holds the `gymfleet` package (and `resources_servers/`, `agents/`, ...)."""
    return Path(__file__).resolve().parents[2]


@dataclass
class ServerInstance:
    """One server instance: `config[name][server_type][impl]`, with host and port filled in."""

    name: str
    server_type: str
    impl: str
    fields: dict
    root: Path = field(default_factory=repository_root, repr=False)

    @property
    def path(self) -> str:
        """Dotted YAML path of this instance's fields, for error messages."""
        return f"{self.name}.{self.server_type}.{self.impl}"

    @property
    def host(self) -> str:
        return self.fields["host"]

    @property
    def port(self) -> int | None:
        port = self.fields.get("port")
        return None if port is None else int(port)

    @property
    def entrypoint(self) -> str:
        return self.fields["entrypoint"]

    @property
    def num_workers(self) -> int:
        return int(self.fields.get("num_workers") or 1)

    @property
    def num_replicas(self) -> int:
        """Copies of this server (`num_replicas`, default 1); more than one needs `placement: ray`."""
        return int(self.fields.get("num_replicas") or 1)

    @property
    def ray_resources(self) -> dict | None:
        """What each replica asks of its Ray node (`ray_resources`), or None for its server class's default."""
        return self.fields.get("ray_resources")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def dir(self) -> Path:
        """`<root>/<type folder>/<impl>`; agents live in `agents/` (or `responses_api_agents/` if only that exists)."""
        folder = self.root / SERVER_FOLDERS[self.server_type] / self.impl
        legacy = self.root / self.server_type / self.impl
        return legacy if not folder.is_dir() and legacy.is_dir() else folder


class BaseServerConfig(pydantic.BaseModel):
    """Where a server listens (NeMo-Gym's `BaseServerConfig`; NeMo-RL builds one to name the head server)."""

    host: str
    port: int
    num_workers: int | None = None


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


@dataclass
class GlobalConfig:
    """The resolved global config (`data`) and the server instances found in it."""

    data: dict
    instances: dict[str, ServerInstance]
    hide_secrets: bool = False
    origins: dict[str, list[str]] = field(default_factory=dict, repr=False)
    """Top-level key -> the sources that set it (config file paths, "env.yaml", "the command line", ...)."""
    referenced: frozenset[str] = frozenset()
    """Top-level keys that some `${...}` interpolation names (e.g. `policy_base_url`)."""

    def unknown_cli_keys(self, known: Iterable[str]) -> list[str]:
        """Top-level keys set only on the command line that nothing reads: not in `known` (the command's own
        keys), not a global key (`RESERVED_KEYS`, `GLOBAL_KEYS`), not a server instance, not set by any other
        source, not named by any interpolation. These are typos (`+num_repeat=3`) and must not pass silently."""
        allowed = set(known) | RESERVED_KEYS | GLOBAL_KEYS | set(self.instances) | self.referenced
        return [
            key
            for key, labels in self.origins.items()
            if labels == [CLI_SOURCE] and key not in allowed and not key.startswith("_")
        ]

    def instance(self, name: str) -> ServerInstance:
        if name not in self.instances:
            raise ServerRefError(
                f"unknown server {name!r}; known: {sorted(self.instances)}.{did_you_mean(name, self.instances)}"
            )
        return self.instances[name]

    def instances_of(self, server_type: str) -> list[ServerInstance]:
        return [inst for inst in self.instances.values() if inst.server_type == server_type]

    def to_yaml(self, hide_secrets: bool | None = None) -> str:
        """The config as YAML; with `hide_secrets` (default: the parser setting) secret values become `****`."""
        hide = self.hide_secrets if hide_secrets is None else hide_secrets
        return yaml.safe_dump(mask_secrets(self.data) if hide else self.data, sort_keys=False)

    @classmethod
    def from_data(cls, data: dict, root: Path | None = None) -> GlobalConfig:
        """A GlobalConfig over an already resolved dict (what `ng_run` hands its child processes)."""
        root = Path(root) if root is not None else repository_root()
        found = _discover_instances(data, strict=True)
        instances = {
            name: ServerInstance(name, server_type, impl, data[name][server_type][impl], root)
            for name, (server_type, impl) in found.items()
        }
        return cls(data=data, instances=instances)

    @classmethod
    def from_json_file(cls, path: Path) -> GlobalConfig:
        return cls.from_data(json.loads(Path(path).read_text()))

    @property
    def head_host(self) -> str:
        return self.data[HEAD_SERVER_KEY_NAME]["host"]

    @property
    def head_port(self) -> int:
        return int(self.data[HEAD_SERVER_KEY_NAME]["port"])


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


def _discover_instances(data: dict, *, strict: bool) -> dict[str, tuple[str, str]]:
    """Map instance name -> (server type, impl) for every top-level block shaped like a server.

    A block with a server-type key that is otherwise malformed (an "almost-server") raises when `strict`, else is
    skipped with a warning. Reserved keys, non-dict values and dicts without a server-type key are not servers.
    """
    found: dict[str, tuple[str, str]] = {}
    for name, block in data.items():
        if not isinstance(name, str) or name in RESERVED_KEYS or not isinstance(block, dict):
            continue
        types = [key for key in block if key in SERVER_TYPES]
        if not types:
            continue
        problem, impl = _almost_server_problem(name, block), None
        if problem is None:
            impl = next(iter(block[types[0]]))
        elif strict:
            raise ConfigError(
                problem,
                path=name,
                hint="An instance is {name: {server_type: {impl: {entrypoint: app.py, ...}}}}; "
                "set error_on_almost_servers: false to skip malformed blocks instead.",
            )
        else:
            logger.warning("skipping malformed server block: %s", problem)
            continue
        found[name] = (types[0], impl)
    return found


def _almost_server_problem(name: str, block: dict) -> str | None:
    if len(block) != 1:
        return (
            f"{name}: a server instance must have exactly one key, its server type; found {sorted(map(str, block))}."
        )
    server_type, impls = next(iter(block.items()))
    if not isinstance(impls, dict) or len(impls) != 1:
        found = sorted(map(str, impls)) if isinstance(impls, dict) else impls
        return f"{name}.{server_type}: expected exactly one implementation key (its folder name); found {found}."
    impl, fields = next(iter(impls.items()))
    if not isinstance(fields, dict) or not fields.get("entrypoint"):
        return f"{name}.{server_type}.{impl}: missing `entrypoint` (e.g. entrypoint: app.py)."
    return None


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


def client_limits(data: dict, workers: int = 1) -> ClientLimits:
    """HTTP pool limits for one process: `global_aiohttp_connector_limit[_per_host]`, split between `workers`.

    Absent keys keep `ClientLimits`' defaults. Like NeMo-Gym, a server with `num_workers` workers gives each worker
    its share, so the fleet as a whole stays within the configured limits.
    """
    from gymfleet.http import ClientLimits  # here, not at the top: it imports aiohttp, and `ng_run` starts faster

    defaults, workers = ClientLimits(), max(1, int(workers))
    limit = int(data.get("global_aiohttp_connector_limit") or defaults.limit)
    per_host = int(data.get("global_aiohttp_connector_limit_per_host") or defaults.limit_per_host)
    return ClientLimits(limit=max(1, limit // workers), limit_per_host=max(1, per_host // workers))


def find_free_port(host: str, low: int, high: int, disallowed: set[int]) -> int:
    """A random port in [low, high], not in `disallowed`, that can be bound on `host` right now (then released)."""
    candidates = [port for port in range(low, high + 1) if port not in disallowed]
    for port in random.sample(candidates, len(candidates)):
        if _can_bind(host, port):
            return port
    raise ConfigError(
        f"no free port for host {host!r} in [{low}, {high}] ({len(disallowed)} disallowed).",
        path="port_range_low",
        hint="Widen the range with ++port_range_low=<n> ++port_range_high=<m>, or set ports explicitly.",
    )


def _can_bind(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for bind_host in (host, ""):  # a host that is not local (or not resolvable here) is checked on all interfaces
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((bind_host, port))
            return True
        except socket.gaierror:
            continue
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                return False
    return False


# ---------------------------------------------------------------------------------------------- validation


def _validate_instance(inst: ServerInstance, instances: dict[str, ServerInstance]) -> None:
    if not isinstance(inst.fields.get("entrypoint"), str):
        raise ConfigError(
            f"{inst.path}.entrypoint: must be a file name such as app.py.", path=f"{inst.path}.entrypoint"
        )
    if inst.server_type == "resources_servers":
        domain, path = inst.fields.get("domain"), f"{inst.path}.domain"
        if domain is None:
            raise ConfigError(
                f"{path}: resources servers must declare a domain.",
                path=path,
                hint=f"Add `domain: <one of {', '.join(DOMAINS)}>` under {inst.path}.",
            )
        if domain not in DOMAINS:
            raise ConfigError(
                f"{path}: unknown domain {domain!r}.{did_you_mean(domain, DOMAINS)}",
                path=path,
                hint=f"Valid domains: {', '.join(DOMAINS)}.",
            )
    _check_refs(inst.fields, inst.path, instances)


def _check_refs(node: Any, at: str, instances: dict[str, ServerInstance]) -> None:
    if isinstance(node, dict):
        if set(node) == {"type", "name"} and node["type"] in SERVER_TYPES:
            resolve_server_ref(node, node["type"], instances, at)
            return
        for key, value in node.items():
            _check_refs(value, join_path(at, key), instances)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_refs(value, join_path(at, i), instances)


def resolve_server_ref(
    value: Any, server_type: str | None, config: GlobalConfig | dict | DictConfig, path: str
) -> str:
    """Return the instance name that `value` refers to, after checking that it exists (with that type).

    `value` is `{type: resources_servers, name: mcqa}` (a dict, DictConfig, or object with `.type` and `.name`) or
    the plain name `"mcqa"`. `config` is a `GlobalConfig`, a config dict, or a name -> ServerInstance mapping.

    Raises:
        ServerRefError: unknown name or wrong type, naming `path`, the known instances and the closest one.
        ConfigError: `value` is neither a name nor a `{type, name}` reference.
    """
    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict) and {"type", "name"} <= set(value):
        ref_type, name = value["type"], value["name"]
    elif hasattr(value, "type") and hasattr(value, "name"):
        ref_type, name = value.type, value.name
    elif isinstance(value, str):
        ref_type, name = server_type, value
    else:
        raise ConfigError(
            f"{path}: expected a server reference, got {value!r}.",
            path=path,
            hint=f"Write {{type: {server_type or 'resources_servers'}, name: <instance>}} or just the instance name.",
        )
    if ref_type is not None and ref_type not in SERVER_TYPES:
        raise ConfigError(
            f"{path}.type: unknown server type {ref_type!r}.{did_you_mean(ref_type, SERVER_TYPES)}", path=path
        )
    if server_type is not None and ref_type != server_type:
        raise ServerRefError(f"{path}: expected a {server_type} reference, got type {ref_type!r}.", path=path)
    types = _instance_types(config)
    if types.get(name) is not None and (ref_type is None or types[name] == ref_type):
        return name
    known = sorted(n for n, t in types.items() if ref_type is None or t == ref_type)
    if name in types:
        message = f"server {name!r} at {path} is a {types[name]}, not a {ref_type}"
    else:
        message = f"unknown server {name!r} at {path}"
    raise ServerRefError(
        f"{message}; known {ref_type or 'servers'}: {known}.{did_you_mean(name, known)}",
        path=path,
        hint=f"Fix the name, or add an instance named {name!r} to the config.",
    )


def _instance_types(config: GlobalConfig | dict | DictConfig) -> dict[str, str]:
    if isinstance(config, GlobalConfig):
        config = config.instances
    if isinstance(config, DictConfig):
        config = OmegaConf.to_container(config, resolve=False)
    if all(isinstance(v, ServerInstance) for v in config.values()):
        return {name: inst.server_type for name, inst in config.items()}
    return {name: t for name, (t, _) in _discover_instances(config, strict=False).items()}


def validate_fields(model_cls: type[pydantic.BaseModel], data: dict, path: str) -> pydantic.BaseModel:
    """Validate a server's fields into its pydantic config class, naming each bad field by its full YAML path.

    Raises:
        ConfigError: one line per bad field, e.g.
            `mcqa.resources_servers.mcqa.grading_mod: unknown field. Did you mean 'grading_mode'?`
    """
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as e:
        lines, hint = describe_validation_error(e, model_cls, path)
        raise ConfigError(
            f"invalid {model_cls.__name__} config:\n  " + "\n  ".join(lines), path=path, hint=hint
        ) from None
