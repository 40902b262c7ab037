"""A server folder's `requirements.txt` against the fleet's environment, and the folder's own environment when they
conflict.

NeMo-Gym gives every server folder a virtualenv of its own, made from its `requirements.txt` (`-e nemo-gym[dev] @
../../` plus the folder's libraries). gymfleet serves from one environment (ARCHITECTURE, decision 2), so
`check_requirements(folder)` sorts each requirement (markers evaluated, `-r` includes followed):

- the `nemo-gym` line is satisfied by gymfleet itself (its `nemo_gym` surface), whatever extras it names;
- **satisfied**: installed here in a version the specifier allows: the folder runs in the shared environment;
- **missing**: not installed here: installable into the shared environment. ng_run says what to install and stops,
  or installs it (`uv pip install` into this interpreter) with `+folder_requirements=install`;
- **conflicting**: installed in a version the folder excludes (`math-verify==0.8.0` where the fleet has 0.9): the
  folder runs in an environment of its own (`folder_python`), made with `uv` over this one
  (`--system-site-packages`, so gymfleet itself comes from the fleet's environment), its requirements installed there
  with everything else the fleet has pinned at the fleet's versions (constraints; a pin the folder's requirements rule
  out is let go, unless gymfleet's core stack, `CORE`, needs it: then the folder is refused, naming the package). A
  progress line says so while it is made; it is cached under `<cache>/folder_envs/<hash>` keyed by the requirements'
  content, this Python and the fleet's versions, so the second start is instant.
  `+folder_requirements=venv` gives a folder with missing requirements its own environment too.

A folder set up with a `pyproject.toml` instead (NeMo-Gym's other layout) is read from its `[project].dependencies`,
each taken from where its `[tool.uv.sources]` says (a git repository, a path), as uv takes it there.
What NeMo-Gym's venv installs from elsewhere than the index is installed the same way: a direct reference (`name @
git+https://...`) counts as satisfied when a distribution of that name is installed here, else missing; a bare URL
(`git+https://...#egg=x`, a wheel's `https://...whl`) and a local path (`-e ./vendored[extra]`, relative to the
requirements file) are missing unless the named project is installed, and installed from there (a local path as an
absolute one; editable or not, its files are the folder's). Other lines (`--index-url`, a path that does not exist)
are reported, never silently dropped: such a folder is said to need them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from gymfleet.errors import ConfigError
from gymfleet.fleet.cache import cache_dir

log = logging.getLogger(__name__)

POLICIES = ("check", "install", "venv")
"""Values of the top-level `folder_requirements` key (see the module docstring); `check` is the default."""
NEMO_GYM = "nemo-gym"
INSTALL_TIMEOUT_S = 1800


@dataclass
class FolderRequirements:
    """A folder's requirements sorted against this interpreter's environment."""

    folder: Path
    satisfied: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    conflicting: list[str] = field(default_factory=list)
    """`"<requirement> (installed <version>)"` for each requirement this environment's version violates."""
    unsupported: list[str] = field(default_factory=list)
    """Lines that are not plain requirements (an index option, a URL, a local path), with their file and line."""
    lines: list[str] = field(default_factory=list)
    """Every requirement but NeMo-Gym's own line, as written: what the folder's own environment installs."""
    implied: dict[str, str] = field(default_factory=dict)
    """`{requirement: "<file>:<line>"}`: what the folder imports from NeMo-Gym's own dependencies without listing it
    (`gymfleet.fleet.folder_imports`), counted in `missing` and `lines` too."""

    @property
    def shared_ok(self) -> bool:
        return not (self.missing or self.conflicting or self.unsupported)

    def summary(self) -> str:
        parts = []
        if self.conflicting:
            parts.append("conflicting with this environment: " + ", ".join(self.conflicting))
        if self.missing:
            parts.append("not installed: " + ", ".join(self.missing) + self.implied_note())
        if self.unsupported:
            parts.append("not plain requirements: " + ", ".join(self.unsupported))
        return "; ".join(parts) or "all satisfied"

    def implied_note(self) -> str:
        if not self.implied:
            return ""
        where = ", ".join(f"{req} by {at}" for req, at in self.implied.items())
        return (f" (imported without being listed: {where}; NeMo-Gym's own dependencies bring them to its venv, "
                "gymfleet's do not)")


