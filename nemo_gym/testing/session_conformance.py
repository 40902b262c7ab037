"""NeMo-Gym's `nemo_gym.testing.session_conformance`, re-exported from gymfleet
(`gymfleet.testing.session_conformance`; no code of its own)."""

from gymfleet.testing.session_conformance import check_resources_session_contract

__all__ = ["check_resources_session_contract"]
