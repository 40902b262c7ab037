"""Grader-owned canaries: a test that must fail and one that must pass, added to every grading run.

The code under test runs in the same processes as the tests that grade it, so it can try to forge their results
(replace unittest's machinery at import time, exit 0 early, print a runner's report). Whatever it touches, a forgery
that turns failing tests into passes turns the must-fail canary into a pass too, and one that breaks the runner
breaks the must-pass canary: either scores `tests_tampered`. The canaries are written only when grading starts, in
a module whose name, class and methods are random (the patch cannot name them), and are run like any other test.

Graders that run a program on inputs and compare its output with expected outputs outside the sandbox (code_gen)
get `CaseCanaries` instead: a copy of a real case (must pass) and a real case's input paired with a fresh random
expected output that no program can print except by reading it (must fail), placed at random among the real
cases. The expected outputs never enter the sandbox, so the must-fail case can only pass if that stops being true
(or the program forges the result channel itself); a program that answers a copy of a case it passed differently
is keyed on the run, not on its input. A program that looks its answers up by input in a leaked table behaves
like a correct one on both canaries: the first line of defence stays that nothing expected is in the sandbox.

Examples:
    >>> canaries = make_canaries()
    >>> tampered(canaries, {canaries.must_pass}) is None, tampered(canaries, {canaries.must_fail}) is not None
    (True, True)
    >>> cases = case_canaries([("1", "2"), ("5", "10")], batch_size=1)
    >>> batch = cases.insert([("5", "10")], make=lambda case: case)
    >>> outputs = [str(2 * int(stdin)) for stdin, _ in batch]  # an honest program's
    >>> cases.split(outputs)[0], cases.tampered(outputs, str.__eq__)
    (['10'], None)
    >>> cases.tampered([expected for _, expected in batch], str.__eq__) is not None  # one that prints the expected
    True
"""

from __future__ import annotations

import dataclasses
import random
import secrets
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["CaseCanaries", "Canaries", "case_canaries", "interleave", "make_canaries", "tampered"]

T = TypeVar("T")


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


@dataclasses.dataclass(frozen=True)
class CaseCanaries:
    """One grading run's case canaries: `(input, expected)` pairs and where they sit in the batch.

    Attributes:
        must_pass: A copy of a real case.
        must_fail: A real case's input with a fresh random expected output.
        positions: Where `must_pass` and `must_fail` sit in the batch once `insert()`ed (random, distinct).
    """

    must_pass: tuple[str, str]
    must_fail: tuple[str, str]
    positions: tuple[int, int]

    def insert(self, batch: Sequence[T], make: Callable[[tuple[str, str]], T]) -> list[T]:
        """`batch` (the real cases this run sends) with `make(canary)` of each canary at its position."""
        full = list(batch)
        for index, canary in sorted(zip(self.positions, (self.must_pass, self.must_fail), strict=True)):
            full.insert(index, make(canary))
        return full

    def split(self, results: Sequence[T]) -> tuple[list[T], T | None, T | None]:
        """The real cases' results (in order), then the must-pass and must-fail canaries' (None when the run
        stopped before reaching them)."""
        pass_at, fail_at = self.positions
        real = [result for index, result in enumerate(results) if index not in self.positions]
        return real, _at(results, pass_at), _at(results, fail_at)

    def tampered(self, results: Sequence[T], passes: Callable[[T, str], bool]) -> str | None:
        """Why the run's results cannot be trusted (a canary that ran came out wrong), or None. `passes(result,
        expected)` is the grader's own comparison."""
        _, must_pass, must_fail = self.split(results)
        if must_fail is not None and passes(must_fail, self.must_fail[1]):
            return "the grader's must-fail canary passed: its expected output is random and in no file"
        if must_pass is not None and not passes(must_pass, self.must_pass[1]):
            return "the grader's must-pass canary (a copy of a case the program passed) failed"
        return None


def case_canaries(
    cases: Sequence[tuple[str, str]], batch_size: int, unknowable: Callable[[str], str] = str
) -> CaseCanaries:
    """Fresh canaries drawn from `(input, expected)` cases, for a batch of `batch_size` real cases:
    `unknowable(token)` writes a random token as an expected output (code_gen's call tests: a JSON string)."""
    rng = random.SystemRandom()
    token = f"canary-{secrets.token_hex(16)}"
    positions = rng.sample(range(batch_size + 2), 2)
    return CaseCanaries(rng.choice(cases), (rng.choice(cases)[0], unknowable(token)), (positions[0], positions[1]))


def _at(results: Sequence[T], index: int) -> T | None:
    return results[index] if index < len(results) else None
