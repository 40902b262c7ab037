"""What servers log about bad requests stays one short line, whatever the client sent."""

from __future__ import annotations

import logging

import httpx

from gymfleet.testing import serve
from resources_servers.mcqa.app import MCQAServer


def test_a_huge_key_in_an_invalid_body_gives_a_short_log_line(caplog):
    huge_key = "k" * 1_000_000
    body = {"responses_create_params": {"input": "hi", "metadata": {huge_key: 5}}, "response": {"output": 5}}
    with caplog.at_level(logging.WARNING, logger="gymfleet.serving.server"), \
            serve(MCQAServer({"name": "mcqa", "domain": "knowledge"}).create_app()) as url:
        answer = httpx.post(url + "/verify", json=body, timeout=60)
    assert answer.status_code == 422
    lines = [record.getMessage() for record in caplog.records if "invalid request" in record.getMessage()]
    assert lines, "the 422 is logged"
    assert all(len(line) < 2_000 for line in lines), max(map(len, lines))
