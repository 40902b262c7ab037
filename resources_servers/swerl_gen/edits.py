"""swerl_gen's text handling: SEARCH/REPLACE edits out of a model's answer, applied to the files the row carries,
turned into a git patch; and the reproduction test out of a repro-gen answer. Pure functions: nothing here runs
model output (the sandbox does, see app.py). Every function is linear in its input, so a huge answer costs
milliseconds, and every way an answer can be wrong is an `EditError` whose `reason` names it.
"""

from __future__ import annotations

import difflib
import posixpath
from dataclasses import dataclass

from gymfleet.grading.answers import last_tagged
from gymfleet.grading.think import strip_think

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
TEST_DIRS = frozenset({"test", "tests", "testing"})


class EditError(ValueError):
    """The answer's edits cannot be used; `reason` is the response's `reason` field."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Edit:
    """One SEARCH/REPLACE block: in `path`, the first occurrence of `search` (starting a line) becomes `replace`."""

    path: str
    search: str
    replace: str


def visible_text(text: str) -> str:
    """The answer without its reasoning (`gymfleet.grading.think.strip_think`)."""
    return strip_think(text)


def solution_text(visible: str, *, relaxed: bool = False) -> str:
    """The content of the last `<solution>...</solution>` pair; with `relaxed`, the whole text when there is none.

    Raises:
        EditError: `no_solution`.
    """
    found = last_tagged(visible, "solution")
    if found is None:
        if relaxed:
            return visible
        raise EditError("no_solution", "no complete <solution>...</solution> pair after the reasoning")
    return found


def repro_scope(visible: str) -> str:
    """Where repro-gen looks for its script: the last `<solution>` pair's content, or the whole text without one."""
    found = last_tagged(visible, "solution")
    return visible if found is None else found


def parse_edits(solution: str) -> list[Edit]:
    """The SEARCH/REPLACE blocks of `solution`, in order, identical repeats dropped.

    A block is a `### path` line, then `<<<<<<< SEARCH`, the lines to find, `=======`, their replacement and
    `>>>>>>> REPLACE`, each marker alone on its line (fence lines around blocks are ignored, several blocks may
    share one fence, and a block without its own `### path` line edits the previous block's file).

    Raises:
        EditError: `no_edits` (no block at all) or `malformed_edit` (a marker out of place, a block with no path,
            or one left open at the end).
    """
    edits: list[Edit] = []
    seen: set[Edit] = set()
    path: str | None = None
    state, search, replace = "outside", [], []
    for number, raw in enumerate(solution.split("\n"), 1):
        line = raw.rstrip("\r")
        marker = line.rstrip()
        if state == "outside":
            if marker.startswith("### "):
                path = marker[4:].strip()
            elif marker == SEARCH:
                if not path:
                    raise EditError("malformed_edit", f"line {number}: a SEARCH block with no `### path` line")
                state, search, replace = "search", [], []
            elif marker in (DIVIDER, REPLACE):
                raise EditError("malformed_edit", f"line {number}: {marker!r} outside a SEARCH block")
        elif state == "search":
            if marker == DIVIDER:
                state = "replace"
            elif marker in (SEARCH, REPLACE):
                raise EditError("malformed_edit", f"line {number}: {marker!r} before the block's {DIVIDER!r}")
            else:
                search.append(line)
        elif marker == REPLACE:
            edit = Edit(path or "", "\n".join(search), "\n".join(replace))
            if edit not in seen:
                seen.add(edit)
                edits.append(edit)
            state = "outside"
        elif marker in (SEARCH, DIVIDER):
            raise EditError("malformed_edit", f"line {number}: {marker!r} before the block's {REPLACE!r}")
        else:
            replace.append(line)
    if state != "outside":
        raise EditError("malformed_edit", f"the last SEARCH block is not closed by {REPLACE!r}")
    if not edits:
        raise EditError("no_edits", "no SEARCH/REPLACE block in the solution")
    return edits