def check_requirements(folder: Path, tests: bool = False) -> FolderRequirements:
    """Sort `folder/requirements.txt` (none: nothing to install) against this interpreter's packages, plus what the
    folder imports from NeMo-Gym's own dependencies without listing it (with `tests`, its tests' imports too)."""
    from gymfleet.fleet.folder_imports import implied_requirements

    result = FolderRequirements(Path(folder))
    path = Path(folder) / "requirements.txt"
    if path.is_file():
        _sort_file(path, result, seen=set())
    elif (Path(folder) / "pyproject.toml").is_file():  # NeMo-Gym's other venv setup: [project].dependencies
        import tomllib

        data = tomllib.loads((Path(folder) / "pyproject.toml").read_text())
        sources = ((data.get("tool") or {}).get("uv") or {}).get("sources") or {}
        for text in (data.get("project") or {}).get("dependencies") or []:
            _sort_line(_with_source(str(text), sources), "pyproject.toml", 0, Path(folder), result)
    listed = {name for name in map(_name_of, result.lines) if name}
    for requirement, where in implied_requirements(Path(folder), tests=tests).items():
        if _name_of(requirement) not in listed:
            result.implied[requirement] = where
            result.lines.append(requirement)
            result.missing.append(requirement)
    return result


def _with_source(text: str, sources: dict) -> str:
    """A `[project].dependencies` entry with where `[tool.uv.sources]` takes it from: a git source as a direct
    reference (`name @ git+<url>@<rev>`), a path source as that path; else as written."""
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return text
    source = sources.get(requirement.name) or sources.get(canonicalize_name(requirement.name))
    if not isinstance(source, dict):
        return text
    extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
    if source.get("git"):
        rev = source.get("rev") or source.get("tag") or source.get("branch")
        return f"{requirement.name}{extras} @ git+{source['git']}" + (f"@{rev}" if rev else "")
    if source.get("path"):
        path = str(source["path"])
        return (path if path.startswith((".", "/")) else f"./{path}") + extras
    return text


def _sort_file(path: Path, result: FolderRequirements, seen: set[Path]) -> None:
    if path.resolve() in seen:
        return
    seen.add(path.resolve())
    for number, raw in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            _sort_file(path.parent / line.split(None, 1)[1], result, seen)
            continue
        _sort_line(line, path.name, number, path.parent, result)


def _sort_line(line: str, where: str, number: int, folder: Path, result: FolderRequirements) -> None:
    """Sort one requirement line (`where`:`number` names it in messages)."""
    editable = line.startswith(("-e ", "--editable "))
    text = line.split(None, 1)[1] if editable else line
    if _is_tree_root(folder, text):
        return  # `-e ../..`: the NeMo-Gym checkout the folder lies in, which gymfleet stands in for
    elsewhere = _from_elsewhere(folder, text)
    if elsewhere is not None:
        installable, name = elsewhere
        if not installable:
            result.unsupported.append(f"{text!r} ({where}:{number}: no such folder)")
            return
        result.lines.append(installable)
        (result.satisfied if name and _installed(name) else result.missing).append(installable)
        return
    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        result.unsupported.append(f"{text!r} ({where}:{number})")
        return
    if canonicalize_name(requirement.name) == NEMO_GYM:
        return  # gymfleet's nemo_gym surface stands in for NeMo-Gym itself
    if requirement.marker is not None and not requirement.marker.evaluate():
        return
    if requirement.url:  # `name @ git+https://...`: NeMo-Gym's venv installs it from there
        result.lines.append(str(requirement))
        (result.satisfied if _installed(requirement.name) else result.missing).append(str(requirement))
        return
    if editable:
        result.unsupported.append(f"{text!r} ({where}:{number})")
        return
    result.lines.append(str(requirement))
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        result.missing.append(str(requirement))
        return
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        result.conflicting.append(f"{requirement} (installed {installed})")
    else:
        result.satisfied.append(str(requirement))


