r"""gymfleet.grading.mathcheck: math-verify equivalence in supervised workers, with reasons, caching and a hard
deadline."""

from __future__ import annotations

import asyncio
import doctest
import importlib.metadata
from pathlib import Path

import pytest

import gymfleet.grading.mathcheck
from gymfleet.errors import SandboxError
from gymfleet.grading.mathcheck import (
    MathChecker,
    MathPoolError,
    MathResult,
    close_default_checker,
    math_check,
    math_equal,
)

ROOT = Path(__file__).resolve().parents[1]
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
    assert doctest.testmod(gymfleet.grading.mathcheck).failed == 0


@pytest.mark.parametrize(
    ("gold", "pred", "equal", "reason"),
    [
        pytest.param("400", r"Adding them up gives $\boxed{400}$.", True, None, id="boxed-int"),
        pytest.param(r"\frac{1}{2}", r"\boxed{0.5}", True, None, id="frac-vs-decimal"),
        pytest.param(r"\frac{1}{2}", r"\boxed{1/2}", True, None, id="frac-vs-slash"),
        pytest.param(r"\frac{1}{2}", r"The probability is \boxed{\dfrac{1}{2}}", True, None, id="dfrac"),
        pytest.param(r"\(3\sqrt{2}\)", r"\boxed{\sqrt{18}}", True, None, id="radical-forms"),
        pytest.param("$-10$", r"so $y = \boxed{-10}$", True, None, id="delimited-gold-negative"),
        pytest.param("1, 2, 3", r"The roots are \boxed{3, 1, 2}", True, None, id="set-any-order"),
        pytest.param("12", r"\fbox{12}", True, None, id="fbox"),
        pytest.param("5", r"thus \boxed 5.", True, None, id="bare-token-box"),
        pytest.param("400", r"\boxed{401}", False, "not_equal", id="wrong"),
        pytest.param("401", r"\boxed{400} or maybe \boxed{401}", True, None, id="two-boxes-last-is-the-answer"),
        pytest.param("400", r"\boxed{400} or maybe \boxed{401}", False, "not_equal", id="two-boxes-first-ignored"),
        pytest.param("400", r"\boxed{400} and then \boxed{}", False, "no_boxed_answer", id="empty-last-box"),
        pytest.param("400", r"\boxed{400} then \boxed{ }", False, "no_boxed_answer", id="blank-last-box"),
        pytest.param("400", r"\boxed{401} cut off at \boxed{40", False, "not_equal", id="unclosed-last-box"),
        pytest.param("400", "I could not solve this one.", False, "no_boxed_answer", id="no-answer"),
        pytest.param("400", "   ", False, "no_boxed_answer", id="blank"),
        pytest.param("400", r"\boxed{\ldots}", False, "parse_error", id="box-math-verify-cannot-read"),
        pytest.param("", r"\boxed{400}", False, "gold_parse_error", id="empty-gold"),
        pytest.param("400", "x" * 50_001, False, "too_long", id="too-long"),
        # Hedges without a box: math-verify alone would find 2, 7, 3, 13 and 12 in these and pay them.
        pytest.param("2", "x = 1 or x = 2", False, "no_boxed_answer", id="hedge-equations"),
        pytest.param("7", "Possible answers: 7, 5, 3", False, "no_boxed_answer", id="hedge-possible-answers"),
        pytest.param("3", "1 2 3", False, "no_boxed_answer", id="hedge-bare-numbers"),
        pytest.param("12", "The answer is 12 or 13.", False, "no_boxed_answer", id="hedge-sentence"),
        pytest.param("2", r"\boxed{} so probably 2", False, "no_boxed_answer", id="hedge-after-empty-box"),
        pytest.param("2", r"$x = 2$", False, "no_boxed_answer", id="unboxed-latex"),
        # Hedges inside the box are a set, not the gold.
        pytest.param("1", r"\boxed{1 \text{ or } 2}", False, "not_equal", id="hedge-in-box-or"),
        pytest.param("1", r"\boxed{x = 1, x = 2}", False, "not_equal", id="hedge-in-box-equations"),
        pytest.param("7", r"\boxed{7, 5, 3}", False, "not_equal", id="hedge-in-box-list"),
        pytest.param("1", r"\boxed{1 \pm 1}", False, "not_equal", id="hedge-in-box-pm"),
    ],
)
async def test_math_check(checker, gold, pred, equal, reason):
    result = await checker.check(gold, pred)
    assert (result.equal, result.reason) == (equal, reason)
    assert result.reward == (1.0 if equal else 0.0)


async def test_extracted_answer_is_the_matching_prediction(checker):
    assert (await checker.check(r"\frac{1}{2}", r"\boxed{0.5}")).extracted == "1/2"
    assert (await checker.check("7", r"\boxed{8}")).extracted == "8"
    assert (await checker.check("7", "no idea")).extracted is None
    assert (await checker.check("7", r"\boxed{6} or \boxed{7}")).extracted == "7"
    assert (await checker.check("7", r"\boxed{7} or \boxed{6}")).extracted == "6"


@pytest.mark.parametrize("version", ["0.9.0", "0.9.12", "0.9.0rc1"])
def test_supported_library_versions(version):
    gymfleet.grading.mathcheck.check_library_version(version)


@pytest.mark.parametrize("version", ["0.8.0", "0.10.0", "1.0.0", "0", "dev"])
def test_other_library_versions_are_refused_with_the_range(version):
    with pytest.raises(ImportError, match=r"math-verify>=0\.9,<0\.10"):
        gymfleet.grading.mathcheck.check_library_version(version)


def test_installed_library_is_in_the_pinned_range():
    gymfleet.grading.mathcheck.check_library_version(importlib.metadata.version("math-verify"))
    pinned = [line for line in (ROOT / "pyproject.toml").read_text().splitlines() if '"math-verify' in line]
    assert len(pinned) == 1 and '"math-verify>=0.9,<0.10"' in pinned[0]


async def test_poison_input_times_out_without_stalling_ordinary_checks(checker):
    poison = asyncio.ensure_future(checker.check("3", POISON, timeout_s=3))
    await asyncio.sleep(0.3)
    ordinary = await asyncio.gather(*(checker.check(str(k), rf"\boxed{{{k}}}") for k in range(40)))
    assert all(result.equal for result in ordinary)
    assert not poison.done()
    assert await poison == MathResult(False, "timeout")


async def test_results_are_cached_but_timeouts_are_not(checker):
    items = checker.pool.stats["items"]
    first = await checker.check("4321", r"\boxed{4321} is the count")
    assert await checker.check("4321", r"so the count is \boxed{4321}") == first  # the same answer, differently put
    assert checker.pool.stats["items"] == items + 1
    for _ in range(2):
        assert (await checker.check("3", POISON + " ", timeout_s=0.3)).reason == "timeout"
    assert checker.pool.stats["items"] == items + 3


async def test_concurrent_identical_checks_share_one_verification(checker):
    items = checker.pool.stats["items"]
    results = await asyncio.gather(*(checker.check("5678", r"five, \boxed{5678}") for _ in range(8)))
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
