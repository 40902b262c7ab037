"""Try one NeMo-Gym environment folder on gymfleet, as a user would: start it, run its tests, replay its rollouts.

`try_folder(folder, scratch)` returns a `FolderResult`:

- **start**: the folder's config (`configs/<name>.yaml`, else its first) cut down to the folder's resources
  server(s) and stand-ins for the model servers they name (gymfleet's `openai_model`, one attempt per call, pointed
  at a stand-in judge, `gymfleet.testing.judge_replay`, that answers the judge calls the rollouts recorded and
  refuses, and counts, any other: a folder's judge call fails at once, typed), written to a scratch file that names
  the folder with `+server_folders.<instance>=<folder>`; then `ng_run +dry_run=true` and a real `ng_run`, until
  "All N / N servers ready" (`"dry"` when only the dry run passed, `"yes"` when it served);
- **tests**: the folder's own tests where it lies, in a subprocess of its environment, with NeMo-Gym's pytest
  settings and its tree's imports (`run_tests_in_place`), passed/total from pytest's summary;
- **rewards**: every row of `data/example_rollouts*.jsonl` with a recorded `reward` and `response`, replayed as
  NeMo-Gym's agent made it (`replay_request`: the row's task, `gymfleet.testing.nemo_gym_recordings.task_for`,
  plus the recorded response): `POST /seed_session` with it, the response's tool calls in order (`POST /<tool>`
  with their arguments, one cookie jar per row), then `POST /verify`; agreeing means the same reward within 1e-6.
  A Gymnasium folder (`/reset`, `/step`) is replayed as NeMo-Gym's gymnasium_agent ran it: `/reset`, then `/step`
  per recorded model turn, rewards summed (`_episode`). A row that disagrees for want of what a replay cannot have
  is counted by that want in `blocked`: its task (`TASK_MISSING`: not in `data/`, the recorded rollout keeps only
  the prompt, the folder's own request fields are gone), a judge model (`JUDGE_MISSING`: the folder called its
  judge for that row and no answer was recorded, whether it failed the row typed or scored the failure itself),
  its episode (`DIVERGED`: `/reset` or a `/step` answers another observation than the recorded one to the
  recorded moves, as an environment that deals at random does; such a row never counts as agreeing, even where the
  reward happens to match; a deterministic folder served right answers every observation as recorded) or the folder
  as it was recorded (`OTHER_VERSION`: rows recorded by another
  version or config of the folder, each with its evidence in `nemo_gym_recordings.OTHER_RECORDING`) or a faster
  machine (`SLOW_MACHINE`: a row `nemo_gym_recordings.MACHINE_BOUND` names, scored 0 when the folder's own time bound
  ran out) or containers (`CONTAINERS`: `/verify` refused the row and the folder's other modules run its tasks in
  containers, `sandboxed`: terminal_bench_4 grades in the sandbox its `/seed_session` made, whose `session_id` and
  `termination` its `/verify` requires). The stand-in judge is also `+policy_base_url`, so a folder whose judge is
  configured by URL (verifif) calls it, and its calls nobody recorded count as lacking a judge model.

What the folder needs that this machine lacks is said in one line (`why`): `needs(folder)` names containers, Lean and
GPUs before anything starts; a start, test or replay failure is reduced to its first telling line (`_why`).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gymfleet.testing import free_port
from gymfleet.testing.judge_replay import JudgeReplay
from gymfleet.testing.nemo_gym_recordings import (
    MACHINE_BOUND,
    OTHER_RECORDING,
    episode_body,
    is_gymnasium,
    materialized_inputs,
    model_turns,
    recorded_observations,
    recorded_rows,
    recorded_start,
    recorded_turns,
    replay_request,
    task_for,
    task_rows,
    verify_outputs,
)

START_TIMEOUT_S = 240
TESTS_TIMEOUT_S = 600
NO_NETWORK = re.compile(r"Name or service not known|Temporary failure in name resolution|Network is unreachable|"
                        r"getaddrinfo ENOTFOUND|Could not resolve host|failed to lookup address information|"
                        r"'git', 'clone'[^\]]*'https?://")
"""What a folder's output shows when it reached for the network, which this machine does not have."""
STUB_MODEL_URL = "http://127.0.0.1:9/v1"
"""Where stand-in model servers point without a stand-in judge: the discard port, where nothing answers."""
NEEDS = [  # (pattern over app.py, requirements.txt and the config used, what the folder needs)
    (re.compile(r"^\s*(import|from) docker\b|\bdocker (run|exec|pull|build)\b|\b(apptainer|enroot)\b|docker\.io/|"
                r"\bdocker_image|dockerhub|\bDocker (daemon|workers)|singularity", re.I | re.M),
     "containers (docker/apptainer)"),
    (re.compile(r"\blean4?\b|mathlib", re.I), "a Lean checker"),
    (re.compile(r"^vllm\b|^\s*(import|from) vllm\b|torch\.cuda\.is_available\(\)\s*$", re.M), "a GPU (vllm/cuda)"),
]


