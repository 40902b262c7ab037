"""Shared pytest setup: every test's event loop closes gymfleet's pooled HTTP session before it ends, one real
sandbox server (bubblewrap isolation) serves every test that needs one, httpx's default SSL context is built
once for all the tests' `httpx.get/post` calls, the Python processes tests start share one bytecode cache, and
under `--dist loadfile` the costliest files are handed out first."""

from __future__ import annotations

import inspect
import os
import tempfile
from collections import Counter
from typing import Any

import pytest
import pytest_asyncio
from httpx._transports import default as httpx_transport

from gymfleet import http
from gymfleet.testing import serve


def _shared_default_ssl_context(build: Any) -> Any:
    """`build` (httpx's `create_ssl_context`), except that the default context (verify=True, no client cert) is
    built once per CA setting and shared. Every `httpx.get/post(...)` in a test builds a client, and each client
    would load the CA bundle into a new context: ~0.1 s a call, thousands of calls. Tests speak plain HTTP to
    127.0.0.1; a context is meant to be shared, and nothing here changes one."""
    cache: dict[tuple[Any, ...], Any] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True, **other: Any) -> Any:
        if verify is not True or cert is not None:
            return build(verify=verify, cert=cert, trust_env=trust_env, **other)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"), *sorted(other.items()))
        if key not in cache:
            cache[key] = build(verify=True, cert=None, trust_env=trust_env, **other)
        return cache[key]

    return create_ssl_context


httpx_transport.create_ssl_context = _shared_default_ssl_context(httpx_transport.create_ssl_context)


@pytest_asyncio.fixture
async def _close_http_session():
    """Closes gymfleet's pooled session of the test's event loop (sessions are per loop). Every test that runs on a
    function-scoped loop gets it first, so it is torn down last (`pytest_collection_modifyitems`)."""
    yield
    await http.close()


def _runs_on_a_test_loop(item: pytest.Item) -> bool:
    """An async test, or a test using an async fixture: only those run code on a function-scoped event loop (a
    sync test's own `asyncio.run` closes its loop, and so its session, itself). Unknown: yes."""
    if pytest_asyncio.is_async_test(item):
        return True
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", None)
    if definitions is None:
        return True
    return any(inspect.iscoroutinefunction(defs[-1].func) or inspect.isasyncgenfunction(defs[-1].func)
               for defs in definitions.values() if defs)


def _first_function_scoped(item: pytest.Item, names: list[str]) -> int:
    """Where an autouse function fixture would sit in `names`: after the wider-scoped fixtures (which come first)."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for index, name in enumerate(names):
        defs = definitions.get(name)
        if not defs or defs[-1].scope == "function":
            return index
    return len(names)


def _bytecode_cache_for_child_processes() -> None:
    """Where the environment turns bytecode caching off (PYTHONDONTWRITEBYTECODE: this CI machine sets it), every
    Python process a test starts (`ng_run`, its servers, CLI commands; hundreds a run) would compile gymfleet
    from source again: ~0.1-0.3 CPU s each. Tests' child processes instead share a cache outside the checkout
    (PYTHONPYCACHEPREFIX: nothing is written beside the sources, which is what the setting keeps clean). A
    prefix the user set is kept."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), f"gymfleet-pycache-{os.getuid()}")
        del os.environ["PYTHONDONTWRITEBYTECODE"]


_bytecode_cache_for_child_processes()

