"""Repository snapshots for swebench: a task's repository at its base commit, history truncated, as a tar archive.

A row names its repository with `repo_source`: a git bundle (`*.bundle`), a git repository folder, or a tar archive
(`.tar`, `.tar.gz`, `.tgz`, `.tar.xz`, `.tar.bz2`) of one (with or without `.git`). Paths are absolute or relative
to the repository root. The snapshot is a clone checked out at `base_commit` on a branch `main` whose only history
is the base commit's ancestry: other branches, tags, remotes, reflogs and unreachable objects (a later fix) are gone.
An archive without `.git` becomes a one-commit repository (its commit id is then ours, not the row's).

SWE-bench rows without `repo_source` need the instance's container image (`image_for`), which this host may lack.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gymfleet.fleet.config_instances import repository_root
from gymfleet.grading.sandbox_client import tar_directory

log = logging.getLogger(__name__)

REPO_DIR = "repo"
"""The repository's folder in the sandbox workspace (`/workspace/repo`); grading files sit beside it."""
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2")
GIT_ENV = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
           "GIT_AUTHOR_NAME": "gymfleet", "GIT_AUTHOR_EMAIL": "swebench@gymfleet.invalid",
           "GIT_COMMITTER_NAME": "gymfleet", "GIT_COMMITTER_EMAIL": "swebench@gymfleet.invalid", "LC_ALL": "C"}
TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_CONFIG_FILES = frozenset({"conftest.py", "pytest.ini"})
# `diff --git a/x.py b/x.py` and `--- a/x.py` / `+++ b/x.py` / `rename from x.py` name the files a patch touches;
# quoted names (`"a/sp ace.py"`) are git's for unusual characters. `+++ /dev/null` (a deletion) names none.
DIFF_GIT = re.compile(r'^diff --git ("?a/.+?"?) ("?b/.+"?)$')
FILE_LINE = re.compile(r'^(?:---|\+\+\+) ("?[ab]/.+?"?)(?:\t.*)?$')
RENAME_LINE = re.compile(r"^(?:rename|copy) (?:from|to) (.+)$")


class RepoSourceError(Exception):
    """The row's repository cannot be prepared (a missing source, an unknown commit): bad data, not the model."""


@dataclass(frozen=True)
class Snapshot:
    """A repository at its base commit: a gzipped tar with the repository under `repo/`, and that commit's id."""

    archive: bytes
    base_commit: str


class Snapshots:
    """Builds snapshots once per (source, commit) and keeps them in memory (they are a few KiB for our tasks)."""

    def __init__(self, max_entries: int = 256):
        self.max_entries = max_entries
        self._built: dict[tuple[str, str], Snapshot] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def get(self, source: str, base_commit: str | None) -> Snapshot:
        """The snapshot of `source` at `base_commit` (the default branch's head when None).

        Raises:
            RepoSourceError: the source is missing or not a repository, or the commit is not in it.
        """
        path = resolve_source(source)
        key = (f"{path}@{path.stat().st_mtime_ns}", base_commit or "")  # a regenerated bundle is rebuilt
        if key in self._built:
            return self._built[key]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._built:
                snapshot = await asyncio.to_thread(build_snapshot, path, base_commit)
                if len(self._built) >= self.max_entries:
                    self._built.pop(next(iter(self._built)))
                self._built[key] = snapshot
        return self._built[key]


SNAPSHOTS = Snapshots()
"""The process's snapshots, shared by its servers."""