@dataclass
class FolderResult:
    folder: str
    cls: str = "-"
    start: str = "no"
    """`yes` (served), `dry` (the dry run passed, the real start did not), `no`, or `-` (not tried)."""
    tests_passed: int = 0
    tests_total: int = 0
    agree: int = 0
    rows: int = 0
    why: list[str] = field(default_factory=list)
    blocked: dict[str, int] = field(default_factory=dict)
    """Recorded rows that did not agree and cannot be replayed here, by what they lack (`TASK_MISSING`: their task
    row is not in `data/`; `JUDGE_MISSING`, `DIVERGED`, `OTHER_VERSION`, `SLOW_MACHINE`: see the module docstring)."""

    def row(self) -> list[str]:
        tests = f"{self.tests_passed}/{self.tests_total}" if self.tests_total else "-"
        rewards = f"{self.agree}/{self.rows}" if self.rows else "-"
        return [self.folder, self.cls, self.start, tests, rewards, "; ".join(self.why)[:160]]

    @property
    def ok(self) -> bool:
        return (self.start == "yes" and self.tests_passed == self.tests_total
                and self.agree == self.rows)


def server_class(folder: Path) -> str:
    """The name of the server class `app.py` defines (the last class deriving from a `...Server` base)."""
    try:
        tree = ast.parse((folder / "app.py").read_text(errors="replace"))
    except (OSError, SyntaxError):
        return "-"
    names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)
             and any(ast.unparse(base).endswith("Server") for base in node.bases)]
    return names[-1] if names else "-"


def needs(folder: Path) -> str | None:
    """What the folder needs that gymfleet on this machine cannot give it (containers, Lean, a GPU), if anything."""
    text = "\n".join(path.read_text(errors="replace") for path in [folder / "app.py", folder / "requirements.txt",
                                                                    config_file(folder)] if path and path.is_file())
    found = [what for pattern, what in NEEDS if pattern.search(text)]
    return "needs " + ", ".join(found) if found else None


def sandboxed(folder: Path) -> bool:
    """Whether the folder's other modules (not `app.py`, which `needs` reads) run its tasks in containers: it serves
    here, but a rollout's `/verify` grades in the container its `/seed_session` made (terminal_bench_4's
    `environment.py`), so a recorded row cannot be replayed without them."""
    return any(NEEDS[0][0].search(path.read_text(errors="replace")) for path in sorted(folder.glob("*.py"))
               if path.name != "app.py")


def config_file(folder: Path) -> Path | None:
    """The folder's config: `configs/<name>.yaml`, else its first `configs/*.yaml`."""
    own = folder / "configs" / f"{folder.name}.yaml"
    return own if own.is_file() else next(iter(sorted((folder / "configs").glob("*.yaml"))), None)


