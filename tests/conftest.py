"""Fixtures several test files of this folder share."""

from __future__ import annotations

import pytest

from gymfleet.testing import serve
from responses_api_models.scripted_model.app import ScriptedModel


@pytest.fixture
def recorder():
    """A real scripted model that records the `Authorization` header of every request it gets."""
    seen: list[str] = []
    app = ScriptedModel({"name": "recorder", "default": {"text": "hello"}}).create_app()

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            seen.append(dict(scope["headers"]).get(b"authorization", b"").decode())
        await app(scope, receive, send)

    with serve(recording) as url:
        yield url, seen