_URL = re.compile(r"^(git\+|hg\+|svn\+|bzr\+)?(https?|ssh|file)://", re.I)
_LOCAL = re.compile(r"^(?P<path>(\.{1,2}/|/)[^\[\]]*?)(?P<extras>\[[^\]]*\])?$")


def _from_elsewhere(folder: Path, text: str) -> tuple[str, str | None] | None:
    """For a bare URL or a local path: what uv installs (a local path made absolute; "" when it does not exist) and
    the project's name where it is known (`#egg=`, a path's `pyproject.toml`); None for any other line."""
    if _URL.match(text):
        egg = re.search(r"[#&]egg=([A-Za-z0-9_.\-]+)", text)
        return text, egg.group(1) if egg else None
    local = _LOCAL.match(text)
    if local is None:
        return None
    path = (folder / local.group("path")).resolve()
    if not path.is_dir():
        return "", None
    name = None
    if (path / "pyproject.toml").is_file():
        import tomllib

        name = (tomllib.loads((path / "pyproject.toml").read_text()).get("project") or {}).get("name")
    return f"{path}{local.group('extras') or ''}", name


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _name_of(line: str) -> str | None:
    try:
        return canonicalize_name(Requirement(line).name)
    except InvalidRequirement:
        return None  # a bare URL or a local path


def _is_tree_root(folder: Path, text: str) -> bool:
    """Whether a requirement line is a local path to the NeMo-Gym tree that holds `folder` (it has `nemo_gym/`)."""
    if not text.startswith((".", "/")):
        return False
    target = (folder / re.sub(r"\[[^\]]*\]$", "", text)).resolve()  # extras (`../..[dev]`) name no folder
    return target in folder.resolve().parents and (target / "nemo_gym").is_dir()


def folder_python(folder: Path, policy: str = "check", say: Callable[[str], None] = print,
                  cache: Path | None = None, tests: bool = False) -> str:
    """The interpreter that serves `folder` (with `tests`, that runs its tests too): this one when the shared
    environment satisfies its requirements (after installing the missing ones with `policy="install"`), else the
    folder's own cached environment's.

    Raises:
        ConfigError: requirements this environment lacks (`policy="check"`), lines gymfleet cannot install, an
            unknown policy, or an install that failed; the message names the folder and the fix.
    """
    if policy not in POLICIES:
        raise ConfigError(f"folder_requirements: unknown value {policy!r}; choices: {', '.join(POLICIES)}",
                          path="folder_requirements")
    reqs = check_requirements(folder, tests=tests)
    where = f"{folder}/requirements.txt"
    if reqs.unsupported:
        raise ConfigError(f"{where}: cannot install {', '.join(reqs.unsupported)}", path="folder_requirements",
                          hint="Install them into this environment yourself, or make them plain requirements.")
    if reqs.shared_ok:
        return sys.executable
    if not reqs.conflicting and policy == "check":
        raise ConfigError(
            f"{where}: not installed here: {', '.join(reqs.missing)}{reqs.implied_note()}", path="folder_requirements",
            hint=f"Install them (pip install {' '.join(_quoted(reqs.missing))}), or start with "
                 "+folder_requirements=install (into this environment) or +folder_requirements=venv (its own).")
    if not reqs.conflicting and policy == "install":
        say(f"{folder.name}: installing {', '.join(reqs.missing)} into this environment")
        with tempfile.TemporaryDirectory() as scratch:
            constraints = Path(scratch) / "constraints.txt"  # nothing the fleet has changes version
            constraints.write_text("".join(f"{name}=={version}\n" for name, version in
                                           installed_closure(["gymfleet"]).items() if name != "gymfleet"))
            _uv(["pip", "install", "--python", sys.executable, "-c", str(constraints), *reqs.missing], where)
        return sys.executable
    return str(own_environment(reqs, say, cache) / "bin" / "python")