# Seconds each of the costliest test files takes in CI (2 cores, `-n 4 --dist loadfile`; from `--durations`, rounded
# up: the files of the slowest 40 tests of the quiet CI run at 9:30, at least the sum of their listed tests; a few
# more, of few tests but long ones, from `--durations=0` on a loaded machine, halved). Only the order work is handed
# out in depends on it: under `--dist loadfile` a worker runs one file at a time, and xdist by default hands out
# files by test count, most first, so the one-test files (often one long integration test) came last and one worker
# finished them alone while the others idled. Handing out the longest first (then the rest by test count, as xdist
# does) leaves short files for the end. A file missing here costs DEFAULT_TEST_COST_S a test; refresh from a CI log
# with `--durations=0` when files grow: `python tests/file_costs.py ci.log` prints this table.
FILE_COST_S = {
    "tests/test_shipped_configs.py": 220,
    "tests/test_docs.py": 120,
    "tests/test_nemo_gym_corpus.py": 110,
    "tests/test_nemo_gym_folders.py": 140,  # with NeMo-Gym agents served and genrm_compare lifecycle tests
    "tests/test_ray_placement.py": 75,
    "resources_servers/code_gen/tests/test_code_gen_load.py": 70,
    "tests/test_collect.py": 70,
    "tests/test_compose_up.py": 60,
    "tests/test_zygote.py": 55,
    "tests/test_nemo_rl_integration.py": 50,
    "resources_servers/ns_tools/tests/test_ns_tools.py": 50,
    "tests/test_nemo_gym_sandbox.py": 50,
    "tests/test_cli_tools.py": 50,
    "tests/test_fleet.py": 45,
    "tests/test_fuzz_http.py": 40,
    "resources_servers/swerl_gen/tests/test_swerl_gen.py": 35,
    "tests/test_fleet_restarts.py": 30,
    "resources_servers/math_with_judge/tests/test_math_with_judge.py": 25,
    "tests/test_fleet_auth.py": 25,
    "resources_servers/code_gen/tests/test_code_gen_server.py": 25,
    "resources_servers/swebench/tests/test_swebench_server.py": 25,
    "tests/test_server_folders.py": 25,
    "tests/test_sandbox_client.py": 25,
    "tests/test_fault_injection.py": 20,
    "sandbox/tests/test_host_kills.py": 20,
    "tests/test_fleet_messages.py": 20,
    "tests/test_compose.py": 18,
    "tests/test_containers.py": 18,
    "tests/test_judge_outage.py": 16,
    "tests/test_fleet_secrets_and_ports.py": 16,
    "tests/test_procpool.py": 15,
    "tests/test_mathcheck.py": 15,
    "sandbox/tests/test_escapes.py": 15,
    "tests/test_fuzz_scoring.py": 15,
    "resources_servers/instruction_following/tests/test_instruction_following_linear.py": 13,
    "tests/test_super3_recipe.py": 12,
    "sandbox/tests/test_sandbox_service.py": 12,
    "resources_servers/math_formal_lean/tests/test_math_formal_lean_proof.py": 12,
    "resources_servers/swebench/tests/test_swebench_rollouts.py": 12,
    "responses_api_models/local_vllm_model/tests/test_local_vllm_model.py": 10,
    "tests/test_deferred.py": 10,
    "tests/test_sympy_parse.py": 10,
    "sandbox/tests/test_forkserver.py": 10,
    "tests/test_nano3_recipe.py": 10,
    "resources_servers/ns_tools/tests/test_ns_tools_rollouts.py": 10,
    "tests/test_quickstart.py": 8,
}
DEFAULT_TEST_COST_S = 0.05


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gives is kept


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", None)
        if names is not None and "_close_http_session" not in names and _runs_on_a_test_loop(item):
            names.insert(_first_function_scoped(item, names), "_close_http_session")
    if getattr(config.option, "dist", "no") in ("loadfile", "loadscope"):
        tests = Counter(item.nodeid.partition("::")[0] for item in items)
        # stable: a file's tests keep their order, files of one cost theirs
        items.sort(key=lambda item: -FILE_COST_S.get(path := item.nodeid.partition("::")[0],
                                                     tests[path] * DEFAULT_TEST_COST_S))


@pytest.fixture(scope="session")
def sandbox_url():
    """A real sandbox service on an ephemeral port. Without bubblewrap its start-up fails, naming the fix."""
    from sandbox.app import SandboxServer

    with serve(SandboxServer({"name": "sandbox"}).create_app()) as url:
        yield url
