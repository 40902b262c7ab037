"""NeMo-Gym 0.7.0's `nemo_gym.sandbox.agent_tools`: what an agent that runs inside a sandbox needs from the fleet.

- `sandbox_server_url(name)`: the URL of fleet server `name` as the sandbox should call it. A bind-all host
  (`0.0.0.0`, `::`) is no destination: it becomes loopback (a host-network sandbox reaches it). With
  `require_reachable=True` (a remote sandbox) a loopback, bind-all or `localhost` host is a `ValueError`: the server
  must advertise an address the sandbox can reach (`use_absolute_ip`), a rewritten loopback would not do.
- `restricted_network_policy(provider, urls)`: an egress policy that denies everything but those hosts; only the
  `opensandbox` provider enforces one, so any other fails closed (`ValueError`).
- `seed_mcp_servers(client, servers, body, cookies, timeout_s=...)`: seeds each tool server's session and returns the
  MCP entries the sandboxed agent gets (URL, the per-session auth headers the server answered under `mcp`, timeout in
  ms); a server that answers no headers is a `ValueError` (tools must be authenticated per session).
- `verify_agent_response(client, server, body, response, cookies, force_zero_reward=...)`: `/verify` on the
  environment, whose fields the result keeps. With `force_zero_reward` (the agent's run failed) the verifier scores
  an empty output, which must be an unmasked 0 (else `ValueError`); the row then carries the real response,
  `failure_kind="agent_run_error"` and the reason, so the failed generation stays inspectable and counts as a 0.

Calls go through the folder's `ServerClient` (gymfleet's client: deadlines, bounded retries, typed failures).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gymfleet.serving.nemo_gym_client import get_response_json, get_server_url, raise_for_status
from gymfleet.serving.nemo_gym_failures import AGENT_RUN_ERROR
from gymfleet.serving.nemo_gym_types import BaseRunRequest, NeMoGymResponse, ResourcesServerRef

NEMO_GYM_MCP_METADATA_KEY = "mcp"
"""Where a tool server's `/seed_session` answer carries its MCP endpoint (`url_path`) and per-session `headers`."""
RESTRICTED_NETWORK_PROVIDERS = frozenset({"opensandbox"})
"""Providers that enforce an egress policy."""


def _unreachable_reason(url: str) -> str | None:
    host = urlsplit(url).hostname
    if not host:
        return "it names no host"
    if host.lower().rstrip(".") == "localhost":
        return "localhost"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a host name: the sandbox resolves it
    if address.is_loopback or address.is_unspecified:
        return f"{host} is a loopback or bind-all address"
    return None


def _reachable_host(url: str) -> str:
    reason = _unreachable_reason(url)
    if reason:
        raise ValueError(f"{url}: a sandbox cannot reach this endpoint ({reason}); advertise a reachable host "
                         "(use_absolute_ip=true, or bind the server to a routable address)")
    return urlsplit(url).hostname


def sandbox_server_url(name: str, *, require_reachable: bool = False) -> str:
    """Fleet server `name`'s URL as a sandbox calls it (module docstring)."""
    base = get_server_url(name).rstrip("/")
    if require_reachable:
        _reachable_host(base)
        return base
    parts = urlsplit(base)
    if parts.hostname in ("0.0.0.0", "::"):
        host = "127.0.0.1" if parts.hostname == "0.0.0.0" else "[::1]"
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return base


def restricted_network_policy(provider_name: str, urls: list[str]) -> dict[str, object]:
    """Deny-by-default egress allowing only the hosts of `urls` (module docstring)."""
    if provider_name not in RESTRICTED_NETWORK_PROVIDERS:
        raise ValueError(f"sandbox provider {provider_name!r} cannot restrict network access; restricted access "
                         f"needs one of {sorted(RESTRICTED_NETWORK_PROVIDERS)}")
    hosts = sorted({_reachable_host(url) for url in urls})
    return {"defaultAction": "deny", "egress": [{"action": "allow", "target": host} for host in hosts]}


async def seed_mcp_servers(client: Any, servers: list[ResourcesServerRef], body: BaseRunRequest,
                           cookies: Mapping[str, str], *, timeout_s: float, require_reachable: bool = False,
                           ) -> dict[str, dict[str, object]]:
    """Seed each tool server and return the sandboxed agent's MCP entries by server name (module docstring)."""
    entries: dict[str, dict[str, object]] = {}
    for server in servers:
        seeded = await client.post(server_name=server.name, url_path="/seed_session", json=body.model_dump(),
                                   cookies=cookies)
        await raise_for_status(seeded)
        mcp = (await get_response_json(seeded) or {}).get(NEMO_GYM_MCP_METADATA_KEY)
        if not isinstance(mcp, dict) or not mcp.get("headers"):
            raise ValueError(f"tool server {server.name!r}: its /seed_session answered no '{NEMO_GYM_MCP_METADATA_KEY}"
                             "' block with per-session headers; a sandboxed agent only gets authenticated MCP tools")
        url = sandbox_server_url(server.name, require_reachable=require_reachable)
        entries[server.name] = {"url": f"{url}/{str(mcp.get('url_path', '/mcp')).lstrip('/')}",
                                "headers": mcp["headers"], "enabled": True, "timeout": int(timeout_s * 1000)}
    return entries


async def verify_agent_response(client: Any, server: ResourcesServerRef, body: BaseRunRequest,
                                response: NeMoGymResponse, cookies: Mapping[str, str], *, force_zero_reward: bool,
                                ) -> dict[str, Any]:
    """`/verify` of `response` on `server`, the verifier's fields kept (module docstring)."""
    graded = response.model_copy(update={"output": []}) if force_zero_reward else response
    answer = await client.post(server_name=server.name, url_path="/verify", cookies=cookies,
                               json=body.model_dump(mode="json") | {"response": graded.model_dump(mode="json")})
    await raise_for_status(answer)
    row = await get_response_json(answer)
    if not force_zero_reward:
        return row
    if row.get("reward") != 0 or row.get("mask_sample", False):
        raise ValueError(f"{server.name}: a failed agent run is scored by verifying an empty response, which must be "
                         f"an unmasked 0; the verifier answered reward={row.get('reward')!r}, "
                         f"mask_sample={row.get('mask_sample', False)!r}")
    row.update(response=response.model_dump(mode="json"), failure_kind=AGENT_RUN_ERROR,
               failure_reason="the agent's run failed; its response was verified empty, so it scores 0")
    return row