def folder_config(folder: Path, model_url: str = STUB_MODEL_URL) -> tuple[dict[str, Any], list[str]]:
    """The folder's resources server instances from its config (with what the files its `config_paths` include give
    them, resolved in the folder's tree, as NeMo-Gym merges them), plus stand-ins for the model servers they name
    (pointed at `model_url`); and the names of those instances."""
    from gymfleet.errors import ConfigError
    from gymfleet.fleet.config_merge import load_config_files, merge

    path = config_file(folder)
    if path is None:
        raise RuntimeError("no configs/*.yaml")
    try:
        data = merge(*(data for _, data, _ in load_config_files([str(path)], [folder.parent.parent])))
    except ConfigError as exc:
        raise RuntimeError(str(exc)) from None
    kept = {name: block for name, block in data.items()
            if isinstance(block, dict) and isinstance(block.get("resources_servers"), dict)
            and folder.name in block["resources_servers"]}
    if not kept:
        raise RuntimeError(f"its config defines no resources_servers.{folder.name} instance")
    for name in sorted(_references(kept, "responses_api_models") - set(kept)):
        kept[name] = {"responses_api_models": {"openai_model": {
            "entrypoint": "app.py", "base_url": model_url, "api_key": "stand-in", "model": "stand-in",
            "max_attempts": 1}}}  # nothing to wait for: a judge call fails at once, not after backoff
    servers = [name for name, block in kept.items() if "resources_servers" in block]
    return kept, servers


def _references(node: Any, server_type: str) -> set[str]:
    if isinstance(node, dict):
        if node.get("type") == server_type and isinstance(node.get("name"), str):
            return {node["name"]}
        return set().union(*(_references(value, server_type) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_references(value, server_type) for value in node))
    return set()


def _ng_run(config: Path, folder: Path, servers: list[str], extra: list[str], model_url: str = STUB_MODEL_URL,
            ) -> list[str]:
    """ng_run's command; `+policy_base_url` is `model_url` too: a folder whose judge is configured by URL
    (verifif's `judge_base_url: ${policy_base_url}`) calls the stand-in judge, which counts the calls it cannot
    answer, as it does a judge model server's."""
    return [sys.executable, "-m", "gymfleet.cli.run", f"+config_paths=[{config}]",
            *(f"+server_folders.{name}={folder}" for name in servers), "+policy_base_url=" + model_url,
            "+policy_api_key=stand-in", "+policy_model_name=stand-in", "+model_endpoint_readiness_timeout_seconds=0",
            *extra]


def try_folder(folder: Path, scratch: Path, *, requirements: str = "check", tests: bool = True) -> FolderResult:
    """Start `folder` under ng_run, run its tests, replay its recorded rollouts (see the module docstring)."""
    result = FolderResult(folder.name, server_class(folder))
    need = needs(folder)
    if need:
        result.start = "-"
        result.why.append(need)
        return result
    scratch.mkdir(parents=True, exist_ok=True)
    rows = recorded_rows(folder)
    with contextlib.ExitStack() as stack:
        judge = stack.enter_context(JudgeReplay(rows))  # answers recorded calls; counts the calls it cannot answer
        _try_started(folder, scratch, result, requirements, judge)
        if judge.calls and judge.misses:
            result.why.append(f"{judge.misses} judge calls not recorded (stand-in judge: {judge.hits} replayed)")
        if judge.fuzzy:
            result.why.append(f"judge prompt changed since recording: {judge.fuzzy} of {judge.hits} judge calls "
                              "answered with the row's recorded verdict")
    if tests and (folder / "tests").is_dir():
        _tests(folder, scratch / "tests", result, requirements)
    return result


