r"""gymfleet.mathcheck: math-verify equivalence in supervised workers, with reasons, caching and a hard deadline."""

from __future__ import annotations

import asyncio
import doctest

import pytest

import gymfleet.mathcheck
from gymfleet.errors import SandboxError
from gymfleet.mathcheck import MathChecker, MathPoolError, MathResult, close_default_checker, math_check, math_equal

POISON = r"so the answer is \boxed{9^{9^{9^{9}}}}"


@pytest.fixture(scope="module")
def checker():
    checker = MathChecker(workers=2)
    yield checker
    checker.close()


@pytest.fixture(scope="module", autouse=True)
def _close_default():
    yield
    close_default_checker()


def test_docstring_examples():
    assert doctest.testmod(gymfleet.mathcheck).failed == 0


@pytest.mark.parametrize(
    ("gold", "pred", "equal", "reason"),
    [
        ("400", r"Adding them up gives $\boxed{400}$.", True, None),
        (r"\frac{1}{2}", r"\boxed{0.5}", True, None),
        (r"\frac{1}{2}", r"\boxed{1/2}", True, None),
        (r"\frac{1}{2}", r"The probability is \boxed{\dfrac{1}{2}}", True, None),
        (r"\(3\sqrt{2}\)", r"\boxed{\sqrt{18}}", True, None),
        ("$-10$", "so y = -10", True, None),
        ("1, 2, 3", r"The roots are \boxed{3, 1, 2}", True, None),
        ("400", r"\boxed{401}", False, "not_equal"),
        ("400", r"\boxed{400} or maybe \boxed{401}", False, "not_equal"),
        ("400", "I could not solve this one.", False, "parse_error"),
        ("400", "   ", False, "parse_error"),
        ("", r"\boxed{400}", False, "gold_parse_error"),
        ("400", "x" * 50_001, False, "too_long"),
    ],
    ids=["boxed-int", "frac-vs-decimal", "frac-vs-slash", "dfrac", "radical-forms", "unboxed-negative",
         "set-any-order", "wrong", "two-answers", "no-answer", "blank", "empty-gold", "too-long"],
)
async def test_math_check(checker, gold, pred, equal, reason):
    result = await checker.check(gold, pred)
    assert (result.equal, result.reason) == (equal, reason)
    assert result.reward == (1.0 if equal else 0.0)


async def test_extracted_answer_is_the_matching_prediction(checker):
    assert (await checker.check(r"\frac{1}{2}", r"\boxed{0.5}")).extracted == "1/2"
    assert (await checker.check("7", r"\boxed{8}")).extracted == "8"
    assert (await checker.check("7", "no idea")).extracted is None


async def test_poison_input_times_out_without_stalling_ordinary_checks(checker):
    poison = asyncio.ensure_future(checker.check("3", POISON, timeout_s=3))
    await asyncio.sleep(0.3)
    ordinary = await asyncio.gather(*(checker.check(str(k), rf"\boxed{{{k}}}") for k in range(40)))
    assert all(result.equal for result in ordinary)
    assert not poison.done()
    assert await poison == MathResult(False, "timeout")


async def test_results_are_cached_but_timeouts_are_not(checker):
    items = checker.pool.stats["items"]
    first = await checker.check("12", r"\boxed{12} is the count")
    assert await checker.check("12", r"\boxed{12} is the count") == first
    assert checker.pool.stats["items"] == items + 1
    for _ in range(2):
        assert (await checker.check("3", POISON + " ", timeout_s=0.3)).reason == "timeout"
    assert checker.pool.stats["items"] == items + 3


async def test_concurrent_identical_checks_share_one_verification(checker):
    items = checker.pool.stats["items"]
    results = await asyncio.gather(*(checker.check("5", r"five, \boxed{5}") for _ in range(8)))
    assert {result.equal for result in results} == {True}
    assert checker.pool.stats["items"] == items + 1


async def test_cache_is_bounded():
    small = MathChecker(workers=1, cache_size=2)
    try:
        for k in range(4):
            await small.check(str(k), rf"\boxed{{{k}}}")
        assert len(small._cache) == 2
    finally:
        small.close()


async def test_closed_pool_is_an_infrastructure_error():
    closed = MathChecker(workers=1)
    closed.close()
    with pytest.raises(MathPoolError) as info:
        await closed.check("1", r"\boxed{1}")
    assert isinstance(info.value, SandboxError)


async def test_module_functions_use_the_default_checker():
    assert await math_equal(r"\frac{3}{4}", r"\boxed{0.75}") is True
    assert await math_equal("2", r"\boxed{3}") is False
    assert (await math_check("2", r"\boxed{2}")).extracted == "2"
