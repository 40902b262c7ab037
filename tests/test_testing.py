"""gymfleet.testing's process helper: a server process is waited for until it answers HTTP, or reported."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from gymfleet.testing import free_port, spawn_server


def test_spawn_server_returns_once_the_process_answers_http(tmp_path):
    port = free_port()
    process, url = spawn_server([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port,
                                cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        assert httpx.get(url + "/").status_code == 200
    finally:
        process.terminate()
        process.wait(10)


def test_spawn_server_reports_a_process_that_exits_instead_of_serving():
    port = free_port()
    with pytest.raises(RuntimeError, match="did not start serving"):
        spawn_server([sys.executable, "-c", "raise SystemExit(3)"], port)
