"""The one rule for what is a secret in a config: a key that looks like one (`SECRET_KEY`). The config dump, the head
server, the resolved config handed to servers and the provenance hash all apply it through this module."""

from __future__ import annotations

import re
from typing import Any

SECRET_KEY = re.compile(r"api_key|token|secret|password", re.IGNORECASE)
"""Keys whose values are secrets (matched anywhere in the key, any case)."""


def mask_secrets(node: Any) -> Any:
    """A copy of `node` with the values of secret-looking keys (api_key, token, secret, password) as `****`."""
    if isinstance(node, list):
        return [mask_secrets(item) for item in node]
    if not isinstance(node, dict):
        return node
    masked = {}
    for key, value in node.items():
        if SECRET_KEY.search(str(key)) and isinstance(value, str) and value:
            masked[key] = "****"
        elif SECRET_KEY.search(str(key)) and isinstance(value, list) and all(isinstance(v, str) for v in value):
            masked[key] = ["****"] * len(value)
        else:
            masked[key] = mask_secrets(value)
    return masked
