"""Shared pytest setup: every test's event loop closes gymfleet's pooled HTTP session before it ends, and one real
sandbox server (bubblewrap isolation) serves every test that needs one."""

from __future__ import annotations

import pytest
import pytest_asyncio

from gymfleet import http
from gymfleet.testing import serve


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
