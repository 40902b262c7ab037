"""The Docker backend without the Docker SDK (after `pip install -e .` alone): `connect` names the extra to install,
whether `import docker` fails or, as it does from the repository root, finds the root's own `docker/` folder (a
Dockerfile and configs: an empty namespace package) instead of the SDK; and so does `ContainerRunner.start`, what the
server calls at start-up. Each case runs in a child process, where the
SDK is hidden from the import system."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

HIDE = {
    "namespace": """
import importlib.machinery
class RepositoryOnly:  # `docker` resolves only as the repository root's folder, as where the SDK is not installed
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [ROOT]) if name == "docker" else None
sys.meta_path.insert(0, RepositoryOnly())
import docker
assert not hasattr(docker, "DockerClient"), docker
""",
    "missing": "sys.modules['docker'] = None\n",
}

CHECK = """
from gymfleet.errors import ConfigError
from resources_servers.swebench.containers import ContainerRunner, connect
for start in (lambda: connect("unix:///nonexistent.sock"), ContainerRunner("localhost/none:x").start):
    try:
        start()
    except ConfigError as exc:
        print(f"ConfigError: {exc}")
"""


@pytest.mark.parametrize("how", sorted(HIDE))
def test_no_docker_sdk_names_the_extra(how):
    script = f"import sys\nROOT = {str(ROOT)!r}\n{HIDE[how]}{CHECK}"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr, done
    errors = done.stdout.split("ConfigError: ")[1:]
    assert len(errors) == 2, done.stdout  # connect, and the runner's start (what the server calls)
    for error in errors:
        assert error.startswith("swebench backend: docker needs the Docker SDK"), error
        assert "pip install -e '.[docker]'" in error and "backend: bwrap" in error
