"""Shared pytest setup: every test's event loop closes gymfleet's pooled HTTP session before it ends, one real
sandbox server (bubblewrap isolation) serves every test that needs one, and httpx's default SSL context is built
once for all the tests' `httpx.get/post` calls."""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytest_asyncio
from httpx._transports import default as httpx_transport

from gymfleet import http
from gymfleet.testing import serve


def _shared_default_ssl_context(build: Any) -> Any:
    """`build` (httpx's `create_ssl_context`), except that the default context (verify=True, no client cert) is
    built once per CA setting and shared. Every `httpx.get/post(...)` in a test builds a client, and each client
    would load the CA bundle into a new context: ~0.1 s a call, thousands of calls. Tests speak plain HTTP to
    127.0.0.1; a context is meant to be shared, and nothing here changes one."""
    cache: dict[tuple[Any, ...], Any] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True, **other: Any) -> Any:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env, **other)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"), *sorted(other.items()))
        if key not in cache:
            cache[key] = build(verify=True, cert=None, trust_env=trust_env, **other)
        return cache[key]

    return create_ssl_context


httpx_transport.create_ssl_context = _shared_default_ssl_context(httpx_transport.create_ssl_context)


@pytest_asyncio.fixture(autouse=True)
async def _close_http_session():
    yield
    await http.close()


@pytest.fixture(scope="session")
def sandbox_url():
    """A real sandbox service on an ephemeral port. Without bubblewrap its start-up fails, naming the fix."""
    from sandbox.app import SandboxServer

    with serve(SandboxServer({"name": "sandbox"}).create_app()) as url:
        yield url
