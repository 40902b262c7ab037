"""Shared pytest setup: every test's event loop closes gymfleet's pooled HTTP session before it ends."""

from __future__ import annotations

import pytest_asyncio

from gymfleet import http


@pytest_asyncio.fixture(autouse=True)
async def _close_http_session():
    yield
    await http.close()
