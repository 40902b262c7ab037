"""A rollout collection's output files: written a whole line at a time, read back to resume.

- `rollout_key`: the `(task, rollout)` identity of a rollout; `read_results`: the rows of an output file (a line cut
  off by a crash is dropped).
- `JsonlFile`: an output written unbuffered, whole lines only; `replace_file`: a file replaced at once.
- `supersede_failures`: failure rows whose rollout has since succeeded are marked `"_ng_superseded": true`.
- `OutputError`: an output file could not be written (`ng_collect_rollouts`: exit code 4).

The collection itself is `gymfleet.rollouts.collect`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from gymfleet.errors import DataError, GymfleetError
from gymfleet.rollouts.rows import json_object

log = logging.getLogger(__name__)


def rollout_key(row: dict[str, Any]) -> tuple[bytes, bytes]:
    """`(task, rollout)` identity of a rollout, hashable whatever JSON type the task index has."""
    return orjson.dumps(row.get("_ng_task_index")), orjson.dumps(row.get("_ng_rollout_index"))


def read_results(path: Path) -> list[dict[str, Any]]:
    """The JSON objects in an output file; a truncated last line (crash mid-write) is dropped from the file.

    Raises:
        DataError: a line other than the last is not a JSON object.
    """
    if not path.exists():
        return []
    content = path.read_bytes()
    rows: list[dict[str, Any]] = []
    offset = 0
    lines = content.split(b"\n")
    for lineno, line in enumerate(lines, 1):
        start, offset = offset, offset + len(line) + 1
        if not line.strip():
            continue
        row = json_object(line)
        if row is not None:
            rows.append(row)
            continue
        if any(rest.strip() for rest in lines[lineno:]):
            raise DataError("not a JSON object; fix or delete the line, then resume", file=str(path), line=lineno)
        log.warning("%s:%d: dropping a truncated last line (interrupted write)", path, lineno)
        with path.open("r+b") as handle:
            handle.truncate(start)
        return rows
    if content and not content.endswith(b"\n"):
        with path.open("ab") as handle:
            handle.write(b"\n")
    return rows



def supersede_failures(path: Path, done: set[tuple[bytes, bytes]]) -> int:
    """Mark the failure rows whose rollout is in `done` with `"_ng_superseded": true` (rewriting the file in one
    `os.replace`); return how many were newly marked."""
    failures = read_results(path)
    stale = [row for row in failures if not row.get("_ng_superseded") and rollout_key(row) in done]
    if not stale:
        return 0
    for row in stale:
        row["_ng_superseded"] = True
    replace_file(path, b"".join(orjson.dumps(row) + b"\n" for row in failures))
    return len(stale)


class OutputError(GymfleetError):
    """An output file could not be written (no space left, file too large, ...); what it held before is intact."""


def _output_error(path: Path, exc: OSError, what: str) -> OutputError:
    reason = f"{os.strerror(exc.errno)} [errno {exc.errno}]" if exc.errno else str(exc)
    return OutputError(
        f"cannot write {path}: {reason}. {what} Free space on that disk (or raise the file size limit), then rerun "
        "with +resume_from_cache=true: it runs exactly the rollouts the output does not hold yet.")


class JsonlFile:
    """An output file written a whole line at a time, unbuffered: each line is on disk once `write_lines` returns
    (a crash loses no finished rollout), and a write that fails (disk full) is undone, so the file holds only
    whole lines; the failure is an `OutputError` naming the file."""

    CHUNK_BYTES = 1 << 20

    def __init__(self, path: Path, mode: str) -> None:
        self.path = path
        try:
            self._file = open(path, mode, buffering=0)
        except OSError as exc:
            raise _output_error(path, exc, "Nothing was written to it.") from None

    def __enter__(self) -> JsonlFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def write_lines(self, lines: Iterable[bytes]) -> None:
        """Append `lines` (each ending in a newline), in chunks of whole lines."""
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            chunk.append(line)
            size += len(line)
            if size >= self.CHUNK_BYTES:
                self._append(b"".join(chunk))
                chunk, size = [], 0
        if chunk:
            self._append(b"".join(chunk))

    def _append(self, data: bytes) -> None:
        fd = self._file.fileno()
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[self._file.write(view):]
        except OSError as exc:
            with contextlib.suppress(OSError):  # shrinking a file needs no space
                os.ftruncate(fd, start)
            raise _output_error(self.path, exc, "The collection stopped; every line written before is whole (the "
                                "one being written was removed).") from None


def replace_file(path: Path, content: bytes) -> None:
    """Write `content` to `path` at once (a scratch file, then `os.replace`): a failed write leaves `path` as it was.

    Raises:
        OutputError: the scratch file could not be written (it is removed).
    """
    scratch = path.with_name(path.name + ".tmp")
    try:
        scratch.write_bytes(content)
        os.replace(scratch, path)
    except OSError as exc:
        scratch.unlink(missing_ok=True)
        raise _output_error(path, exc, "It is unchanged; every rollout is saved.") from None