def _try_started(folder: Path, scratch: Path, result: FolderResult, requirements: str,
                 judge: JudgeReplay | None) -> None:
    """The dry run, then the real start and the replay; the folder's model servers point at `judge`."""
    model_url = judge.url if judge is not None else STUB_MODEL_URL
    try:
        data, servers = folder_config(folder, model_url)
    except (RuntimeError, yaml.YAMLError) as exc:
        result.why.append(f"config: {exc}")
        return
    config = scratch / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_root()), os.environ.get("PYTHONPATH")]))}
    extra = [f"+folder_requirements={requirements}"]
    dry = subprocess.run(_ng_run(config, folder, servers, [*extra, "+dry_run=true"], model_url), capture_output=True,
                         text=True,
                         env=env, timeout=START_TIMEOUT_S + 600, stdin=subprocess.DEVNULL, errors="replace")
    if dry.returncode != 0:
        result.why.append("dry run: " + (_unset_setting(config_file(folder), dry.stderr + dry.stdout)
                                         or _why(dry.stderr + dry.stdout)))
    else:
        result.start = "dry"
        _serve(folder, config, servers, extra, env, scratch, result, judge)


def _serve(folder: Path, config: Path, servers: list[str], extra: list[str], env: dict, scratch: Path,
           result: FolderResult, judge: JudgeReplay | None = None) -> None:
    port = free_port()
    log_path = scratch / "ng_run.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(_ng_run(config, folder, servers, [*extra, f"+head_server.port={port}"],
                                           judge.url if judge is not None else STUB_MODEL_URL),
                                   stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "servers ready!" not in log_path.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                result.why.append("start: " + _why(log_path.read_text(errors="replace")))
                return
            time.sleep(0.5)
        result.start = "yes"
        import httpx

        from gymfleet import auth

        token = auth.head_headers("127.0.0.1", port)  # the token file ng_run wrote for its head address
        published = yaml.safe_load(httpx.get(f"http://127.0.0.1:{port}/global_config_dict_yaml", headers=token,
                                             timeout=30).json())
        fields = published[servers[0]]["resources_servers"][folder.name]
        problems = len(result.why)
        _replay(folder, f"http://{fields['host']}:{fields['port']}", result, token, judge)
        if len(result.why) > problems and NO_NETWORK.search(log_path.read_text(errors="replace")):
            result.why[-1] = f"needs the network (its server reached for it while serving): {result.why[-1]}"
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    """End ng_run's process group: SIGTERM, then SIGKILL after 30 s; a group already gone (ng_run exited on a
    start failure and took its servers with it) is nothing to do, not an error."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    process.wait()


TASK_MISSING = "its task (not in data/)"
JUDGE_MISSING = "a judge model (judge calls not recorded)"
DIVERGED = "its episode (the environment answers the recorded moves otherwise: it plays at random, or another seed)"
OTHER_VERSION = "the folder as recorded (another version or config of it: see OTHER_RECORDING)"
SLOW_MACHINE = "a faster machine (the folder's own time bound ran out: see MACHINE_BOUND)"
CONTAINERS = "containers (its task's sandbox, made by /seed_session, grades it: see sandboxed)"


def _episode(client: Any, row: dict, task: dict) -> tuple[int, str, Any, bool]:
    """Replay a Gymnasium episode as gymnasium_agent ran it: `/reset` with the task row, then `/step` with each
    recorded model turn until the episode ends; (status, text, summed reward) of the first failed call or the last,
    and whether the environment answered as the recording shows (its first observation and, where the row records
    them, the observations after each turn)."""
    body = episode_body(row, task)
    reply = client.post("/reset", json=body)
    turns = recorded_turns(row)
    observations = recorded_observations(row) if turns == model_turns(row["response"].get("output") or []) else []
    seen = [(recorded_start(row, task), reply)]
    total = 0.0
    for index, turn in enumerate(turns):
        if reply.status_code != 200:
            break
        reply = client.post("/step", json={**body, "response": {**row["response"], "output": turn}})
        seen.append((observations[index] if index < len(observations) else None, reply))
        if reply.status_code == 200:
            step = reply.json()
            total += step.get("reward") or 0.0
            if step.get("terminated") or step.get("truncated"):
                break
    as_recorded = all(recorded is None or answer.status_code != 200 or answer.json().get("observation") == recorded
                      for recorded, answer in seen)
    return reply.status_code, reply.text, total, as_recorded


def _replay(folder: Path, url: str, result: FolderResult, headers: dict[str, str] | None = None,
            judge: JudgeReplay | None = None) -> None:
    import httpx

    gymnasium = is_gymnasium(folder)
    rows = recorded_rows(folder)
    tasks, inputs = task_rows(folder), materialized_inputs(folder)
    result.rows = len(rows)
    found = [task_for(row, tasks, inputs) for row in rows]
    computed = verify_outputs(rows, found)
    first_problem = None
    orphans = 0
    blocked: dict[str, int] = {}
    in_containers = sandboxed(folder)
    for index, row in enumerate(rows):
        task = found[index]
        orphans += not task
        lacks = None if task else TASK_MISSING
        request = replay_request(row, task, computed)
        if judge is not None:
            judge.replaying(row)
        misses = judge.misses if judge is not None else 0
        try:
            with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
                if gymnasium:
                    status, text, got, as_recorded = _episode(client, row, task)
                    if status == 200 and abs(got - row["reward"]) <= 1e-6 and as_recorded:
                        result.agree += 1
                        continue
                    first_problem = first_problem or (
                        f"episode {status}: {_why(text)}" if status != 200 else
                        f"episode reward {got} != recorded {row['reward']}" if as_recorded else
                        f"episode went otherwise than recorded (reward {got}, recorded {row['reward']})")
                    lacks = lacks or (None if as_recorded else DIVERGED) or (
                        OTHER_VERSION if (folder.name, index) in OTHER_RECORDING else None)
                    if lacks:
                        blocked[lacks] = blocked.get(lacks, 0) + 1
                    continue
                client.post("/seed_session", json=request)
                for item in row["response"].get("output") or []:
                    if isinstance(item, dict) and item.get("type") == "function_call":
                        try:
                            arguments = json.loads(item.get("arguments") or "{}")
                        except json.JSONDecodeError:
                            arguments = {}
                        client.post(f"/{item.get('name')}", json=arguments)
                reply = client.post("/verify", json=request)
        except httpx.HTTPError as exc:
            first_problem = first_problem or f"verify: {type(exc).__name__}: {exc}"
            continue
        if reply.status_code != 200:
            first_problem = first_problem or f"verify {reply.status_code}: {_why(reply.text)}"
            lacks = lacks or (CONTAINERS if in_containers else None)
            if lacks:
                blocked[lacks] = blocked.get(lacks, 0) + 1
            continue
        body = reply.json()
        got = body.get("reward")
        if isinstance(got, (int, float)) and abs(got - row["reward"]) <= 1e-6:
            result.agree += 1
        else:
            failure = body.get("_ng_failure_class")
            first_problem = first_problem or (f"reward {got} != recorded {row['reward']}"
                                              + (f" ({failure})" if failure else ""))
            judged_without_answer = judge is not None and judge.misses > misses  # its verify may score that 0
            lacks = lacks or (JUDGE_MISSING if judged_without_answer or failure == "judge_failed" and judge is None
                              else None) or (OTHER_VERSION if (folder.name, index) in OTHER_RECORDING else None) or (
                SLOW_MACHINE if (folder.name, index) in MACHINE_BOUND and got == 0 else None)
            if lacks:
                blocked[lacks] = blocked.get(lacks, 0) + 1
    result.blocked = blocked
    if first_problem:
        reasons = dict.fromkeys(reason for (name, _), reason in OTHER_RECORDING.items() if name == folder.name)
        explained = f" (rows recorded {'; '.join(reasons)})" if reasons else ""
        result.why.append((f"{orphans}/{len(rows)} recorded rows' task not in data/ (replayed without it): "
                           if orphans else "") + first_problem + explained)


def run_tests_in_place(folder: Path, scratch: Path, python: str | None = None, timeout_s: float = TESTS_TIMEOUT_S,
                       ) -> subprocess.CompletedProcess:
    """Run `folder`'s own tests where the folder lies, with NeMo-Gym's pytest settings (asyncio_mode = auto, not
    gymfleet's `filterwarnings = error`), imports resolving in its tree (`gymfleet.testing.folder_pytest`), in a
    subprocess of `python` (the folder's own environment's, when it has one). A test file that cannot be collected
    counts as one error and the folder's other files still run (`--continue-on-collection-errors`)."""
    from gymfleet.testing.nemo_gym_folders import folder_test_command

    flags = ["-q", "--no-header", "--continue-on-collection-errors"]
    command, env = folder_test_command(folder, scratch, python, flags)
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, errors="replace")


