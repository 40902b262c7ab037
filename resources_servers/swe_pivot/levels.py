"""The PivotRL verifier's levels for one SWE-agent tool call against the expert's (see `app.py` for the rules)."""

from __future__ import annotations

import json
import re
from difflib import SequenceMatcher
from typing import Any

MAX_SIMILARITY_CHARS = 2000
"""Each side of a similarity is cut to this many characters (SequenceMatcher is quadratic)."""
BASH_COMMAND_FLOOR = 0.3
"""Level 1: two bash commands less similar than this are different targets, whatever their verb."""
VIEW_RANGE_COVERAGE = 0.8
"""Level 1: a viewed line range must cover this share of the expected one."""
EDIT_SIZE_NORM = 500
"""Level 4: an edit this many characters long (or longer) takes the whole `diff_size_alpha` penalty."""

_ALIASES: dict[str, tuple[str, ...]] = {
    "edit": (
        "str_replace_editor", "text_editor", "file_editor", "code_editor", "edit_file", "modify_file", "update_file",
        "file_edit", "edit", "modify", "apply_patch", "patch_file", "apply_diff", "apply_changes", "write",
        "write_file", "save_file", "create_file",
    ),
    "bash": (
        "execute_bash", "run_bash", "bash_exec", "shell_run", "shell", "bash", "terminal", "shell_command",
        "shell_cmd", "run_shell_cmd", "exec_command", "exec_cmd",
    ),
    "search": (
        "grep", "search_text", "find_pattern", "text_search", "glob", "find_files", "file_glob", "match_files",
        "grep_files", "search_files", "find_in_files", "code_search", "list_dir", "ls", "show_dir", "ls_dir",
        "list_directory",
    ),
    "read": (
        "read", "read_file", "view_file", "cat_file", "view", "file_view", "inspect", "show_file", "read_file_content",
    ),
    "finish": ("finish", "submit"),
    "think": ("think",),
    "planning": (
        "task_tracker", "todo_tracker", "plan_tracker", "todo_read", "todo_write", "update_plan", "list_tasks",
        "update_tasks", "read_todos", "write_todos", "edit_plan", "modify_plan",
    ),
}  # fmt: skip
TOOL_CATEGORIES: dict[str, str] = {
    form: category
    for category, names in _ALIASES.items()
    for name in names
    for form in (name, name.replace("_", ""))  # snake_case, and CamelCase once lower-cased
}
"""Lower-cased tool name -> category, for the tool names OpenHands, OpenCode, Codex and similar harnesses use."""

_PATH_KEYS = ("path", "file", "file_path", "filename", "file_name")
_COMMAND_KEYS = ("command", "cmd")
_PATH_IN_COMMAND = re.compile(r"""(?:^|(?<=[\s='"(]))((?:/[\w.-]+)+|\.\.?/[\w./-]+|[\w.-]+/[\w./-]+)""")


def tool_category(name: str) -> str:
    """The tool's category (`edit`, `bash`, `search`, `read`, `finish`, `think`, `planning`) or `unknown`."""
    return TOOL_CATEGORIES.get(name.lower(), "unknown")


def similarity(a: str, b: str) -> float:
    """`difflib.SequenceMatcher` ratio of the first `MAX_SIMILARITY_CHARS` characters of each side."""
    return SequenceMatcher(None, a[:MAX_SIMILARITY_CHARS], b[:MAX_SIMILARITY_CHARS]).ratio()


def _first(args: dict[str, Any], keys: tuple[str, ...]) -> str:
    return next((str(args[key]).strip() for key in keys if key in args), "")


def target_path(args: dict[str, Any]) -> str:
    """The file a call works on (`path`, `file`, `file_path`, `filename` or `file_name`), "" when none."""
    return _first(args, _PATH_KEYS)


def shell_command(args: dict[str, Any]) -> str:
    """A bash call's command (`command` or `cmd`), "" when none."""
    return _first(args, _COMMAND_KEYS)


def path_tail(path: str, components: int) -> str:
    """The last `components` parts of a path: repository roots differ between harnesses, file names collide."""
    return "/".join(path.strip("/").split("/")[-components:])


def command_verb(command: str) -> str:
    """The program a shell command runs (`/usr/bin/grep -rn x` -> `grep`)."""
    words = command.split()
    return words[0].rsplit("/", 1)[-1] if words else ""


def command_paths(command: str) -> list[str]:
    """Paths named in a shell command: absolute, `./` or `../` relative, or `dir/file` (longer than 2 chars, and no
    `--option/...`)."""
    return [path for path in _PATH_IN_COMMAND.findall(command) if len(path) > 2 and not path.startswith("--")]


