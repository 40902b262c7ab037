"""swerl_gen's repro-gen runs: each run of a reproduction script prepared the same way, and the grader's canaries.

A reproduction script should exit 2 because the bug is there and 0 because it is fixed, but it runs in the tree it
tests and can look at how that tree was made instead: whether a patch was applied (files newer than the rest, a
`.gymfleet` folder, `git diff` not empty), in which order runs happen, or pick its exit status at random. So:

- Every run is prepared by the same step (`DRIVER`'s `prepare`, before the script starts): the gold patch is
  applied or not, then every file the gold patch touches is rewritten (a fresh file: new inode, mtime and ctime)
  with 1-3 comment lines of random text appended in the file's comment syntax (none for a file type without a known
  one), then the grader's folder is removed. The fixed and the unfixed tree differ in the fix itself, and in
  nothing a run's preparation leaves behind.
- Two more runs, the canaries, once the script has reproduced: an unfixed tree made the way a fixed one is (the
  gold patch applied by the same tool, then taken back out), where it must exit 2 again, and a fixed tree made
  afresh, where it must exit 0 again, each with its own noise. A script keyed on a trace of patching that this
  preparation does not wipe exits 0 in the unfixed canary; one keyed on luck (the noise, the clock, a random
  status) passes all four runs with the square of its odds on the real two. Either scores `tests_tampered` (0).

A script that compares the source text with another copy (the repository's git history, an installed copy) can
still tell the trees apart by the fix's text: that is reading the fix, not reproducing the bug, and no preparation
of the tree can hide it.
"""

from __future__ import annotations

import posixpath
import random
import secrets

from resources_servers.swerl_gen.edits import patch_paths

HASH_COMMENT = frozenset({".py", ".pyi", ".pyx", ".sh", ".bash", ".rb", ".pl", ".pm", ".r", ".yaml", ".yml",
                          ".toml", ".cfg", ".conf", ".mk", ".cmake", ".nim", ".jl", ".ex", ".exs"})
SLASH_COMMENT = frozenset({".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".js", ".jsx", ".mjs", ".ts", ".tsx",
                           ".java", ".go", ".rs", ".swift", ".kt", ".kts", ".scala", ".cs", ".php", ".dart"})
DASH_COMMENT = frozenset({".sql", ".lua", ".hs"})
PREPARE_FAILED = 12
# The `prepare` step of swerl_gen's driver (app.DRIVER): nothing of the task has run yet, so its exit status is the
# truth. `.gymfleet/revert` (the unfixed canary): apply the gold patch, then take it back out. `.gymfleet/noise`
# holds `path<TAB>line` rows: append `line` (none when empty) to `path`, rewritten.
PREPARE = """  prepare)
    if [ -s .gymfleet/gold.patch ]; then git apply --whitespace=nowarn .gymfleet/gold.patch 1>&2 || exit 11; fi
    if [ -e .gymfleet/revert ]; then git apply -R --whitespace=nowarn .gymfleet/gold.patch 1>&2 || exit 12; fi
    while IFS=$'\\t' read -r path line; do
      [ -f "$path" ] || continue
      { cat -- "$path"; [ -z "$(tail -c 1 -- "$path")" ] || echo; [ -z "$line" ] || printf '%s\\n' "$line"; } \\
        > .gymfleet/rewrite || exit 12
      chmod --reference="$path" .gymfleet/rewrite && mv -f .gymfleet/rewrite "$path" || exit 12
    done < .gymfleet/noise
    rm -rf .gymfleet ;;
"""


def comment_line(path: str) -> str:
    """A comment of random text in `path`'s language, or "" when its comment syntax is unknown."""
    extension = posixpath.splitext(path)[1].lower()
    text = " ".join(secrets.token_hex(secrets.randbelow(6) + 2) for _ in range(secrets.randbelow(4) + 1))
    for prefix, extensions in (("#", HASH_COMMENT), ("//", SLASH_COMMENT), ("--", DASH_COMMENT)):
        if extension in extensions:
            return f"{prefix} {text}"
    return ""


TREES = ("unfixed", "fixed", "reverted")
"""How a run's tree is made: as it is; with the gold patch; with the gold patch applied and taken back out."""


def run_files(script: str, gold_patch: str, tree: str) -> dict[str, str]:
    """The files of one run making `tree` (`TREES`): the script, the gold patch, fresh noise for the files the
    patch touches."""
    rng = random.SystemRandom()
    paths = sorted(path for path in patch_paths(gold_patch) if "\t" not in path and "\n" not in path)
    rows = [f"{path}\t{comment_line(path)}" for path in paths for _ in range(rng.randint(1, 3))]
    files = {"reproduce_bug.py": script, ".gymfleet/gold.patch": gold_patch if tree != "unfixed" else "",
             ".gymfleet/noise": "".join(row + "\n" for row in rows)}
    return files | ({".gymfleet/revert": ""} if tree == "reverted" else {})


def canary_verdict(unfixed: int | None, fixed: int | None) -> str | None:
    """Why the canary runs (exit statuses, None for a run that timed out or was killed) show the script keyed on
    something other than the fix, or None."""
    if unfixed != 2:
        return f"the grader's unfixed canary run exited {unfixed} (2 wanted, as in the real unfixed run)"
    if fixed != 0:
        return f"the grader's fixed canary run exited {fixed} (0 wanted, as in the real fixed run)"
    return None
