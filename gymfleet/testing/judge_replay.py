"""A stand-in judge that answers from recorded rollouts: the corpus bench (`gymfleet.testing.nemo_gym_corpus`) points
a folder's judge model servers here, so a folder that records its judge's calls replays to its recorded rewards on a
machine with no judge model.

NeMo-Gym's judge folders keep each judge call of a rollout with the rollout (`judge_evaluations: [{
responses_create_params, response}]`, or one `judge_evaluation`): `recorded_judge_calls(rows)` finds every such pair
anywhere below a row's top level and keys it by its request's messages (role and text of each `input` item, the
`instructions`); `JudgeReplay(rows)` serves `POST /v1/responses` (and `/responses`) on 127.0.0.1, bound on an
ephemeral port before it is published (no port race), answering a request with the recorded response for the same
messages. A folder whose judge prompt changed since its rollouts were recorded asks in other words: while the bench
replays one row (`replaying(row)`), a request matching no recording gets that row's own recorded judge answers, the
one whose request reads most alike first (`fuzzy` counts those): the verdict its judge gave that rollout. A request
nobody recorded for the row is a 404 naming that, so the folder's judge call fails typed (`judge_failed`), never
with a made-up verdict. `hits` and `misses` count what it answered.
"""

from __future__ import annotations

import difflib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["JudgeReplay", "judge_key", "recorded_judge_calls"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(part.get("text", "")) if isinstance(part, dict) else _text(part) for part in content)
    return ""


def judge_key(request: dict[str, Any]) -> str:
    """What identifies a judge call: its instructions and the role and text of each input message.

    Examples:
        >>> a = judge_key({"input": [{"role": "user", "content": "x"}], "model": "gpt", "temperature": 0})
        >>> a == judge_key({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]})
        True
    """
    items = request.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    messages = [(item.get("role"), _text(item.get("content"))) for item in items or [] if isinstance(item, dict)]
    return json.dumps([request.get("instructions") or "", messages])


def recorded_judge_calls(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every recorded `{responses_create_params, response}` pair below the rows' top level, by `judge_key`."""
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        for key, response in _row_calls(row):
            found.setdefault(key, response)
    return found


def _row_calls(row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """One row's recorded judge calls, (`judge_key`, response), in the order they appear."""
    found: list[tuple[str, dict[str, Any]]] = []

    def walk(node: Any, depth: int) -> None:
        if isinstance(node, dict):
            params, response = node.get("responses_create_params"), node.get("response")
            if depth and isinstance(params, dict) and isinstance(response, dict):
                found.append((judge_key(params), response))
            for key, value in node.items():
                if not (depth == 0 and key in ("responses_create_params", "response")):  # the policy's own turn
                    walk(value, depth + 1)
        elif isinstance(node, list):
            for value in node:
                walk(value, depth + 1)

    walk(row, 0)
    return found


class JudgeReplay:
    """The stand-in judge server (see the module docstring); a context manager: `url` while inside."""

    def __init__(self, rows: list[dict[str, Any]]):
        self.calls = recorded_judge_calls(rows)
        self.hits = self.misses = self.fuzzy = 0
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.missed: list[tuple[str, dict[str, Any]]] = []
        """The first few requests nobody recorded (path, body), to see why."""
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                recorded = replay._answer_for(judge_key(body)) if self.path.rstrip("/").endswith("/responses") \
                    else None
                if recorded is None:
                    replay.misses += 1
                    if len(replay.missed) < 3:
                        replay.missed.append((self.path, body))
                    self._answer(404, {"error": {"message": "no recorded judge answer for this request (stand-in "
                                                            "judge replaying recorded rollouts)"}})
                else:
                    replay.hits += 1
                    self._answer(200, recorded)

            def _answer(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the bench prints a table
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="judge-replay", daemon=True)

    def replaying(self, row: dict[str, Any]) -> None:
        """The row the bench replays now: its recorded judge answers are the fallback for requests in other words."""
        with self._lock:
            self._pending = _row_calls(row)

    def _answer_for(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            exact = self.calls.get(key)
            if exact is not None:
                self._pending = [(k, r) for k, r in self._pending if k != key]
                return exact
            if not self._pending:
                return None
            best = max(self._pending, key=lambda pending: difflib.SequenceMatcher(None, pending[0], key).ratio())
            self._pending.remove(best)
            self.fuzzy += 1
            return best[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> JudgeReplay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
