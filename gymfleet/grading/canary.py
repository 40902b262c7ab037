"""Grader-owned canary tests: a test that must fail and one that must pass, added to every SWE grading run.

The code under test runs in the same processes as the tests that grade it, so it can try to forge their results
(replace unittest's machinery at import time, exit 0 early, print a runner's report). Whatever it touches, a forgery
that turns failing tests into passes turns the must-fail canary into a pass too, and one that breaks the runner
breaks the must-pass canary: either scores `tests_tampered`. The canaries are written only when grading starts, in
a module whose name, class and methods are random (the patch cannot name them), and are run like any other test.

Examples:
    >>> canaries = make_canaries()
    >>> tampered(canaries, {canaries.must_pass}) is None, tampered(canaries, {canaries.must_fail}) is not None
    (True, True)
"""

from __future__ import annotations

import dataclasses
import random
import secrets

__all__ = ["Canaries", "interleave", "make_canaries", "tampered"]


@dataclasses.dataclass(frozen=True)
class Canaries:
    """One grading run's canaries.

    Attributes:
        module: The module name (write `source` to `<module>.py` on the tests' import path).
        source: The module's text.
        must_fail: The dotted unittest id of the test that must fail.
        must_pass: The dotted unittest id of the test that must pass.
    """

    module: str
    source: str
    must_fail: str
    must_pass: str

    @property
    def ids(self) -> tuple[str, str]:
        return self.must_fail, self.must_pass


def make_canaries() -> Canaries:
    """Fresh canaries with random names and values."""
    module, cls = f"test_{secrets.token_hex(6)}", f"Test{secrets.token_hex(4).capitalize()}"
    fail_name, pass_name = f"test_{secrets.token_hex(5)}", f"test_{secrets.token_hex(5)}"
    value = secrets.randbelow(10**6) + 1
    source = (
        "import unittest\n\n\n"
        f"class {cls}(unittest.TestCase):\n"
        f"    def {pass_name}(self):\n"
        f"        self.assertEqual({value} * 2, {value * 2})\n"
        f"        self.assertTrue({value} > 0)\n\n"
        f"    def {fail_name}(self):\n"
        f"        self.assertEqual({value}, {value + 1})\n"
    )
    return Canaries(module, source, f"{module}.{cls}.{fail_name}", f"{module}.{cls}.{pass_name}")


def interleave(test_ids: list[str], canaries: Canaries) -> list[str]:
    """`test_ids` with the two canaries at random places among them."""
    ids = list(test_ids)
    for canary in canaries.ids:
        ids.insert(random.SystemRandom().randint(0, len(ids)), canary)
    return ids


def tampered(canaries: Canaries, passed: set[str]) -> str | None:
    """Why the run's results cannot be trusted (a canary came out wrong), or None."""
    if canaries.must_fail in passed:
        return "the grader's must-fail canary test passed"
    if canaries.must_pass not in passed:
        return "the grader's must-pass canary test did not pass"
    return None
