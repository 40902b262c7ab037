"""NeMo-Gym's `nemo_gym.verifier_fixture`: a folder's scorer cases, checked without a server, re-exported from
gymfleet (`gymfleet.testing.verifier_fixture`; no code of its own)."""

from gymfleet.testing.verifier_fixture import (
    VerifierFixture,
    VerifierFixtureCase,
    VerifierFixtureError,
    VerifierFixtureResult,
    exercise_verifier_fixture,
    load_verifier_fixture,
)

__all__ = [
    "VerifierFixture", "VerifierFixtureCase", "VerifierFixtureError", "VerifierFixtureResult",
    "exercise_verifier_fixture", "load_verifier_fixture",
]
