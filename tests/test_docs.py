"""Every command the docs show runs: the fenced `bash` blocks of README.md and docs/*.md, each run as written.

A block runs in a scratch folder of its own (the repository's folders linked in, so relative paths resolve and
outputs stay out of the checkout) against one shared fleet. An HTML comment on the line before a block says how it
runs, when not as written against the shared fleet:

- `<!-- doc-test: fleet -->`: the block starts the shared fleet (exactly one block in the docs has this mark); the
  test runs it in the background and waits until every server is live.
- `<!-- doc-test: own-fleet -->`: the block starts a fleet of its own (e.g. `ng_e2e_collect_rollouts`); it runs as
  written, with its head server on a free port instead of the shared fleet's.
- `<!-- doc-test: checkout -->`: the block writes into the checkout (e.g. `ng_init_resources_server`): it runs in a
  scratch checkout holding copies of `gymfleet/` and `tests/` and its own `resources_servers/` (the environments
  linked in), on that copy's code.
- `<!-- doc-test: parse: <why it cannot run here> -->`: it cannot run here (a GPU model endpoint, Docker, a cluster,
  installing into the environment, ...). The reason is required. Each command still runs, so its command line at
  least parses: an `ng_run` (or `gym env start`) with `+dry_run=true` (the whole config is validated), any other
  command with `--help` (after its sub-command words, e.g. `docker compose ps --help`, `python bench/x.py --help`).

A block that exits non-zero fails its test, with its output.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gymfleet.serving.provenance import docstring_version
from gymfleet.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:^<!--\s*doc-test:\s*(?P<mark>.*?)\s*-->\n)?^```bash\n(?P<body>.*?)^```\n", re.M | re.S)
MODES = ("run", "fleet", "own-fleet", "checkout", "parse", "help")
BLOCK_TIMEOUT_S = 300
FLEET_TIMEOUT_S = 180


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    mode: str
    reason: str
    body: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            mark = match["mark"] or "run"
            mode, _, reason = mark.partition(":")
            line = text.count("\n", 0, match.start("body"))  # the line of the opening fence
            found.append(Block(path, line, mode.strip(), reason.strip(), match["body"]))
    return found


BLOCKS = blocks()


def commands(body: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped, `&&` chains split,
    leading `VAR=value` assignments dropped."""
    found = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            command, words = words[:cut], words[cut + 1:]
            while command and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", command[0]):
                command = command[1:]
            if command:
                found.append(command)
    return found


def parse_only(command: list[str], dry_run: bool = True) -> list[str]:
    """What runs for a command that cannot run here: an `ng_run` with `+dry_run=true` (unless `dry_run` is false);
    any other with `--help` after its program (`python <script>`, `python -m <module>`) and its sub-command words."""
    if dry_run and (command[0] == "ng_run" or command[:3] == ["gym", "env", "start"]):
        return [*command, "+dry_run=true"]
    if "/" in command[0] and command[0].endswith(".sh"):  # a script of ours: checked, never run (it may install)
        return ["bash", "-n", command[0]]
    if command[0] in ("python", "python3"):
        head, rest = ([sys.executable, *command[1:3]], command[3:]) if command[1] == "-m" else \
            ([sys.executable, command[1]], command[2:])
    else:
        head, rest = command[:1], command[1:]
    for word in rest:
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", word):
            break
        head.append(word)
    return [*head, "--help"]


