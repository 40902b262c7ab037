"""Fixtures: a real sandbox server and a real code_gen server pointed at it (both uvicorn on ephemeral ports)."""

from __future__ import annotations

import pytest

from gymfleet.testing import fleets
from gymfleet.testing.fleets import post_verify
from resources_servers.code_gen.app import CodeGenServer


def served(sandbox_url: str, cls: type[CodeGenServer] = CodeGenServer):
    """A code_gen server of `cls` over the sandbox, served on an ephemeral port (a context manager of its URL)."""
    return fleets.served(cls({"name": "code_gen", "domain": "coding", "sandbox_url": sandbox_url,
                              "unit_test_timeout_secs": 2, "memory_mb": 1024}))


@pytest.fixture(scope="session")
def code_gen_url(sandbox_url):
    with served(sandbox_url) as url:
        yield url


def verify(url: str, row: dict, text: str, **response) -> dict:
    """POST /verify with `text` as the model's answer; asserts HTTP 200."""
    return post_verify(url, row, text, timeout=120, **response)


def fenced(code: str, before: str = "Here is my solution.") -> str:
    return f"{before}\n\n```python\n{code}\n```\n"
