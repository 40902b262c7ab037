"""`ng_test +entrypoint=resources_servers/<env>`: run one environment's tests; `ng_test_all`: every environment's.

For each environment this runs, in one `pytest` process from the repository root:
- its own tests (`resources_servers/<env>/tests/`, when the folder exists);
- the conformance test for it (`tests/test_conformance.py::test_environment_conforms[<env>]`);
- `ng_run +dry_run=true` of each of its shipped configs (`tests/test_shipped_configs.py::
  test_dry_run_validates_every_server[...]`).

`ng_test +entrypoint=<path to a NeMo-Gym environment folder>` (one whose `app.py` imports `nemo_gym`, from anywhere)
runs that folder's own shipped tests against gymfleet's `nemo_gym` surface, with NeMo-Gym's pytest settings rather
than gymfleet's (`gymfleet.testing.nemo_gym_folders`: the folder is copied into a scratch tree first).

Options: `"+pytest_args=[-x,-k,not slow]"` (or one string, `"+pytest_args=-x -q"`) is passed on to pytest.
`ng_test_all` takes every folder under `resources_servers/` that has an `app.py`; `"+skip=[swebench,...]"` leaves
some out. The exit code is pytest's (0: all passed; 1: some failed; 5: nothing collected), or 2 for a bad argument.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

from gymfleet.cli import command, command_config
from gymfleet.errors import ConfigError, did_you_mean
from gymfleet.fleet.config_instances import repository_root


def environments(root: Path) -> list[str]:
    """Every environment folder under `<root>/resources_servers` (one with an `app.py`), sorted."""
    folder = root / "resources_servers"
    return sorted(p.name for p in folder.iterdir() if (p / "app.py").is_file()) if folder.is_dir() else []


def environment_of(entrypoint: object, root: Path) -> str:
    """The environment named by `+entrypoint=resources_servers/<env>` (a bare `<env>` is accepted too).

    Raises:
        ConfigError: missing, or not an environment folder (with a did-you-mean over the known ones).
    """
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise ConfigError("entrypoint is required", path="entrypoint",
                          hint="ng_test +entrypoint=resources_servers/<env>")
    path = Path(entrypoint.strip().rstrip("/"))
    known = environments(root)
    if path.parent.name not in ("resources_servers", "") or path.name not in known:
        raise ConfigError(
            f"{entrypoint!r} is not an environment folder (resources_servers/<env> with an app.py)."
            f"{did_you_mean(path.name, known)}",
            path="entrypoint", hint=f"Known environments: {', '.join(known)}.",
        )
    return path.name


def targets(env: str, root: Path) -> list[str]:
    """The pytest targets (paths and node ids, relative to `root`) that test `env`."""
    folder = root / "resources_servers" / env
    found = [f"resources_servers/{env}/tests"] if (folder / "tests").is_dir() else []
    found.append(f"tests/test_conformance.py::test_environment_conforms[{env}]")
    found += [
        f"tests/test_shipped_configs.py::test_dry_run_validates_every_server[resources_servers/{env}/configs/"
        f"{config.name}]"
        for config in sorted((folder / "configs").glob("*.yaml"))
    ]
    return found


def pytest_command(envs: list[str], root: Path, extra: list[str] = ()) -> list[str]:
    """The whole command line: this interpreter's pytest over every target of `envs`, then `extra`."""
    return [sys.executable, "-m", "pytest", *[t for env in envs for t in targets(env, root)], *extra]


def _extra_args(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return [str(item) for item in value]
    raise ConfigError(f"pytest_args: expected a string or a list of strings, got {value!r}", path="pytest_args")


def select_all(root: Path, skip: object = None) -> list[str]:
    """`ng_test_all`'s environments: all of them, less `skip` (each must be a known environment).

    Raises:
        ConfigError: `skip` names an unknown environment, or is not a list.
    """
    known = environments(root)
    skip = [] if skip is None else [skip] if isinstance(skip, str) else skip
    if not isinstance(skip, list):
        raise ConfigError(f"skip: expected a list of environment names, got {skip!r}", path="skip")
    for name in skip:
        if name not in known:
            raise ConfigError(f"skip: {name!r} is not an environment.{did_you_mean(str(name), known)}", path="skip")
    return [env for env in known if env not in skip]


def require_pytest(command_name: str) -> None:
    """The tests run in this interpreter's pytest, which `pip install -e .` alone does not bring.

    Raises:
        ConfigError: pytest is not importable here, naming the install command.
    """
    if importlib.util.find_spec("pytest") is None:
        raise ConfigError(f"{command_name} runs the tests with pytest, which `pip install -e .` does not install",
                          hint="pip install -e '.[test]' (pytest and what the tests use)")


def _run_pytest(command: list[str], root: Path) -> int:
    print("$ " + shlex.join(["python", *command[1:]]), flush=True)
    return subprocess.run(command, cwd=root, check=False).returncode


def _test(argv: list[str]) -> int:
    config = command_config(argv, "ng_test", ("pytest_args",))
    root = repository_root()
    extra = _extra_args(config.data.get("pytest_args"))
    folder = nemo_gym_folder_of(config.data.get("entrypoint"), root)
    env = None if folder is not None else environment_of(config.data.get("entrypoint"), root)
    require_pytest("ng_test")
    if folder is not None:
        return _run_folder_tests(folder, extra)
    return _run_pytest(pytest_command([env], root, extra), root)


def nemo_gym_folder_of(entrypoint: object, root: Path) -> Path | None:
    """The NeMo-Gym folder `+entrypoint` names, when it is one outside gymfleet's own environments; else None."""
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        return None
    from gymfleet.testing.nemo_gym_folders import is_nemo_gym_folder

    folder = Path(entrypoint.strip()).expanduser().resolve()
    if folder.parent == (root / "resources_servers").resolve() or not is_nemo_gym_folder(folder):
        return None
    return folder


def _run_folder_tests(folder: Path, extra: list[str]) -> int:
    import tempfile

    from gymfleet.testing.nemo_gym_folders import run_folder_tests

    if not (folder / "tests").is_dir():
        print(f"{folder} ships no tests/ folder: nothing to run", flush=True)
        return 5  # pytest's "no tests collected"
    with tempfile.TemporaryDirectory(prefix="gymfleet-nemo-gym-tests-") as scratch:
        print(f"Testing NeMo-Gym folder {folder}, where it lies, on gymfleet's nemo_gym surface", flush=True)
        return run_folder_tests(folder, Path(scratch), extra).returncode


def _test_all(argv: list[str]) -> int:
    config = command_config(argv, "ng_test_all", ("pytest_args", "skip"))
    root = repository_root()
    envs = select_all(root, config.data.get("skip"))
    require_pytest("ng_test_all")
    print(f"Testing {len(envs)} environments: {', '.join(envs)}", flush=True)
    return _run_pytest(pytest_command(envs, root, _extra_args(config.data.get("pytest_args"))), root)


main = command(_test, __doc__)


main_all = command(_test_all, __doc__)


if __name__ == "__main__":
    main()
