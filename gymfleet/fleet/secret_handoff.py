"""A fleet's secrets on their way to its servers, never through a file or the environment.

The resolved config a fleet writes for its servers has every secret masked (`split_secrets`: exactly what
`gymfleet.masking.mask_secrets` masks). Each server's own secrets (`own_secrets`) and the fleet token go to it in a
memory file it inherits (`credentials_fd`, named by `CREDENTIALS_FD_ENV`); the child reads and closes it
(`take_secrets`) and merges the values back into the config it serves from (`merge_secrets`).
`gymfleet.fleet.launch` re-exports these names.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gymfleet.masking import mask_secrets

CREDENTIALS_FD_ENV = "GYMFLEET_CREDENTIALS_FD"
"""Environment variable naming the inherited descriptor a child reads its secrets and fleet token from
(`credentials_fd`): the number only, never the values."""

Secrets = list[tuple[list[str | int], Any]]
"""`(path, value)` pairs: where in the config dict each secret value goes."""



def split_secrets(data: dict[str, Any]) -> tuple[dict[str, Any], Secrets]:
    """The config with secrets masked (exactly what `mask_secrets` masks) and the masked values with their paths.

    Examples:
        >>> masked, secrets = split_secrets({"hf_token": "hf-1", "m": {"api_key": ["sk-2"], "port": 1}})
        >>> masked
        {'hf_token': '****', 'm': {'api_key': ['****'], 'port': 1}}
        >>> secrets
        [(['hf_token'], 'hf-1'), (['m', 'api_key', 0], 'sk-2')]
    """
    masked = mask_secrets(data)
    return masked, list(_differences(data, masked, []))


def _differences(original: Any, masked: Any, path: list[str | int]):
    if isinstance(original, dict) and isinstance(masked, dict):
        for key, value in original.items():
            yield from _differences(value, masked.get(key), [*path, key])
    elif isinstance(original, list) and isinstance(masked, list) and len(original) == len(masked):
        for index, (value, hidden) in enumerate(zip(original, masked, strict=True)):
            yield from _differences(value, hidden, [*path, index])
    elif original != masked:
        yield path, original


def own_secrets(secrets: Secrets, instance: str) -> Secrets:
    """The secrets in instance `instance`'s own block: all a server needs (the config's `${...}` references were
    resolved into its block), so no server holds another's keys.

    Examples:
        >>> own_secrets([(["judge", "m", "api_key"], "a"), (["policy", "m", "api_key"], "b"), (["hf_token"], "c")],
        ...             "policy")
        [(['policy', 'm', 'api_key'], 'b')]
    """
    return [(path, value) for path, value in secrets if path and path[0] == instance]


def merge_secrets(data: dict[str, Any], secrets: Secrets) -> dict[str, Any]:
    """Put the real secret values back into a masked config (in place); returns `data`."""
    for path, value in secrets:
        node: Any = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return data


def credentials_fd(secrets: Secrets, token: str | None = None, auth_off: bool = False) -> int:
    """A memory file (`memfd`) holding `secrets` and the fleet `token`, at offset 0, for a child to inherit: start it
    with `pass_fds=(fd,)` and `{CREDENTIALS_FD_ENV: str(fd)}` in its environment, then close `fd` here."""
    fd = os.memfd_create("gymfleet-credentials", os.MFD_CLOEXEC)
    data = json.dumps({"secrets": secrets, "token": token, "auth_off": auth_off}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def credentials_env(fd: int) -> dict[str, str]:
    """The environment entry that tells a child which inherited descriptor `credentials_fd` gave it."""
    return {CREDENTIALS_FD_ENV: str(fd)}


def take_secrets() -> Secrets:
    """This child's secrets, from the descriptor `CREDENTIALS_FD_ENV` names (read, then closed); its fleet token
    is held in memory (`gymfleet.auth.hold`), and no credential is left in `os.environ` for what it starts."""
    from gymfleet import auth

    named = os.environ.pop(CREDENTIALS_FD_ENV, None)
    if named is None:
        auth.hold_from_environ()  # a server started by hand with GYMFLEET_FLEET_TOKEN
        return []
    fd = int(named)
    chunks = []
    try:
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    payload = json.loads(b"".join(chunks))
    auth.hold(payload.get("token"), bool(payload.get("auth_off")))
    return [(list(path), value) for path, value in payload["secrets"]]
