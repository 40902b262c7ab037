"""Grader-owned canaries: a test that must fail and one that must pass, added to every grading run.

The code under test runs in the same processes as the tests that grade it, so it can try to forge their results
(replace unittest's machinery at import time, exit 0 early, print a runner's report). Whatever it touches, a forgery
that turns failing tests into passes turns the must-fail canary into a pass too, and one that breaks the runner
breaks the must-pass canary: either scores `tests_tampered`. The canaries are written only when grading starts, in
a module whose name, class and methods are random (the patch cannot name them), and are run like any other test.

Graders that run a program on inputs and compare its output with expected outputs outside the sandbox (code_gen)
get `CaseCanaries` instead: a copy of a real case (must pass) and a real case's input paired with another case's
expected output (must fail: a correct program cannot print it, and it looks like any real case), placed at random
among the real cases. The expected outputs never enter the sandbox, so the must-fail case can only pass if that
stops being true (or the program forges the result channel itself); a program that answers a copy of a case it
passed differently is keyed on the run (its slot, a counter), not on its input. A program that looks its answers
up by input in a leaked table behaves like a correct one on both canaries: the first line of defence stays that
nothing expected is in the sandbox.

Examples:
    >>> canaries = make_canaries()
    >>> tampered(canaries, {canaries.must_pass}) is None, tampered(canaries, {canaries.must_fail}) is not None
    (True, True)
    >>> cases = case_canaries([("1", "2"), ("5", "10")], batch_size=1)
    >>> batch = cases.insert([("5", "10")], make=lambda case: case)
    >>> outputs = [str(2 * int(stdin)) for stdin, _ in batch]  # an honest program's
    >>> cases.split(outputs)[0], cases.tampered(outputs, str.__eq__), cases.must_fail in (("1", "10"), ("5", "2"))
    (['10'], None, True)
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
        must_fail: A real case's input with an expected output it cannot have (`case_canaries()`).
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
        """Why the run's results cannot be trusted, or None. Call it when every real case passed: a canary came
        out wrong, or the run stopped before the must-pass canary (at the must-fail one, whose input the program
        answered in a real case). `passes(result, expected)` is the grader's own comparison."""
        _, must_pass, must_fail = self.split(results)
        if must_fail is not None and passes(must_fail, self.must_fail[1]):
            return "the grader's must-fail canary passed: it expects another case's output, which is in no file"
        if must_pass is None:
            return "the grader's must-pass canary did not run: the run stopped at the must-fail canary"
        if not passes(must_pass, self.must_pass[1]):
            return "the grader's must-pass canary (a copy of a case the program passed) failed"
        return None


def case_canaries(
    cases: Sequence[tuple[str, str]],
    batch_size: int,
    agree: Callable[[str, str], bool] = str.__eq__,
    unknowable: Callable[[str], str] = str,
) -> CaseCanaries:
    """Fresh canaries drawn from `(input, expected)` cases, for a batch of `batch_size` real cases.

    The must-fail canary pairs a case's input with another case's expected output that `agree(a, b)` (the grader's
    comparison: does printing `a` pass where `b` is expected?) rejects, so it looks like any real case; when every
    case expects the same, with a random token written as an expected output by `unknowable(token)` (code_gen's call
    tests: a JSON string).
    """
    rng = random.SystemRandom()
    positions = rng.sample(range(batch_size + 2), 2)
    pairs = [(stdin, other) for stdin, expected in cases for _, other in cases if not agree(expected, other)]
    must_fail = rng.choice(pairs) if pairs else (rng.choice(cases)[0], unknowable(f"{secrets.token_hex(16)}"))
    return CaseCanaries(rng.choice(cases), must_fail, (positions[0], positions[1]))


def _at(results: Sequence[T], index: int) -> T | None:
    return results[index] if index < len(results) else None