def view_range(value: Any) -> tuple[int, int] | None:
    """`[start, end]` (a list or its JSON text) as two ints, None when absent or malformed."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                           for v in value):
        return value[0], value[1]
    return None


def edit_content(args: dict[str, Any]) -> str:
    """The text an edit writes: `old_str` + `new_str`, else `patch`, `diff`, `content` or `file_text`."""
    if "new_str" in args:
        return f"{args.get('old_str', '')}\n{args['new_str']}"
    for key in ("patch", "diff", "content", "file_text"):
        if key in args:
            return str(args[key])
    return ""


def _edit_target(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    sub_got, sub_want = str(got.get("command", "")), str(want.get("command", ""))
    if sub_want and sub_got != sub_want:
        return f"editor command {sub_got or '(none)'!r}, expected {sub_want!r}"
    path_got, path_want = target_path(got), target_path(want)
    if path_want and path_tail(path_got, 2) != path_tail(path_want, 2):
        return f"edits {path_got or '(no path)'!r}, expected {path_want!r}"
    if sub_want == "view":
        range_got, range_want = view_range(got.get("view_range")), view_range(want.get("view_range"))
        if range_got and range_want:  # no range views the whole file, which covers any range
            overlap = max(0, min(range_got[1], range_want[1]) - max(range_got[0], range_want[0]))
            if overlap / max(1, range_want[1] - range_want[0]) < VIEW_RANGE_COVERAGE:
                return f"views lines {list(range_got)}, expected {list(range_want)}"
    return None


def _bash_target(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    command_got, command_want = shell_command(got), shell_command(want)
    if not command_want:
        return None
    if not command_got:
        return f"no command, expected {command_want[:200]!r}"
    if command_verb(command_got) != command_verb(command_want):
        return f"runs {command_verb(command_got)!r}, expected {command_verb(command_want)!r}"
    tails_got = {path_tail(p.rstrip("/"), 3) for p in command_paths(command_got)} - {""}
    tails_want = {path_tail(p.rstrip("/"), 3) for p in command_paths(command_want)} - {""}
    if tails_got and tails_want and not tails_got & tails_want:
        return f"works on {sorted(tails_got)[:5]}, expected {sorted(tails_want)[:5]}"
    if similarity(command_got, command_want) < BASH_COMMAND_FLOOR:
        return "the command is too different from the expected one"
    return None


def target_mismatch(category_got: str, got: dict[str, Any], category_want: str, want: dict[str, Any]) -> str | None:
    """Level 1: None when the call works on the expected target, else why not."""
    if category_got == category_want == "edit":
        return _edit_target(got, want)
    if category_got == category_want == "bash":
        return _bash_target(got, want)
    if {category_got, category_want} <= {"search", "read"}:
        path_got, path_want = target_path(got), target_path(want)
        if path_want and path_tail(path_got, 3) != path_tail(path_want, 3):
            return f"reads {path_got or '(no path)'!r}, expected {path_want!r}"
    return None


def _side_similarity(got: str, want: str) -> float:
    return similarity(got, want) if got and want else float(got == want)


def argument_similarity(category_got: str, got: dict[str, Any], category_want: str, want: dict[str, Any]) -> float:
    """Level 2: how close the call's content is to the expected one, 0 to 1 (1 where content does not apply)."""
    if category_got == category_want == "edit":
        old_got, old_want = str(got.get("old_str", "")), str(want.get("old_str", ""))
        new_got, new_want = str(got.get("new_str", "")), str(want.get("new_str", ""))
        if (old_got or new_got) and (old_want or new_want):  # both replace: the place and the fix must both match
            return min(_side_similarity(old_got, old_want), _side_similarity(new_got, new_want))
        content_got, content_want = edit_content(got), edit_content(want)
        if content_got and content_want:
            return similarity(content_got, content_want)
        return float(not content_got and not content_want)
    if category_got == category_want == "bash":
        command_got, command_want = shell_command(got), shell_command(want)
        return similarity(command_got, command_want) if command_got and command_want else 1.0
    return 1.0


def edit_size_penalty(category: str, args: dict[str, Any], alpha: float) -> float:
    """Level 4: `alpha · min(len(edit) / 500, 1)` for an edit, 0 otherwise."""
    if category != "edit":
        return 0.0
    return alpha * min(len(edit_content(args)) / EDIT_SIZE_NORM, 1.0)
