"""The resolved global config (`GlobalConfig`) and the server instances in it (`ServerInstance`): what
`gymfleet.fleet.config.parse_global_config` returns, the keys it knows, and how instances are found in a config dict.

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

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pydantic
import yaml

from gymfleet.errors import ConfigError, ServerRefError, did_you_mean
from gymfleet.fleet.folders import SERVER_FOLDERS_KEY
from gymfleet.masking import mask_secrets

if TYPE_CHECKING:
    from gymfleet.http import ClientLimits

__all__ = [
    "DOMAINS",
    "GLOBAL_KEYS",
    "HEAD_SERVER_KEY_NAME",
    "RESERVED_KEYS",
    "SERVER_TYPES",
    "BaseServerConfig",
    "GlobalConfig",
    "ServerInstance",
    "client_limits",
    "repository_root",
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
# `gymfleet.fleet.ray_placement`) and how the fleet starts its server processes (`server_start`, read by
# `gymfleet.fleet.server_start`).
GLOBAL_KEYS = frozenset(
    {
        "policy_base_url", "policy_api_key", "policy_model_name", "global_aiohttp_connector_limit",
        "global_aiohttp_connector_limit_per_host", "uvicorn_logging_show_200_ok", "restart_crashed_servers",
        "exit_on_server_failure", "placement", "server_start", "server_folders", "folder_requirements",
    }
)  # fmt: skip
CLI_SOURCE = "the command line"
DOMAINS = (
    "math", "coding", "agent", "knowledge", "instruction_following", "long_context", "safety", "games",
    "translation", "e2e", "rlhf", "other",
)  # fmt: skip


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
    folder: Path | None = None
    """The folder it is served from when that lies outside `root` (a NeMo-Gym tree's; `gymfleet.fleet.folders`)."""

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
        """`<root>/<type folder>/<impl>`; agents live in `agents/` (or `responses_api_agents/` if only that exists);
        `folder` when it is served from a tree of its own."""
        if self.folder is not None:
            return self.folder
        folder = self.root / SERVER_FOLDERS[self.server_type] / self.impl
        legacy = self.root / self.server_type / self.impl
        return legacy if not folder.is_dir() and legacy.is_dir() else folder


class BaseServerConfig(pydantic.BaseModel):
    """Where a server listens (NeMo-Gym's `BaseServerConfig`; NeMo-RL builds one to name the head server)."""

    host: str
    port: int
    num_workers: int | None = None


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
        set_folders(instances, data)
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


def set_folders(instances: dict[str, ServerInstance], data: dict) -> None:
    """Point the instances served from a tree of their own at their folder (`server_folders`, see
    `gymfleet.fleet.folders`)."""
    for name, folder in (data.get(SERVER_FOLDERS_KEY) or {}).items():
        if name in instances:
            instances[name].folder = Path(folder)


def client_limits(data: dict, workers: int = 1) -> ClientLimits:
    """HTTP pool limits for one process: `global_aiohttp_connector_limit[_per_host]`, split between `workers`.

    Absent keys keep `ClientLimits`' defaults. Like NeMo-Gym, a server with `num_workers` workers gives each worker
    its share, so the fleet as a whole stays within the configured limits.
    """
    from gymfleet.http import ClientLimits  # here, not at the top: it imports aiohttp, and `ng_run` starts faster
    # (it lives here, not in `gymfleet.fleet.config`, so that a server gets it without importing omegaconf)

    defaults, workers = ClientLimits(), max(1, int(workers))
    limit = int(data.get("global_aiohttp_connector_limit") or defaults.limit)
    per_host = int(data.get("global_aiohttp_connector_limit_per_host") or defaults.limit_per_host)
    return ClientLimits(limit=max(1, limit // workers), limit_per_host=max(1, per_host // workers))
