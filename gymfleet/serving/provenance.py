"""Reward provenance: what decided a reward, small enough to ride on every `/verify` answer.

A resources server adds one `reward_provenance` object to every `/verify` answer (scored rows and
`_ng_failure_class` rows alike; see `gymfleet.serving.resources`):

    {"environment": "mcqa", "instance": "mcqa", "version": "v2", "config_hash": "3f9c0a1b2d4e5f60",
     "libraries": {"gymfleet": "0.1.0"}, "judge": {...}}          # `judge` only for environments with a judge

- `environment`: the environment's folder name (`resources_servers/<environment>/`); `instance`: the config's
  instance name.
- `version`: the last `- vN:` entry of the `## Version history` section of the environment module's docstring;
  `v0` when there is none (the conformance check, `gymfleet.testing.check_resources_server`, fails such an env).
- `config_hash`: the first 16 hex digits of the SHA-256 of the effective config (every field, defaults included,
  as canonical JSON) without the keys that cannot change a reward: where the server listens and how many workers
  it runs, descriptive keys, deadlines that only turn a verify into a failure row, concurrency caps, URLs, and
  secrets (`gymfleet.masking.SECRET_KEY`). The same config on another machine hashes the same.
- `libraries`: `{distribution: version}` of the libraries that decide the reward (the server class's
  `reward_libraries`, plus `gymfleet` itself); a library that is not installed is `"not installed"`.
- `judge`: `{server, model, prompt_version, seed}` of the server's `JudgeClient` (`self.judge`): the model is the
  judge requests' `model` if the config sets one, else the judge instance's configured `model`; the prompt version
  the server's `prompt_version` / `version` attribute (`gymfleet.grading.judge.prompt_version`), else a hash of the
  environment folder's prompt files (`*.txt`); the seed the judge requests' `seed`.

`provenance_diff(old, new)` says which of `version`, `config_hash`, `libraries`, `judge` differ between two such
objects (`ng_reverify` explains changed rewards with it).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from gymfleet.masking import SECRET_KEY

if TYPE_CHECKING:
    from gymfleet.serving.server import Server

PROVENANCE_KEY = "reward_provenance"
NO_VERSION = "v0"
NOT_INSTALLED = "not installed"
HASH_CHARS = 16
DIFF_FIELDS = ("version", "config_hash", "libraries", "judge")
"""What `provenance_diff` compares (the environment and instance names identify; they do not explain)."""

NON_REWARD_FIELDS = frozenset({
    "name", "host", "port", "entrypoint", "num_workers", "domain", "description", "verified", "value", "license",
    "datasets", "request_body_timeout_s", "verify_timeout_s", "num_replicas", "ray_resources",
})  # fmt: skip
"""Top-level config keys of every server that cannot change a reward (where and how it runs, what it is called)."""
NON_REWARD_KEY = re.compile(r"(^|_)(url|urls|host|port)$|concurren", re.IGNORECASE)
"""Keys at any depth that cannot change a reward: addresses (`sandbox_url`, `base_url`) and concurrency caps
(`judge_max_concurrency`, `max_concurrent_requests`). Matches `sandbox_url`; not `url_pattern`."""
VERSION_SECTION = re.compile(r"^##\s*Version history\s*$(?P<body>.*?)(?=^##\s|\Z)", re.MULTILINE | re.DOTALL)
VERSION_ENTRY = re.compile(r"^\s*-\s*(v\d+)\b", re.MULTILINE)
"""A version-history entry: matches `- v2: ...` and `- v2 (fix, no reward changes): ...`; not `- see v2`."""


def docstring_version(doc: str | None) -> str:
    """The last `- vN` entry of the docstring's `## Version history` section, or `v0` when there is none.

    Examples:
        >>> docstring_version("Env.\\n\\n## Version history\\n- v1: initial.\\n- v2: stricter.\\n")
        'v2'
        >>> docstring_version("Env without a history.")
        'v0'
    """
    section = VERSION_SECTION.search(doc or "")
    entries = VERSION_ENTRY.findall(section.group("body")) if section else []
    return entries[-1] if entries else NO_VERSION


def environment_name(server_class: type) -> str:
    """The environment folder a server class lives in (`resources_servers.mcqa.app` -> `mcqa`), else its module."""
    parts = server_class.__module__.split(".")
    if parts[0] == "resources_servers" and len(parts) > 1:
        return parts[1]
    return server_class.__module__


def environment_version(server_class: type) -> str:
    """`docstring_version` of the module that defines `server_class`."""
    module = sys.modules.get(server_class.__module__)
    return docstring_version(getattr(module, "__doc__", None))


def _reward_relevant(node: Any, top: bool = False) -> Any:
    if isinstance(node, dict):
        return {
            key: _reward_relevant(value) for key, value in node.items()
            if not (top and key in NON_REWARD_FIELDS) and not NON_REWARD_KEY.search(str(key))
            and not SECRET_KEY.search(str(key))
        }  # fmt: skip
    if isinstance(node, list | tuple):
        return [_reward_relevant(item) for item in node]
    return node


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8: equal values give equal bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def config_hash(config: BaseModel | dict[str, Any]) -> str:
    """The first `HASH_CHARS` hex digits of the SHA-256 of the reward-relevant part of `config` (module docstring).

    Examples:
        >>> config_hash({"grading_mode": "strict", "port": 1}) == config_hash({"grading_mode": "strict", "port": 2})
        True
        >>> config_hash({"grading_mode": "strict"}) == config_hash({"grading_mode": "lenient"})
        False
    """
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    return hashlib.sha256(canonical_json(_reward_relevant(data, top=True))).hexdigest()[:HASH_CHARS]


def library_versions(names: tuple[str, ...] | list[str]) -> dict[str, str]:
    """`{distribution: installed version}` for `gymfleet` and `names` (`"not installed"` for a missing one)."""
    versions = {}
    for name in dict.fromkeys(("gymfleet", *names)):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = NOT_INSTALLED
    return versions


def _judge_params(config: BaseModel) -> dict[str, Any]:
    """The judge request fields a config sets (`judge_responses_create_params`, `genrm_responses_create_params`)."""
    params: dict[str, Any] = {}
    for name in type(config).model_fields:
        if name.endswith("responses_create_params"):
            value = getattr(config, name)
            if isinstance(value, BaseModel):
                value = value.model_dump(mode="json", exclude_none=True)
            if isinstance(value, dict):
                params.update({k: v for k, v in value.items() if k in ("model", "seed")})
    return params


def _configured_model(global_config: dict[str, Any], instance: str) -> str | None:
    """The `model` field of instance `instance` in the global config (`{name: {type: {impl: {model: ...}}}}`)."""
    block = global_config.get(instance)
    for types in (block.values() if isinstance(block, dict) else ()):
        for fields in (types.values() if isinstance(types, dict) else ()):
            if isinstance(fields, dict) and isinstance(fields.get("model"), str):
                return fields["model"]
    return None


def _prompt_files_version(server_class: type) -> str | None:
    """`prompts@<12 hex>` over the `*.txt` files of the environment's folder (tests and data left out), or None."""
    try:
        folder = Path(inspect.getfile(server_class)).parent
    except (TypeError, OSError):
        return None
    if folder.parent.name != "resources_servers":
        return None
    digest = hashlib.sha256()
    found = False
    for path in sorted(folder.rglob("*.txt")):
        relative = path.relative_to(folder)
        if relative.parts[0] in ("tests", "data") or path.name == "requirements.txt":
            continue
        found = True
        digest.update(str(relative).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"prompts@{digest.hexdigest()[:12]}" if found else None


def judge_identity(server: Server) -> dict[str, Any] | None:
    """`{server, model, prompt_version, seed}` of the server's judge, or None when it has none (module docstring)."""
    from gymfleet.grading.judge import (
        JudgeClient,  # gymfleet.grading.judge imports gymfleet.http; keep this module light
    )

    judge = getattr(server, "judge", None)
    if not isinstance(judge, JudgeClient):
        return None
    params = _judge_params(server.config)
    version = next((value for value in (getattr(server, "prompt_version", None), getattr(server, "version", None))
                    if isinstance(value, str)), None)
    seed = params.get("seed")
    return {
        "server": judge.server,
        "model": params.get("model") or _configured_model(server.global_config, judge.server),
        "prompt_version": version or _prompt_files_version(type(server)),
        "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else None,
    }


def reward_provenance(server: Server) -> dict[str, Any]:
    """The `reward_provenance` object of `server` (module docstring). Cheap to call once, not per request."""
    server_class = type(server)
    provenance: dict[str, Any] = {
        "environment": environment_name(server_class),
        "instance": server.config.name or server_class.__name__,
        "version": environment_version(server_class),
        "config_hash": config_hash(server.config),
        "libraries": library_versions(tuple(getattr(server_class, "reward_libraries", ()))),
    }
    judge = judge_identity(server)
    if judge is not None:
        provenance["judge"] = judge
    return provenance


def provenance_diff(old: Any, new: Any) -> list[str]:
    """Which of `DIFF_FIELDS` differ between a stored provenance and the current one (all of them when the stored
    row has none). Library differences name the library: `libraries:sympy`.

    Examples:
        >>> provenance_diff({"version": "v1", "config_hash": "a"}, {"version": "v2", "config_hash": "a"})
        ['version']
        >>> provenance_diff({"libraries": {"sympy": "1.13"}}, {"libraries": {"sympy": "1.14"}})
        ['libraries:sympy']
    """
    if not isinstance(old, dict):
        return ["no stored provenance"]
    new = new if isinstance(new, dict) else {}
    changed = []
    for field in DIFF_FIELDS:
        before, after = old.get(field), new.get(field)
        if before == after:
            continue
        if field == "libraries" and isinstance(before, dict) and isinstance(after, dict):
            changed += [f"libraries:{name}" for name in sorted(set(before) | set(after))
                        if before.get(name) != after.get(name)]
        else:
            changed.append(field)
    return changed