def check_script_options(command: list[str]) -> None:
    """`python <script> [--option value ...]`: the script compiles and declares every `--option` given."""
    tree = ast.parse((ROOT / command[1]).read_text(), command[1])
    declared = {arg.value for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
    given = {word.split("=", 1)[0] for word in command[2:] if word.startswith("--")}
    assert given <= declared, f"{shlex.join(command)}: {sorted(given - declared)} not among {sorted(declared)}"


def scratch(folder: Path, head_port: int, checkout: bool = False) -> Path:
    """A folder holding links to the repository's top-level entries and an `env.yaml` naming the head server.

    With `checkout`, `gymfleet/` and `tests/` are copies (so the code's repository root is this folder) and
    `resources_servers/` is a folder of links to each environment (so a new one is made here, not in the repository).
    """
    folder.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name in (".git", "env.yaml", "results", "data"):
            continue
        if checkout and entry.name in ("gymfleet", "tests"):
            shutil.copytree(entry, folder / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif checkout and entry.name == "resources_servers":
            (folder / entry.name).mkdir()
            for env in entry.iterdir():
                (folder / entry.name / env.name).symlink_to(env)
        else:
            (folder / entry.name).symlink_to(entry)
    (folder / "env.yaml").write_text(f"head_server:\n  host: 127.0.0.1\n  port: {head_port}\n")
    return folder


def environ(code: Path = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code), "GYMFLEET_LOG_LEVEL": "WARNING"}


def run(argv_or_script: list[str] | str, cwd: Path, code: Path = ROOT) -> subprocess.CompletedProcess:
    shell = ["bash", "-euo", "pipefail", "-c", argv_or_script] if isinstance(argv_or_script, str) else argv_or_script
    return subprocess.run(shell, cwd=cwd, env=environ(code), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """The shared fleet: the docs' one `fleet` block, run in the background. Yields its head server's port."""
    (block,) = [block for block in BLOCKS if block.mode == "fleet"]
    port = free_port()
    folder = scratch(tmp_path_factory.mktemp("docs") / "fleet", port)
    log = (folder / "fleet.log").open("w")
    process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", "exec " + block.body.strip()], cwd=folder,
                               env=environ(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + FLEET_TIMEOUT_S
        while True:  # the log says when, then `ng_status` must agree (a poll by `ng_status` costs ~0.4 CPU s a try)
            assert process.poll() is None, f"{block.id}: the fleet exited:\n{(folder / 'fleet.log').read_text()}"
            if "servers ready!" in (folder / "fleet.log").read_text():
                status = run(["ng_status", "+json=true"], folder)
                if status.returncode == 0:
                    report = json.loads(status.stdout)
                    if report["total"] and report["live"] == report["total"]:
                        break
            assert time.monotonic() < deadline, f"{block.id}: not ready:\n{(folder / 'fleet.log').read_text()}"
            time.sleep(0.2)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C, as the docs say
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def test_every_block_is_marked_with_a_known_mode_and_one_starts_the_fleet():
    assert len(BLOCKS) >= 10, "the docs' bash blocks were not found"
    assert [block.mode for block in BLOCKS if block.mode not in MODES] == [], f"modes are {MODES}"
    assert [block.id for block in BLOCKS if block.mode in ("parse", "help") and not block.reason] == [], \
        "a `parse` or `help` block says why it cannot run: <!-- doc-test: parse: <why> -->"
    assert len([block for block in BLOCKS if block.mode == "fleet"]) == 1


def test_commands_split_as_a_shell_would():
    assert commands("A=1 B=2 docker compose up -d   # note\nls -la && \\\n  echo 'a # b'\n") == [
        ["docker", "compose", "up", "-d"], ["ls", "-la"], ["echo", "a # b"]]
    assert parse_only(["ray", "start", "--head", "--port=6379"]) == ["ray", "start", "--help"]
    assert parse_only(["ng_run", "+config_paths=[x.yaml]"]) == ["ng_run", "+config_paths=[x.yaml]", "+dry_run=true"]
    assert parse_only(["ng_run", "+config_paths=[x.yaml]"], dry_run=False) == ["ng_run", "--help"]
    assert parse_only(["python", "-m", "pip", "install", "-q", "-e", "."]) == [sys.executable, "-m", "pip", "install",
                                                                            "--help"]
    assert parse_only(["python", "bench/x.py", "--rows", "3"]) == [sys.executable, "bench/x.py", "--help"]
    assert parse_only(["scripts/install_bubblewrap.sh"]) == ["bash", "-n", "scripts/install_bubblewrap.sh"]
    check_script_options(["python", "bench/verify_throughput.py", "--seconds", "1"])
    with pytest.raises(AssertionError, match="--second"):
        check_script_options(["python", "bench/verify_throughput.py", "--second", "1"])


@pytest.mark.parametrize("block", [block for block in BLOCKS if block.mode != "fleet"], ids=lambda block: block.id)
def test_documented_block_runs(block, fleet, tmp_path):
    if block.mode in ("parse", "help"):
        folder = scratch(tmp_path / "block", fleet)
        scripts = [command for command in commands(block.body) if command[0] in ("python", "python3")
                   and command[1].endswith(".py")]
        for command in scripts:
            check_script_options(command)
        argvs = list({tuple(parse_only(command, dry_run=block.mode == "parse")): None
                      for command in commands(block.body) if command not in scripts})
        with ThreadPoolExecutor(4) as pool:  # each is mostly an interpreter starting up
            for argv, done in zip(argvs, pool.map(lambda argv: run(list(argv), folder), argvs), strict=True):
                assert done.returncode == 0, f"{block.id}: {shlex.join(argv)}\n{done.stdout}\n{done.stderr}"
        return
    checkout = block.mode == "checkout"
    folder = scratch(tmp_path / "block", free_port() if block.mode == "own-fleet" else fleet, checkout=checkout)
    done = run(block.body, folder, code=folder if checkout else ROOT)
    assert done.returncode == 0, f"{block.id} exited {done.returncode}:\n{block.body}\n{done.stdout}\n{done.stderr}"


ENV_ROW = re.compile(r"^\| \[(?P<env>\w+)\]\(\.\./resources_servers/(?P=env)/\) \|.*\| (?P<version>v\d+) \|$", re.M)


def test_the_environments_table_lists_every_environment_at_its_version():
    table = (ROOT / "docs/environments.md").read_text()
    listed = {match["env"]: match["version"] for match in ENV_ROW.finditer(table)}
    current = {app.parent.name: docstring_version(ast.get_docstring(ast.parse(app.read_text())))
               for app in sorted((ROOT / "resources_servers").glob("*/app.py"))}
    assert listed == current, "docs/environments.md's table: one row per environment, its last `- vN:` entry"
    readme = (ROOT / "README.md").read_text()
    assert [env for env in current if f"](resources_servers/{env}/)" not in readme] == [], "README's environments"


def test_the_architecture_page_names_every_module_of_gymfleet():
    page = (ROOT / "docs/architecture.md").read_text()
    rows = {match[1]: match[2] for match in re.finditer(r"^\| `?(\w+)/?`? \| [^|]+ \|(.*)\|$", page, re.M)}
    missing = []
    for path in sorted((ROOT / "gymfleet").rglob("*.py")):
        group = "root" if path.parent.name == "gymfleet" else path.parent.name
        if path.stem != "__init__" and f"`{path.stem}`" not in rows.get(group, ""):
            missing.append(f"{group}: {path.stem}")
    assert missing == [], "docs/architecture.md's layout table: add each module to its group's row"


def test_relative_links_point_at_files_that_exist():
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if not re.match(r"[a-z]+:", target) and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