def is_test_path(path: str, test_files: frozenset[str] = frozenset()) -> bool:
    """Whether `path` is a test file: one the task's test patch touches, a `conftest.py`, a file under a
    `test`/`tests`/`testing` folder, or a `test_*.py` / `*_test.py` / `tests.py` file.

    Examples:
        >>> [is_test_path(p) for p in ("pkg/tests/util.py", "conftest.py", "pkg/test_io.py", "pkg/latest.py")]
        [True, True, True, False]
    """
    parts = path.split("/")
    name = parts[-1]
    return (
        path in test_files
        or name in ("conftest.py", "tests.py")
        or bool(TEST_DIRS.intersection(parts[:-1]))
        or (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
    )


def apply_edits(
    files: dict[str, str], edits: list[Edit], test_files: frozenset[str] = frozenset(), *,
    remove_repo_name: bool = False,
) -> dict[str, str]:
    """The new contents of the files the edits change, each edit applied in order to the file as the earlier
    edits left it. `test_files` are test paths as the grading sees them (see `is_test_path`), that is without the
    repository's name when `remove_repo_name`.

    Raises:
        EditError: `file_not_provided` (a path the row did not show), `edits_tests` (a test file), `empty_search`,
            `no_op_edit` (SEARCH equals REPLACE), `search_not_found` (not at the start of a line of the file as
            it stands), `empty_patch` (the edits change nothing in the end).
    """
    changed: dict[str, str] = {}
    for edit in edits:
        if edit.path not in files:
            shown = ", ".join(sorted(files)[:10])
            raise EditError("file_not_provided", f"{edit.path!r} is not one of the files shown ({shown})")
        if is_test_path(_strip_first(edit.path) if remove_repo_name else edit.path, test_files):
            raise EditError("edits_tests", f"{edit.path!r} is a test file; the tests are the grader's")
        if not edit.search.strip():
            raise EditError("empty_search", f"an edit of {edit.path!r} has an empty SEARCH part")
        if edit.search == edit.replace:
            raise EditError("no_op_edit", f"an edit of {edit.path!r} has identical SEARCH and REPLACE parts")
        current = "\n" + changed.get(edit.path, files[edit.path])
        at = current.find("\n" + edit.search)
        if at == -1:
            first = edit.search.split("\n", 1)[0][:200]
            raise EditError("search_not_found", f"SEARCH text starting {first!r} is not in {edit.path!r}")
        current = current[:at] + "\n" + edit.replace + current[at + 1 + len(edit.search):]
        changed[edit.path] = current[1:]
    changed = {path: text for path, text in changed.items() if text != files[path]}
    if not changed:
        raise EditError("empty_patch", "the edits leave every file as it was")
    return changed


def make_patch(files: dict[str, str], changed: dict[str, str], *, remove_repo_name: bool = False) -> str:
    """A git patch (`diff --git`, 3 lines of context) from `files` to `changed`, in path order; with
    `remove_repo_name`, the first folder of every path (the repository's name) is left out of the patch.

    Examples:
        >>> print(make_patch({"a.py": "x = 1\\n"}, {"a.py": "x = 2\\n"}), end="")
        diff --git a/a.py b/a.py
        --- a/a.py
        +++ b/a.py
        @@ -1 +1 @@
        -x = 1
        +x = 2
    """
    chunks: list[str] = []
    for path in sorted(changed):
        name = _strip_first(path) if remove_repo_name else path
        lines = difflib.unified_diff(_lines(files[path]), _lines(changed[path]), f"a/{name}", f"b/{name}")
        body = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
        if body:
            chunks.append(f"diff --git a/{name} b/{name}\n{body}")
    return "".join(chunks)


def patch_paths(patch: str) -> frozenset[str]:
    """The paths a git patch touches (its `diff --git a/... b/...` lines)."""
    paths: set[str] = set()
    for line in patch.split("\n"):
        if line.startswith("diff --git a/") and " b/" in line:
            old, new = line[len("diff --git a/"):].split(" b/", 1)
            paths.update({posixpath.normpath(old), posixpath.normpath(new)})
    return frozenset(paths)


def last_python_block(text: str) -> str | None:
    """The content of the last ```` ```python ```` fenced block (opening fence line exactly that, closing ```), or
    None. A block left open at the end does not count.

    Examples:
        >>> last_python_block("```python\\nimport sys\\nsys.exit(2)\\n```\\nand\\n```\\nnot python\\n```")
        'import sys\\nsys.exit(2)'
    """
    found: str | None = None
    inside: list[str] | None = None
    for line in text.split("\n"):
        marker = line.strip()
        if inside is None:
            if marker == "```python":
                inside = []
        elif marker == "```":
            found, inside = "\n".join(inside), None
        else:
            inside.append(line.rstrip("\r"))
    return found


def _lines(text: str) -> list[str]:
    """Lines as git sees them: split at "\\n" only (`str.splitlines` also splits at form feeds, "\\r", U+2028...,
    which would make a patch git cannot apply)."""
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]]
    return lines + [pieces[-1]] if pieces[-1] else lines


def _strip_first(path: str) -> str:
    return path.split("/", 1)[1] if "/" in path else path
