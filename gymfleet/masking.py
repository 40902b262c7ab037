"""The one rule for what is a secret. The config dump, the head server, the resolved config handed to servers, the
provenance hash, `/metrics` labels and upstream error text all apply it through this module.

A secret is:
- the value of a key that names one (`SECRET_KEY`: `api_key`, `apikey`, `api-key`, `x-api-key`, `token`,
  `hf_token`, `secret`, `client_secret`, `password`, `Authorization`, `credentials`, `cookie`, ... in any case, as a
  whole word of the key), whatever its type: a string, a number, or every string and number inside a list or a
  map under it (booleans and nulls are switches, not secrets, and stay);
- in a header map (`default_headers: {api-key: ...}`), the same rule, since its keys are the header names;
- the user and password of a URL (`https://user:pass@host/v1`, anywhere in any string): `https://****@host/v1`.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "****"

SECRET_KEY = re.compile(
    r"(?:^|[^a-z])(?:api[_-]?keys?|token|secrets?|passwords?|passwd|authorization|credentials?|cookies?|"
    r"private[_-]?keys?|access[_-]?keys?)(?:$|[^a-z])",
    re.IGNORECASE,
)
"""Keys whose values are secrets: one of the words above, not glued to other letters (`max_tokens` and `tokenizer`
are not secrets; `policy_api_key`, `HF_TOKEN`, `x-api-key`, `Authorization` are)."""

URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s'\"<>]+@")
"""`scheme://user:pass@` in a URL (the credentials a URL may carry)."""


def is_secret_key(key: Any) -> bool:
    """Whether the value under `key` is a secret."""
    return bool(SECRET_KEY.search(str(key)))


def mask_text(text: str) -> str:
    """`text` with the credentials of every URL in it masked (`https://****@host`)."""
    return URL_USERINFO.sub(rf"\1{MASK}@", text) if "@" in text else text


def mask_secrets(node: Any) -> Any:
    """A copy of `node` with every secret (see the module docstring) as `****`: same shape, so what was masked can be
    told apart from what was not (`gymfleet.fleet.secret_handoff.split_secrets`)."""
    if isinstance(node, dict):
        return {key: _mask_all(value) if is_secret_key(key) else mask_secrets(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [mask_secrets(item) for item in node]
    if isinstance(node, str):
        return mask_text(node)
    return node


def _mask_all(node: Any) -> Any:
    """Every string and number inside `node` masked (the value of a secret key)."""
    if isinstance(node, dict):
        return {key: _mask_all(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [_mask_all(item) for item in node]
    if isinstance(node, bool) or node is None or node == "":
        return node
    if isinstance(node, str | int | float):
        return MASK
    return node


def redact(text: str, secrets: list[str] | tuple[str, ...] = ()) -> str:
    """`text` (an upstream's error message, a log line) with URL credentials masked and each of `secrets` (the API
    keys this server holds) replaced by `****`, so an upstream that echoes the key never makes it public."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    return mask_text(text)