def _tests(folder: Path, scratch: Path, result: FolderResult, requirements: str) -> None:
    from gymfleet.errors import ConfigError
    from gymfleet.fleet.folder_env import folder_python

    try:
        python = folder_python(folder, requirements, say=lambda line: None, tests=True)
    except ConfigError as exc:
        result.why.append(f"tests: {str(exc).splitlines()[0]}")
        return
    try:
        done = run_tests_in_place(folder, scratch, python)
    except subprocess.TimeoutExpired:
        result.why.append(f"tests: not done within {TESTS_TIMEOUT_S}s")
        return
    counts = {kind: int(number) for number, kind in re.findall(r"(\d+) (passed|failed|errors?)", done.stdout)}
    result.tests_passed = counts.get("passed", 0)
    result.tests_total = sum(counts.values())
    if result.tests_passed < result.tests_total or not result.tests_total:
        result.why.append("tests: " + _why(done.stdout + done.stderr))


def _unset_setting(config: Path | None, text: str) -> str | None:
    """"needs <setting>" when a field the failure names is set in the folder's config from a setting nobody gave
    (`api_key: ${oc.select:artificial_analysis_api_key,null}` refused as None), or is required by the folder's config
    class and not in its YAML at all (google_search's `google_api_key`, `google_cx`)."""
    found = re.findall(r"^\s*(\w+):\s*\$\{oc\.select:([\w.]+),\s*null\}", config.read_text(), re.M) if config else []
    for name, setting in found:
        if re.search(rf"\.{name}(\.\S+)?: ", text):
            return f"needs {setting} (an external service's key or setting: +{setting}=...)"
    required = dict.fromkeys(re.findall(r"^\s*[\w-]+\.(\w+): Field required", text, re.M))
    if required:  # fields the folder's config class requires and its YAML leaves to the user (env.yaml)
        return (f"needs {', '.join(required)} (settings its config class requires and its YAML leaves to the user: "
                f"++<instance>.resources_servers.<folder>.{next(iter(required))}=...)")
    return None


def _why(text: str) -> str:
    """The first telling line of a failure's output: an error line, an exception, else the last line; prefixed
    "needs the network" when the output shows a name that could not be resolved (this machine has no network)."""
    unset = re.search(r"cannot resolve '\$\{([\w.]+)\}'", text)
    if unset:
        return f"needs {unset.group(1)} (an external service's key or setting: +{unset.group(1)}=...)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = (lines[-1] if lines else "no output")[:200]
    for pattern in (r"^error: ", r"^E\s+\w+(Error|Exception)\b", r"^\w+(Error|Exception): ", r"^ERROR "):
        found = next((line for line in lines if re.search(pattern, line)), None)
        if found:
            telling = re.sub(r"^(error: |E\s+)", "", found)[:200]
            break
    if NO_NETWORK.search(text):
        return f"needs the network (downloads or an external service): {telling}"
    return telling


def _root() -> Path:
    from gymfleet.fleet.config import repository_root

    return repository_root()
