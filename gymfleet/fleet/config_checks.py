"""Checks of a parsed config: each server instance's required fields, the references between servers
(`{type: resources_servers, name: mcqa}` or just `mcqa`, `resolve_server_ref`), and a server's own fields against its
pydantic config class (`validate_fields`), every error naming its dotted YAML path.
"""

from __future__ import annotations

import logging
import sys
import typing
from typing import TYPE_CHECKING, Any

import pydantic

from gymfleet.errors import ConfigError, ServerRefError, did_you_mean
from gymfleet.fleet.config_instances import (
    DOMAINS,
    SERVER_TYPES,
    GlobalConfig,
    ServerInstance,
    _discover_instances,
)
from gymfleet.fleet.config_merge import join_path

if TYPE_CHECKING:
    from omegaconf import DictConfig


def _plain(value: Any, resolve: bool) -> Any:
    """`value` as plain containers if it is an omegaconf node, else itself. No import: a process that never imported
    omegaconf (a server reading its resolved JSON config) holds no omegaconf node."""
    omegaconf = sys.modules.get("omegaconf")
    if omegaconf is not None and isinstance(value, omegaconf.DictConfig):
        return omegaconf.OmegaConf.to_container(value, resolve=resolve)
    return value

__all__ = ["resolve_server_ref", "validate_fields"]

log = logging.getLogger(__name__)


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
    if inst.folder is None:
        _check_refs(inst.fields, inst.path, instances)
        return
    # A NeMo-Gym folder's config is read as NeMo-Gym 0.7.0 reads it: a reference in a top-level field must name a
    # server of the fleet; one nested deeper (ns_tools' `verifiers: {math_with_judge: {type, name}}`) is the folder's
    # own business, looked up when it calls it. Such a dangling one is named at start, not refused.
    for key, value in inst.fields.items():
        at = join_path(inst.path, key)
        if _is_ref(value):
            resolve_server_ref(value, value["type"], instances, at)
            continue
        try:
            _check_refs(value, at, instances)
        except ServerRefError as exc:
            log.warning("%s: %s (NeMo-Gym checks a folder's top-level references only: it starts, and its calls to "
                        "that server will fail until the fleet has it)", inst.name, exc)


def _is_ref(node: Any) -> bool:
    return isinstance(node, dict) and set(node) == {"type", "name"} and node["type"] in SERVER_TYPES


def _check_refs(node: Any, at: str, instances: dict[str, ServerInstance]) -> None:
    if isinstance(node, dict):
        if _is_ref(node):
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
    value = _plain(value, resolve=True)
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
    config = _plain(config, resolve=False)
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


def describe_validation_error(
    error: pydantic.ValidationError, model_cls: type[pydantic.BaseModel], path: str
) -> tuple[list[str], str | None]:
    """One line per bad field, named by its full dotted YAML path, plus a hint listing valid fields for typos."""
    lines, hint = [], None
    for err in error.errors():
        at = path
        for part in err["loc"]:
            at = join_path(at, part)
        if err["type"] == "extra_forbidden":
            known = _model_fields_at(model_cls, err["loc"][:-1])
            lines.append(f"{at}: unknown field.{did_you_mean(err['loc'][-1], known)}")
            hint = f"Valid fields here: {', '.join(sorted(known))}."
        elif err["type"] == "missing":
            lines.append(f"{at}: required field is missing.")
        else:
            lines.append(f"{at}: {err['msg']} (got {_short_repr(err.get('input'))}).")
    return lines, hint


def _model_fields_at(model_cls: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model at `loc`, best effort: [] where the type is not a model."""
    cls: Any = model_cls
    for part in loc:
        if isinstance(part, int):
            continue
        info = cls.model_fields.get(part) if isinstance(cls, type) and issubclass(cls, pydantic.BaseModel) else None
        if info is None:
            return []
        models = [
            a for a in _flatten_types(info.annotation) if isinstance(a, type) and issubclass(a, pydantic.BaseModel)
        ]
        if not models:
            return []
        cls = models[0]
    return [alias for name, info in cls.model_fields.items() for alias in {name, info.alias or name}]


def _flatten_types(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    return [annotation] if not args else [t for arg in args for t in _flatten_types(arg)]


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
