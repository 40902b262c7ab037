"""The model's tools in a swebench session: their arguments, and the scripts they run in the sandbox.

`bash` runs a command in the repository; `view_file`, `create_file` and `str_replace` run `FILE_TOOL`, which keeps
every path inside the repository. `DIFF_COMMAND` collects the patch that `/verify` grades. The server
(`resources_servers/swebench/app.py`) runs them in the rollout's sandbox session.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class BashArgs(BaseModel):
    command: str
    timeout_s: float | None = Field(default=None, gt=0)


class ViewFileArgs(BaseModel):
    path: str
    start_line: int | None = None
    end_line: int | None = None


class CreateFileArgs(BaseModel):
    path: str
    content: str


class StrReplaceArgs(BaseModel):
    path: str
    old_str: str
    new_str: str


# Runs inside the sandbox (`python3 -I -c`), arguments as JSON on stdin: the file tools, confined to the repository.
FILE_TOOL = r'''
import json, os, sys
args = json.load(sys.stdin)
root = os.path.realpath("/workspace/repo")
path = os.path.realpath(os.path.join(root, args["path"]))
if path != root and not path.startswith(root + os.sep):
    sys.exit("error: the path must be inside the repository (/workspace/repo)")
op = args["op"]
if op == "view":
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name != ".git":
                print(name + ("/" if os.path.isdir(os.path.join(path, name)) else ""))
        sys.exit(0)
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    start = max(args.get("start_line") or 1, 1)
    end = args.get("end_line") or len(lines)
    end = len(lines) if end < 0 else min(end, len(lines))
    for number in range(start, end + 1):
        print(f"{number:6}\t{lines[number - 1]}")
elif op == "create":
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        out.write(args["content"])
    print(f"wrote {len(args['content'])} characters to {os.path.relpath(path, root)}")
elif op == "replace":
    if not os.path.isfile(path):
        sys.exit(f"error: no file {args['path']}")
    text = open(path, encoding="utf-8").read()
    count = text.count(args["old_str"]) if args["old_str"] else 0
    if count != 1:
        sys.exit(f"error: old_str must occur exactly once in {args['path']}; it occurs {count} times")
    start = text.index(args["old_str"])
    text = text[:start] + args["new_str"] + text[start + len(args["old_str"]):]
    with open(path, "w", encoding="utf-8") as out:
        out.write(text)
    first = text.count("\n", 0, start) + 1
    lines = text.splitlines()
    shown = range(max(first - 3, 1), min(first + args["new_str"].count("\n") + 3, len(lines)) + 1)
    print(f"edited {os.path.relpath(path, root)}:")
    for number in shown:
        print(f"{number:6}\t{lines[number - 1]}")
'''
# Bytecode caches that running the code leaves behind are never part of the patch, whatever the session's git config.
NOT_PATCHED = "':(exclude,glob)**/__pycache__/**' ':(exclude,glob)**/*.py[co]'"
DIFF_COMMAND = (
    f"cd /workspace/repo && git add -A -- . {NOT_PATCHED} >/dev/null 2>&1; git -c core.quotepath=off "
    "-c diff.noprefix=false -c diff.mnemonicprefix=false diff --cached --binary --no-color --no-ext-diff "
    f"--no-textconv {{base}} -- . {NOT_PATCHED}"
)
