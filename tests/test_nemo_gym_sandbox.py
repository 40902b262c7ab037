"""`nemo_gym.sandbox` (NeMo-Gym 0.7.0's AsyncSandbox API) on gymfleet's sandbox service: commands run there, never in
the server process; what a command does is a `SandboxExecResult`; a sandbox that is down is `SandboxError`, which a
folder's `/verify` turns into a `sandbox_failed` row, never a reward of 0."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gymfleet.errors import SandboxError
from gymfleet.testing import free_port, serve
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.sandbox import (
    AsyncSandbox,
    AsyncSandboxCompose,
    Sandbox,
    SandboxCreateError,
    SandboxExecResult,
    SandboxHandle,
    SandboxResources,
    SandboxSpec,
    SandboxStatus,
    create_provider,
    list_providers,
    register_provider,
    resolve_provider_config,
    resolve_provider_metadata,
)
from nemo_gym.sandbox.utils import CPU_CAP_ENV_VARS, cpu_cap_env
from nemo_gym.server_utils import ServerClient


def _fleet(url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    return {"sandbox": {"sandbox_servers": {"sandbox": {"host": host, "port": int(port)}}}}


async def test_commands_run_in_the_sandbox_service_with_spec_files_env_and_workdir(sandbox_url, tmp_path):
    spec = SandboxSpec(files={"pkg/lib.py": "def f(n):\n    return n * 10\n"}, env={"GREETING": "hi"},
                       resources={"memory_mib": 256})
    async with await AsyncSandbox({"gymfleet": {"config": _fleet(sandbox_url)}}, spec).start() as box:
        assert await box.status() == SandboxStatus.RUNNING
        program = "import lib, os; print(lib.f(4), os.environ['GREETING'], os.getpid())"
        done = await box.exec(f'cd pkg && python3 -c "{program}"')
        assert done.return_code == 0 and done.stdout.split()[:2] == ["40", "hi"] and done.error_type is None
        assert int(done.stdout.split()[2]) != __import__("os").getpid(), "the command ran in another process"
        assert (await box.exec("pwd", cwd="pkg", env={"GREETING": "x"})).stdout.strip().endswith("/pkg")
        assert (await box.exec("echo $GREETING", env={"GREETING": "per call"})).stdout == "per call\n"
        failed = await box.exec("echo oops >&2; exit 3")
        assert failed == SandboxExecResult(stdout="", stderr="oops\n", return_code=3)
        state = await box.exec("echo kept > state.txt")  # the workspace persists between commands
        assert state.return_code == 0 and (await box.exec("cat state.txt")).stdout == "kept\n"
        (tmp_path / "up.bin").write_bytes(bytes(range(256)) * 4)
        await box.upload(tmp_path / "up.bin", "deep/dir/up.bin")
        await box.download("deep/dir/up.bin", tmp_path / "down" / "copy.bin")
        assert (tmp_path / "down" / "copy.bin").read_bytes() == bytes(range(256)) * 4
        with pytest.raises(FileNotFoundError, match="missing.txt"):
            await box.download("missing.txt", tmp_path / "never")
        slow = await box.exec("while :; do :; done", timeout_s=1)
        assert (slow.return_code, slow.error_type) == (-1, "timeout")
    assert await box.status() == SandboxStatus.STOPPED
    with pytest.raises(RuntimeError, match="has not been started"):
        await box.exec("true")


@pytest.mark.parametrize("operation", ["start", "exec", "upload", "download", "start_with_setup"])
async def test_a_sandbox_that_is_down_raises_sandbox_error_from_every_operation(sandbox_url, operation, tmp_path):
    """The family: whichever call meets a sandbox that is down (never started, or gone after start) raises the typed
    `SandboxError` (`sandbox_failed`), never a result a folder could score."""
    dead = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "f").write_text("x")
    if operation in ("start", "start_with_setup"):
        box = AsyncSandbox({"gymfleet": {"url": dead}}, SandboxSpec())
        call = box.start() if operation == "start" else box.start_with_setup(None, lambda _: None)
        with pytest.raises(SandboxError):
            await call
        return
    box = await AsyncSandbox({"gymfleet": {"url": sandbox_url}}, SandboxSpec()).start()
    await box._handle.raw["session"].close()  # the session is gone, as after a sandbox restart
    calls = {"exec": lambda: box.exec("true"), "upload": lambda: box.upload(tmp_path / "f", "f"),
             "download": lambda: box.download("f", tmp_path / "g")}
    with pytest.raises(SandboxError):
        await calls[operation]()


class _CodeConfig(BaseResourcesServerConfig):
    sandbox_provider: dict


class _CodeServer(SimpleResourcesServer):
    """A folder written against NeMo-Gym's classes: runs the model's program in a sandbox, reward 1 if it prints 42."""

    config: _CodeConfig

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        spec = SandboxSpec(files={"main.py": body.response.output_text})
        async with await AsyncSandbox(self.config.sandbox_provider, spec).start() as box:
            result = await box.exec("python3 main.py", timeout_s=5)
        return BaseVerifyResponse(**body.model_dump(), reward=float(result.stdout == "42\n"))


def _row(code: str) -> dict:
    output = [{"id": "m", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": code, "annotations": []}]}]
    return {"responses_create_params": {"input": "write it"},
            "response": {"id": "r", "created_at": 0, "model": "m", "object": "response", "output": output}}


@pytest.mark.parametrize("sandbox_is_up", [True, False])
def test_a_folder_verifying_in_a_sandbox_scores_and_a_dead_sandbox_is_a_failure_row(sandbox_url, sandbox_is_up):
    url = sandbox_url if sandbox_is_up else f"http://127.0.0.1:{free_port()}"
    config = _CodeConfig(host="127.0.0.1", port=0, entrypoint="app.py", name="code",
                         sandbox_provider={"gymfleet": {"url": url}})
    with serve(_CodeServer(config=config, server_client=ServerClient()).setup_webserver()) as server:
        right = httpx.post(f"{server}/verify", json=_row("print(6 * 7)"), timeout=120).json()
        wrong = httpx.post(f"{server}/verify", json=_row("import os; os._exit(1)"), timeout=120).json()
    if sandbox_is_up:
        assert (right["reward"], wrong["reward"]) == (1.0, 0.0)
    else:
        for row in (right, wrong):
            assert (row["_ng_failure_class"], row["mask_sample"]) == ("sandbox_failed", True)


async def test_container_images_and_providers_are_refused_with_the_reason(sandbox_url):
    with pytest.raises(SandboxCreateError, match="runs no container images.*'python:3.12'"):
        await AsyncSandbox({"gymfleet": {"url": sandbox_url}}, SandboxSpec(image="python:3.12")).start()
    with pytest.raises(ValueError, match="'docker' provider runs container images.*gymfleet"):
        create_provider({"docker": {}})
    with pytest.raises(ValueError, match="exactly one provider name"):
        create_provider({"gymfleet": {}, "docker": {}})
    box = await AsyncSandbox({"gymfleet": {"url": sandbox_url}}, SandboxSpec()).start()
    with pytest.raises(ValueError, match="user=0 cannot be honoured"):
        await box.exec("id", user=0)
    await box.stop()


async def test_compose_projects_are_checked_then_refused_before_anything_starts(sandbox_url, tmp_path):
    compose = tmp_path / "docker-compose.yaml"
    project = AsyncSandboxCompose({"gymfleet": {"url": sandbox_url}}, compose, service_specs={"main": SandboxSpec()})
    for text, error, reason in (("services: {}", ValueError, "non-empty services"),
                                ("services: {main: {image: app}, db: {command: x}}", ValueError,
                                 "'db' needs a prebuilt"),
                                ("services: {main: {image: app}, db: {image: pg}}", SandboxCreateError,
                                 r"services \['main', 'db'\]\): gymfleet does not run Compose projects")):
        compose.write_text(text)
        with pytest.raises(error, match=reason):
            await project.start()
        assert project.services == {}
    await project.stop()
    await project.stop()
    with pytest.raises(ValueError, match="must be positive"):
        AsyncSandboxCompose({"gymfleet": {}}, compose, timeout_s=0)


async def test_a_folders_own_provider_is_registered_and_used():
    class Recording:
        name = "recording"
        commands: list = []

        async def create(self, spec):
            return SandboxHandle(sandbox_id="r1", provider_name=self.name, raw=None)

        async def exec(self, handle, command, *, cwd=None, env=None, timeout_s=None, user=None):
            self.commands.append((command, cwd))
            return SandboxExecResult(stdout="done", stderr="", return_code=0)

        async def close(self, handle):
            self.commands.append("closed")

        async def aclose(self):
            pass

    register_provider("recording", Recording, override=True)
    assert "recording" in list_providers() and "gymfleet" in list_providers()
    with pytest.raises(ValueError, match="already registered"):
        register_provider("gymfleet", Recording)
    async with await AsyncSandbox({"recording": None}, SandboxSpec(workdir="/w")).start() as box:
        assert (await box.exec("make")).stdout == "done"
    assert Recording.commands == [("make", "/w"), "closed"]


def test_specs_and_provider_blocks_are_checked_as_nemo_gyms():
    resources = SandboxSpec(resources={"cpu": 2, "memory_mib": "512"}).resources
    assert resources == SandboxResources(cpu=2.0, memory_mib=512)
    assert SandboxSpec(ports=["8080", 9000]).ports == (8080, 9000)
    for ports, message in (([0], "between 1 and 65535"), ([True], "Invalid"), ([80, 80], "Duplicate")):
        with pytest.raises(ValueError, match=message):
            SandboxSpec(ports=ports)
    with pytest.raises(ValueError, match="Unknown sandbox resource keys: ram"):
        SandboxSpec(resources={"ram": 1})
    named = {"sandbox": {"gymfleet": {"server": "sb"}, "default_metadata": {"team": "x"}}, "other": 3}
    assert resolve_provider_config("sandbox", named) == {"gymfleet": {"server": "sb"}}
    assert resolve_provider_metadata("sandbox", named) == {"team": "x"}
    assert resolve_provider_config({"gymfleet": {}}) == {"gymfleet": {}}
    with pytest.raises(ValueError, match="'missing' is not defined.*Available sandbox configs: 'sandbox'"):
        resolve_provider_config("missing", named)
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config({"a": {}, "b": {}})
    assert cpu_cap_env(None) == {} and set(cpu_cap_env(2.7).values()) == {"2"}
    assert cpu_cap_env(0.5)["GOMAXPROCS"] == "1"
    assert set(cpu_cap_env(4)) == set(CPU_CAP_ENV_VARS)


def test_the_sync_sandbox_runs_commands_there_and_refuses_to_block_an_event_loop(sandbox_url, tmp_path):
    provider = {"gymfleet": {"config": _fleet(sandbox_url)}}
    with Sandbox(provider, SandboxSpec(files={"main.py": "print(6 * 7)"})).start() as box:
        assert box.status() == SandboxStatus.RUNNING
        assert box.exec("python3 main.py").stdout == "42\n"
        (tmp_path / "up.txt").write_text("kept")
        box.upload(tmp_path / "up.txt", "up.txt")
        box.download("up.txt", tmp_path / "down.txt")
        assert (tmp_path / "down.txt").read_text() == "kept"

        async def from_async_code():
            box.exec("true")

        with pytest.raises(RuntimeError, match="use AsyncSandbox"):
            asyncio.run(from_async_code())
    assert box.status() == SandboxStatus.STOPPED
    with pytest.raises(RuntimeError, match="stopped"):
        box.exec("true")