def own_environment(reqs: FolderRequirements, say: Callable[[str], None] = print, cache: Path | None = None) -> Path:
    """The folder's own environment (made once per requirements content and Python, under a file lock)."""
    fleet = [f"{name}=={version}" for name, version in sorted(installed_closure(["gymfleet"]).items())]
    key = hashlib.sha256("\n".join([sys.version, *sorted(reqs.lines), *fleet]).encode()).hexdigest()[:16]
    base = (cache or cache_dir()) / "folder_envs"
    target = base / key
    if (target / ".complete").exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        why = "; ".join(filter(None, [", ".join(reqs.conflicting) and "conflicting: " + ", ".join(reqs.conflicting),
                                      ", ".join(reqs.missing) and "missing: " + ", ".join(reqs.missing)]))
        say(f"{reqs.folder.name}: making its own environment with uv ({why}) in {target}; once, cached")
        with tempfile.TemporaryDirectory(dir=base) as scratch:
            venv = Path(scratch) / "venv"
            where = f"{reqs.folder}/requirements.txt"
            _uv(["venv", "--quiet", "--system-site-packages", "--python", sys.executable, str(venv)], where)
            _install_pinned(venv / "bin" / "python", reqs, Path(scratch) / "constraints.txt", where)
            (venv / ".complete").write_text("\n".join(reqs.lines) + "\n")
            if target.exists():
                shutil.rmtree(target)
            venv.rename(target)
        say(f"{reqs.folder.name}: its own environment is ready")
    return target


CORE = ("fastapi", "uvicorn", "pydantic", "aiohttp", "omegaconf", "pyyaml", "prometheus-client", "psutil", "orjson",
        "packaging")
"""What every gymfleet server process imports: the folder's own environment keeps these (and their dependencies) at
the fleet's versions, or is refused."""
MAX_RELAXED = 12


def installed_closure(names: Iterable[str]) -> dict[str, str]:
    """`{name: installed version}` of the distributions `names` and, recursively, what they require."""
    found: dict[str, str] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[name] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


_PINNED_NAME = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.\-]*)==")
"""A `name==version` in uv's explanation of a failed resolution: the pins it names are what stood in the way."""


def _install_pinned(python: Path, reqs: FolderRequirements, constraints: Path, where: str) -> None:
    """Install the folder's requirements into its environment, everything else pinned at the fleet's versions (uv
    does not count the fleet's packages as installed, and a newer pydantic there would change gymfleet itself).
    A pin the folder's requirements rule out is let go, one at a time, unless gymfleet's core needs it."""
    own = {name for name in map(_name_of, reqs.lines) if name}
    core = set(installed_closure(CORE))
    pins = {name: version for name, version in installed_closure(["gymfleet"]).items()
            if name not in own and name != "gymfleet"}
    for _ in range(MAX_RELAXED):
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
        done = _uv(["pip", "install", "--python", str(python), "-c", str(constraints), *reqs.lines], where,
                   check=False)
        if done.returncode == 0:
            return
        text = done.stderr or done.stdout
        names = {canonicalize_name(name) for name in _PINNED_NAME.findall(text)} & set(pins)
        if not names:
            break
        if names & core:
            clash = ", ".join(sorted(names & core))
            raise ConfigError(f"{where}: its requirements conflict with gymfleet's own {clash} "
                              f"({', '.join(reqs.lines)})", path="folder_requirements",
                              hint="Relax the pin in the folder's requirements.txt.")
        for name in names:
            pins.pop(name)
    raise ConfigError(f"{where}: uv could not install {', '.join(reqs.lines)}: "
                      + " ".join((done.stderr or done.stdout).strip().splitlines()[-3:]), path="folder_requirements")


def _uv(args: list[str], where: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        import uv
    except ImportError:
        raise ConfigError(f"{where}: needs its own environment, made with uv, which is not installed",
                          path="folder_requirements", hint="pip install uv (gymfleet's `folders` extra)") from None
    done = subprocess.run([uv.find_uv_bin(), *args], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, env={**os.environ, "UV_NO_PROGRESS": "1"})
    if check and done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"{where}: uv {args[0]} failed: {tail}", path="folder_requirements")
    return done


def _quoted(items: list[str]) -> list[str]:
    return [f"'{item}'" if any(c in item for c in "<>=!~;[ ") else item for item in items]
