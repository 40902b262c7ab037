"""`lean_command`: proofs compiled in gymfleet's own sandbox service (bubblewrap), not a NeMo-Skills sandbox.

Lean is not installed here, so `lean_command` is a fake `lean` written in bash that runs inside the sandbox on the
`Proof.lean` the server wrote into the run's workspace: it prints the file's SHA-256 (so the test sees exactly what
was compiled), fails like Lean on `COMPILE_ERROR`, loops forever on `SLOW_PROOF`, and warns about `sorry` on
`SORRY_WARNING`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from gymfleet.testing import make_response, serve
from resources_servers.math_formal_lean.app import MathFormalLeanServer

ROW = json.loads((Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()[0])
FAKE_LEAN = (
    'lean() { echo "compiled $(sha256sum < "$1" | cut -c1-64)"; '
    'if grep -q COMPILE_ERROR "$1"; then '
    'echo "$1:$(grep -n COMPILE_ERROR "$1" | cut -d: -f1):2: error: unknown identifier"; return 1; fi; '
    'if grep -q SLOW_PROOF "$1"; then while :; do :; done; fi; '
    'if grep -q SORRY_WARNING "$1"; then echo "$1:1:0: warning: declaration uses '"'sorry'"'"; fi; }; lean'
)


@pytest.fixture(scope="module")
def url(sandbox_url):
    server = MathFormalLeanServer({"name": "math_formal_lean", "lean_command": FAKE_LEAN, "sandbox_url": sandbox_url,
                                   "compilation_timeout": 1, "memory_mb": 256})
    with serve(server.create_app()) as url:
        yield url


def verify(url: str, body: str) -> dict:
    text = f"```lean4\n{ROW['formal_statement']}{body}\n```"
    answer = httpx.post(f"{url}/verify", json={**ROW, "response": make_response(text)}, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_program_is_compiled_in_the_sandbox(url):
    result = verify(url, "  simp")
    assert result["reward"] == 1.0 and result["proof_status"] == "completed"
    digest = hashlib.sha256(result["predicted_proof"].encode()).hexdigest()
    assert result["compiler_output"]["stdout"] == f"compiled {digest}\n"


@pytest.mark.parametrize(("body", "status"), [
    ("  exact COMPILE_ERROR", "failed"),
    ("  SLOW_PROOF", "timeout"),
    ("  simp -- SORRY_WARNING", "has_sorry"),
])  # fmt: skip
def test_compile_outcomes(url, body, status):
    result = verify(url, body)
    assert result["reward"] == 0.0 and result["proof_status"] == status, result
    assert "_ng_failure_class" not in result
    if status == "failed":
        assert "  <error>exact COMPILE_ERROR</error>" in result["error_feedback"]  # the fake says column 2


def test_a_sandbox_that_is_down_is_sandbox_failed():
    server = MathFormalLeanServer({"name": "math_formal_lean", "lean_command": "lean",
                                   "sandbox_url": "http://127.0.0.1:9"})
    with serve(server.create_app()) as url:
        result = verify(url, "  simp")
    assert result["_ng_failure_class"] == "sandbox_failed"