def resolve_source(source: str) -> Path:
    """`repo_source` as a path (relative ones against the repository root, then the working directory).

    Raises:
        RepoSourceError: nothing is there.
    """
    path = Path(source)
    candidates = [path] if path.is_absolute() else [repository_root() / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.exists():
            return candidate.resolve()
    raise RepoSourceError(f"repo_source {source!r} not found (looked at {[str(c) for c in candidates]})")


def git(cwd: Path, *args: str) -> str:
    """Run git without user or system config.

    Raises:
        RepoSourceError: git failed (its message is kept).
    """
    done = subprocess.run(["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        raise RepoSourceError(f"git {' '.join(args)}: {done.stderr.strip()[-500:]}")
    return done.stdout


def build_snapshot(source: Path, base_commit: str | None) -> Snapshot:
    """Clone or unpack `source`, check out `base_commit` and drop everything not in its history (blocking).

    Raises:
        RepoSourceError: as `Snapshots.get`.
    """
    with tempfile.TemporaryDirectory(prefix="gymfleet-swebench-") as folder:
        work = Path(folder) / REPO_DIR
        if source.is_dir() or source.suffix == ".bundle":
            git(Path(folder), "clone", "-q", "--no-hardlinks", "--no-checkout", str(source), REPO_DIR)
        elif source.name.endswith(ARCHIVE_SUFFIXES):
            _unpack(source, work)
        else:
            raise RepoSourceError(f"repo_source {str(source)!r} is neither a git bundle (.bundle), a repository "
                                  f"folder nor a tar archive ({', '.join(ARCHIVE_SUFFIXES)})")
        if not (work / ".git").exists():
            git(work, "init", "-q", "-b", "main")
            git(work, "add", "-A")
            git(work, "commit", "-q", "--allow-empty", "-m", "base")
        commit = base_commit or "HEAD"
        try:
            git(work, "checkout", "-q", "-f", "-B", "main", f"{commit}^{{commit}}")
        except RepoSourceError as exc:
            raise RepoSourceError(f"base_commit {commit} is not in {source}: {exc}") from None
        _truncate_history(work)
        head = git(work, "rev-parse", "HEAD").strip()
        return Snapshot(tar_directory(folder, exclude=()), head)


def _unpack(archive: Path, work: Path) -> None:
    work.mkdir()
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise RepoSourceError(f"cannot unpack {archive}: {exc}") from exc
    entries = list(work.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and entries[0].name != ".git":  # `project-1.0/...`: its content
        inner = entries[0]
        for child in inner.iterdir():
            shutil.move(str(child), work / child.name)
        inner.rmdir()


def _truncate_history(work: Path) -> None:
    """Keep only `main` (the base commit's ancestry): the clone's remote, other branches and tags, and reflogs go,
    and `gc` drops the objects nothing reaches any more (a later commit holding the fix)."""
    for ref in git(work, "for-each-ref", "--format=%(refname)").split():
        if ref != "refs/heads/main":
            git(work, "update-ref", "-d", ref)
    for remote in git(work, "remote").split():
        git(work, "remote", "remove", remote)
    git(work, "reflog", "expire", "--expire=now", "--all")
    git(work, "gc", "-q", "--prune=now")


def patch_paths(patch: str) -> set[str]:
    """Every file a unified/git diff names, old and new names alike.

    Examples:
        >>> sorted(patch_paths("diff --git a/x.py b/y.py\\nrename from x.py\\nrename to y.py\\n"))
        ['x.py', 'y.py']
    """
    found: set[str] = set()
    for line in patch.splitlines():
        if match := DIFF_GIT.match(line):
            found.update(_unprefix(name) for name in match.groups())
        elif match := FILE_LINE.match(line):
            found.add(_unprefix(match.group(1)))
        elif match := RENAME_LINE.match(line):
            found.add(_unquote(match.group(1)))
    return found


def _unquote(name: str) -> str:
    if len(name) >= 2 and name.startswith('"') and name.endswith('"'):
        return name[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode(
            "utf-8", "replace")
    return name


def _unprefix(name: str) -> str:
    name = _unquote(name)
    return name[2:] if name[:2] in ("a/", "b/") else name


def is_test_path(path: str) -> bool:
    """Whether a repository path is a test file or test configuration, which a model's patch may not touch.

    Examples:
        >>> [is_test_path(p) for p in ("tests/test_a.py", "pkg/test_b.py", "pkg/b_test.py", "conftest.py", "pkg/a.py")]
        [True, True, True, True, False]
    """
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    name = parts[-1]
    return (any(part in TEST_DIRS for part in parts[:-1]) or name in TEST_CONFIG_FILES
            or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"))


def image_for(row: dict) -> str:
    """The container image an SWE-bench instance runs in: the row's `image` if it names one, else SWE-bench's
    published evaluation image for the instance (`swebench/sweb.eval.x86_64.<id with __ as _1776_>:latest`)."""
    named = row.get("image") or row.get("docker_image") or row.get("image_name")
    if isinstance(named, str) and named:
        return named
    instance = str(row.get("instance_id") or "unknown").lower().replace("__", "_1776_")
    return f"swebench/sweb.eval.x86_64.{instance}:latest"


def image_help(image: str) -> str:
    """How to get `image` onto a host, in words."""
    return (f"it needs the container image {image}, which is not available here. On a host with a running Docker "
            f"engine, `docker pull {image}` (or build it with SWE-bench's harness) and run this environment with "
            "`backend: docker`; or give the row a `repo_source` (git bundle, repository folder or tar archive) "
            "to run it in the bubblewrap sandbox.")
