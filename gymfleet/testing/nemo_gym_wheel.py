"""NeMo-Gym's own published release, unpacked once into a cache: the source of compatibility fixtures (its example
rows, workplace tables) and of the environment folders the corpus bench runs.

`nemo_gym_wheel()` downloads `nemo-gym==NEMO_GYM_VERSION` from the package index with pip (`pip download --no-deps`,
a registry download like any dependency; NeMo-Gym 0.7.0 declares Python >= 3.13, so `--ignore-requires-python`: we
read its files, we do not install it), checks the version its metadata declares, and unpacks it into
`<cache>/nemo_gym-<version>/`. The cache is `$GYMFLEET_CACHE_DIR`, else `$XDG_CACHE_HOME/gymfleet`, else
`~/.cache/gymfleet`. Concurrent callers (pytest-xdist workers) wait on one file lock; the unpacked tree appears by an
atomic rename, so a half-unpacked tree is never read. A second call costs one `stat`.
"""

from __future__ import annotations

import email.parser
import fcntl
import logging
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gymfleet.fleet.cache import cache_dir

log = logging.getLogger(__name__)

NEMO_GYM_VERSION = "0.7.0"
"""The NeMo-Gym release whose behaviour gymfleet follows and whose files the compatibility tests read."""
DOWNLOAD_TIMEOUT_S = 600


class WheelUnavailableError(RuntimeError):
    """NeMo-Gym's wheel could not be downloaded or is not the version asked for; the message says why and the fix."""


def nemo_gym_wheel(version: str = NEMO_GYM_VERSION) -> Path:
    """The root of NeMo-Gym `version`'s unpacked wheel (holding `nemo_gym/`, `resources_servers/`, ...).

    Raises:
        WheelUnavailableError: pip could not download it (no package index reachable), or the wheel declares another
            version.
    """
    target = cache_dir() / f"nemo_gym-{version}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".nemo_gym-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():  # another process unpacked it while we waited
            return target
        log.info("downloading nemo-gym==%s from the package index into %s (once)", version, target)
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            wheel = _download(version, Path(scratch))
            unpacked = Path(scratch) / "unpacked"
            with zipfile.ZipFile(wheel) as archive:
                _check_version(archive, version, wheel)
                archive.extractall(unpacked)
            (unpacked / ".complete").write_text(wheel.name + "\n")
            if target.exists():  # a tree left by an interrupted earlier run (no .complete)
                shutil.rmtree(target)
            unpacked.rename(target)
    return target


def nemo_gym_folder(env: str, version: str = NEMO_GYM_VERSION) -> Path:
    """NeMo-Gym's `resources_servers/<env>/` folder from its wheel.

    Raises:
        FileNotFoundError: the release has no such environment.
    """
    folder = nemo_gym_wheel(version) / "resources_servers" / env
    if not folder.is_dir():
        raise FileNotFoundError(f"nemo-gym {version} has no resources_servers/{env}/ (in {folder.parent})")
    return folder


def _download(version: str, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", f"nemo-gym=={version}", "--no-deps",
               "--ignore-requires-python", "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(into)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise WheelUnavailableError(f"pip download nemo-gym=={version} took over {DOWNLOAD_TIMEOUT_S} s") from exc
    wheels = sorted(into.glob("nemo_gym-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise WheelUnavailableError(
            f"could not download nemo-gym=={version} (pip exit {done.returncode}): {tail}\n"
            f"The compatibility fixtures come from NeMo-Gym's wheel on the package index: allow access to it, or "
            f"unpack the wheel yourself into {cache_dir() / f'nemo_gym-{version}'} and create `.complete` there."
        )
    return wheels[0]


def _check_version(archive: zipfile.ZipFile, version: str, wheel: Path) -> None:
    metadata = next((name for name in archive.namelist() if name.endswith(".dist-info/METADATA")), None)
    if metadata is None:
        raise WheelUnavailableError(f"{wheel.name} has no .dist-info/METADATA")
    declared = email.parser.Parser().parsestr(archive.read(metadata).decode("utf-8"), headersonly=True)["Version"]
    if declared != version:
        raise WheelUnavailableError(f"{wheel.name} declares version {declared}, not {version}")
