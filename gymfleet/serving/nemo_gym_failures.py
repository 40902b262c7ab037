"""NeMo-Gym 0.7.0's failure vocabulary (`nemo_gym.failure_kinds`): the `failure_kind` names a verify row, a log
line and a metric share, and the stages of an episode a failure happened in.

A name says what kind of thing went wrong (`<layer>_<condition>`, low cardinality, safe as a metric label); what to do
about it and the details are the occurrence's (`failure_reason`). An environment may add `<server>:<kind>` names of its
own. `validate_failure_kind(name)` returns the name unchanged and logs one warning per unknown name (an unknown label
stays visible instead of being dropped). gymfleet's own failure classes (`gymfleet.serving.resources.FAILURE_CLASSES`:
`judge_failed`, `sandbox_failed`, `transport_failed`, plus `verify_timeout`) count as known too.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

# NeMo-Gym's names (`nemo_gym.failure_kinds` re-exports exactly these); `GYMFLEET_FAILURE_CLASSES` is gymfleet's own.
__all__ = [
    "AGENT_COMMAND_NOT_ALLOWED", "AGENT_REQUEST_FAILED", "AGENT_RUN_ERROR", "AGENT_TIMEOUT", "CANCELLED",
    "COHORT_INCOMPLETE", "FAILURE_KINDS", "JUDGE_FAILED", "JUDGE_UNPARSEABLE", "KILL_SHAPED", "PERSISTENCE_FAILED",
    "PROVIDER_OOM_KILLED", "PROVIDER_QUOTA_EXHAUSTED", "PROVIDER_UNAVAILABLE", "SESSION_EXPIRED", "SESSION_LOST",
    "SESSION_RELEASE_FAILED", "SHUTDOWN", "TRANSPORT_LOCAL_RESOURCE", "TRANSPORT_PEER_DROP", "TRANSPORT_TIMEOUT",
    "TRANSPORT_UNREACHABLE", "VERIFIER_ERROR", "FailureStage", "is_namespaced", "is_registered",
    "validate_failure_kind",
]

log = logging.getLogger(__name__)

FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]

TRANSPORT_UNREACHABLE = "transport_unreachable"
TRANSPORT_PEER_DROP = "transport_peer_drop"
TRANSPORT_TIMEOUT = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE = "transport_local_resource"
AGENT_RUN_ERROR = "agent_run_error"
AGENT_REQUEST_FAILED = "agent_request_failed"
AGENT_TIMEOUT = "agent_timeout"
AGENT_COMMAND_NOT_ALLOWED = "agent_command_not_allowed"
JUDGE_FAILED = "judge_failed"
JUDGE_UNPARSEABLE = "judge_unparseable"
VERIFIER_ERROR = "verifier_error"
PROVIDER_UNAVAILABLE = "provider_unavailable"
PROVIDER_QUOTA_EXHAUSTED = "provider_quota_exhausted"
PROVIDER_OOM_KILLED = "provider_oom_killed"
SESSION_LOST = "session_lost"
SESSION_EXPIRED = "session_expired"
SESSION_RELEASE_FAILED = "session_release_failed"
CANCELLED = "cancelled"
KILL_SHAPED = "kill_shaped"
SHUTDOWN = "shutdown"
PERSISTENCE_FAILED = "persistence_failed"
COHORT_INCOMPLETE = "cohort_incomplete"

FAILURE_KINDS: frozenset[str] = frozenset(value for name, value in dict(globals()).items()
                                          if name.isupper() and isinstance(value, str))
"""NeMo-Gym's registered names (every upper-case string constant above)."""
GYMFLEET_FAILURE_CLASSES = frozenset({"sandbox_failed", "transport_failed", "verify_timeout"})
"""What gymfleet's own `/verify` failure rows name besides NeMo-Gym's (`judge_failed`, `session_lost`)."""

_NAMESPACED = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")
_warned: set[str] = set()


def is_registered(name: str) -> bool:
    """Whether `name` is one of NeMo-Gym's shared names."""
    return name in FAILURE_KINDS


def is_namespaced(name: str) -> bool:
    """Whether `name` is an environment's own `<server>:<kind>` name (matched whole: no trailing newline)."""
    return _NAMESPACED.fullmatch(name) is not None


def validate_failure_kind(name: str | None) -> str | None:
    """`name` unchanged; an unknown one (neither registered, gymfleet's, nor namespaced) is logged once."""
    if name is None or is_registered(name) or name in GYMFLEET_FAILURE_CLASSES or is_namespaced(name):
        return name
    if name not in _warned:
        _warned.add(name)
        log.warning("unknown failure_kind %r: use one of nemo_gym.failure_kinds' names, or '<server>:<kind>' for "
                    "one of this environment's own (warned once per name)", name)
    return name
