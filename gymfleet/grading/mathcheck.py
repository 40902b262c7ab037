r"""Math answer equivalence with math-verify, run where a pathological answer cannot hurt the server.

`math_check(gold, pred)` decides whether a model's output `pred` states the answer `gold`, the way NeMo-Gym's
math_with_judge does (spec §1.2): the gold is stripped of outer `\(...\)` / `$...$` delimiters, wrapped in
`\boxed{}` and parsed with LaTeX extraction; the prediction (its last box, below) is parsed with expression and
LaTeX extraction; the two are compared with math-verify's `verify` (numeric precision 6). `math_equal` is the same,
as a bool.

The answer is the last `\boxed{}` (`gymfleet.grading.latex.last_boxed`), and only it:

- An output with no box, or whose last box is empty, is `no_boxed_answer` and never reaches math-verify. Handed
  the whole text, math-verify falls back to the last number or expression it can find, so hedges such as
  "x = 1 or x = 2", "Possible answers: 7, 5, 3" or a bare list of numbers would match a gold of 2, 7 or 3.
- Only the last box's content is parsed, re-wrapped as `\boxed{...}`. Handed the whole text, math-verify reads
  every box it finds, and how it combines several changed between releases (0.9 reads `\boxed{1} or \boxed{2}` as
  the set {1, 2}); reading only the last box makes the answer independent of that.

Library version: math-verify `>=0.9,<0.10` (pyproject.toml pins the same range). NeMo-Gym pins 0.8.0; the two read
several boxes, and some answers, differently, so results are only reproducible within one minor version.
`MathChecker` refuses to start on a version outside the range (`check_library_version`).

Hardening, because SymPy can spin for minutes or exhaust memory on a few characters (`9^{9^{9^{9}}}`, a deeply
nested fraction):

- The work runs in a `gymfleet.grading.procpool.ProcessPool` (default: one worker per CPU, started lazily): an item
  that uses up its budget (`timeout_s` of CPU time, or four times that of wall-clock time) has its worker killed and
  replaced without failing other items, and an item that has burnt 0.1 s of CPU is moved to low priority so
  ordinary items keep flowing. math-verify's own `signal.alarm` timeouts are off inside the workers. Each worker's
  address space is capped (`memory_mb`). The workers are forked from a fork server that has imported math-verify
  and taken SymPy's common code paths once, so a fresh worker is warm.
- Inputs over `max_chars` (default 50,000 characters) are refused without parsing.
- Inside the workers SymPy's `parse_expr` reuses one namespace instead of rebuilding it per call
  (`gymfleet.grading.sympy_parse`): the same results, a third less CPU per check.
- Identical `(gold, answer)` pairs are answered from a bounded LRU cache, and concurrent identical checks share one
  verification. Timeouts and worker crashes are not cached: they may depend on load.

Outcomes: a wrong, unparseable, oversized or too-slow answer is the model's fault: `MathResult(equal=False,
reason=...)` with reason `not_equal`, `no_boxed_answer` (no `\boxed{}`, or the last one is empty),
`parse_error` (math-verify could not read the last box), `gold_parse_error` (nor the gold), `too_long`, `timeout`,
`crash` (the worker died on this input twice) or `error` (math-verify raised while comparing). A pool that cannot
start workers is the infrastructure's fault: `MathPoolError`, a `gymfleet.errors.SandboxError`, which a resources
server turns into a `sandbox_failed` row.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from gymfleet.grading.latex import last_boxed
from gymfleet.grading.procpool import ItemTimeout, PoolError, ProcessPool, RemoteError, WorkerCrashed

__all__ = [
    "MathChecker",
    "MathPoolError",
    "MathResult",
    "check_library_version",
    "close_default_checker",
    "default_checker",
    "math_check",
    "math_equal",
    "strip_math_delimiters",
]

DEFAULT_TIMEOUT_S = 5.0
MAX_CHARS = 50_000
_EXTRACTED_MAX_CHARS = 2_000  # extracted answers travel back over the pipe and into every response row

LIBRARY_VERSIONS = ((0, 9), (0, 10))  # math-verify: at least 0.9, below 0.10 (see the module docstring)

Reason = Literal[
    "not_equal", "no_boxed_answer", "parse_error", "gold_parse_error", "too_long", "timeout", "crash", "error"
]


def check_library_version(version: str) -> None:
    """Raise unless `version` (math-verify's) is in the supported range, `>=0.9,<0.10`.

    Args:
        version: A version string such as `"0.9.0"`.

    Raises:
        ImportError: The version is outside the range, or not a release number.

    Examples:
        >>> check_library_version("0.9.0")
        >>> check_library_version("0.8.0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ImportError: math-verify 0.8.0 is installed; gymfleet.grading.mathcheck needs math-verify>=0.9,<0.10 ...
    """
    parts = version.split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        release = None
    low, high = LIBRARY_VERSIONS
    if release is None or not low <= release < high:
        wanted = f"math-verify>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise ImportError(
            f"math-verify {version} is installed; gymfleet.grading.mathcheck needs {wanted} (pip install '{wanted}')"
        )


class MathPoolError(PoolError):
    """The verification process pool cannot run (infrastructure): becomes a `sandbox_failed` row."""


@dataclass(frozen=True, slots=True)
class MathResult:
    r"""The outcome of one check.

    Attributes:
        equal: Whether the prediction states the gold answer.
        reason: None when equal; otherwise why not (see the module docstring).
        extracted: The extracted prediction that matched the gold, else the first one extracted; None when nothing
            was extracted. SymPy's string form (`1/2` for `\frac{1}{2}`), at most 2,000 characters.
    """

    equal: bool
    reason: Reason | None = None
    extracted: str | None = None

    @property
    def reward(self) -> float:
        """1.0 when equal, else 0.0."""
        return 1.0 if self.equal else 0.0


def strip_math_delimiters(text: str) -> str:
    r"""Remove one outer pair of `\(...\)` and then of `$...$` from `text`, and surrounding whitespace.

    Gold answers are often stored wrapped in inline-math delimiters, which break parsing once wrapped in `\boxed{}`.

    Args:
        text: A gold answer.

    Returns:
        The answer without its outer delimiters.

    Examples:
        >>> strip_math_delimiters(r" \(\frac{1}{2}\) ")
        '\\frac{1}{2}'
        >>> strip_math_delimiters("$-3$")
        '-3'
        >>> strip_math_delimiters("x + 1")
        'x + 1'
    """
    text = text.strip()
    if text.startswith("\\(") and text.endswith("\\)"):
        text = text[2:-2].strip()
    if len(text) > 1 and text.startswith("$") and text.endswith("$"):
        text = text[1:-1].strip()
    return text


# ---------------------------------------------------------------------------------------------- worker side

_library: Any = None


def _load_library() -> Any:
    """Import math-verify (in the worker only: the server process never pays for SymPy) and quiet its logging."""
    global _library
    if _library is None:
        import math_verify

        from gymfleet.grading import sympy_parse

        sympy_parse.install()  # the same results at a third less CPU (see that module)

        # Timeouts are disabled on purpose (the pool keeps the deadline); the library warns about that, and logs a
        # warning for every unparseable answer. Neither is news to anyone reading the server's log.
        logging.getLogger("math_verify").setLevel(logging.CRITICAL)
        _library = (
            math_verify,
            (math_verify.LatexExtractionConfig(),),
            (math_verify.ExprExtractionConfig(), math_verify.LatexExtractionConfig()),
        )
    return _library


# One of each common answer shape. SymPy imports and builds much of itself lazily, on first use: a first check of
# an unequal radical costs 600 ms, the same check later 10 ms. Running these once in the fork server, before any
# worker is forked, means no worker (fresh ones included) pays that, nor looks like a slow item.
_WARM_UP_CASES = (
    (r"\frac{1}{2}", r"x = \boxed{0.5}"),
    ("3", r"so \boxed{4}"),
    (r"7\sqrt{2}", r"\boxed{\sqrt{98}}"),
    (r"5\sqrt{2}", r"\boxed{\sqrt{51}}"),
    (r"\frac{1}{7}", "0.142857"),
    ("1, 2", r"\boxed{2, 1}"),
    ("(0, 1]", r"\boxed{(0,1]}"),
    ("x^2+1", r"\boxed{1+x^2}"),
    (r"30^\circ", r"\boxed{\frac{\pi}{6}}"),
    (r"\frac{3}{4}", r"The answer is $\dfrac{6}{8}$."),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\boxed{\begin{pmatrix} 1 \\ 3 \end{pmatrix}}"),
    ("y = 2x + 1", r"\boxed{y=1+2x}"),
    (r"\text{(B)}", r"\boxed{B}"),
)


def _warm_up() -> None:
    """Fork-server initializer: silence stray prints and take every common code path once (see above)."""
    sys.stdout = sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    for gold, pred in _WARM_UP_CASES:
        _verify_in_worker("\\boxed{" + gold + "}", pred)
    _parse_gold.cache_clear()


def _verify_in_worker(gold_boxed: str, pred: str) -> tuple[bool, str | None, str | None]:
    """Parse both sides and compare them; runs in a pool worker. Returns `(equal, reason, extracted)`."""
    library, _, pred_config = _load_library()
    gold = _parse_gold(gold_boxed)
    if not gold:
        return False, "gold_parse_error", None
    try:
        predictions = library.parse(pred, pred_config, parsing_timeout=None)
    except Exception:  # noqa: BLE001 - e.g. RecursionError on deeply nested input
        predictions = []
    if not predictions:
        return False, "parse_error", None
    try:
        # `verify(gold, predictions)` is true when any prediction matches; asking one at a time finds the matching
        # one (the extracted answer) without a second pass.
        matched = next((p for p in predictions if library.verify(gold, p, timeout_seconds=None)), None)
        extracted = str(predictions[0] if matched is None else matched)[:_EXTRACTED_MAX_CHARS]
    except Exception:  # noqa: BLE001 - includes MemoryError under the worker's RLIMIT_AS
        return False, "error", None
    return (True, None, extracted) if matched is not None else (False, "not_equal", extracted)


@functools.lru_cache(maxsize=1024)
def _parse_gold(gold_boxed: str) -> list[Any]:
    """Parsed gold (cached: a GRPO group checks many outputs against one gold). SymPy objects are immutable."""
    library, gold_config, _ = _load_library()
    try:
        return library.parse(gold_boxed, gold_config, parsing_timeout=None)
    except Exception:  # noqa: BLE001 - any failure to read the gold is reported, not raised
        return []


# ---------------------------------------------------------------------------------------------- caller side


class _Unset:
    """The type of `_UNSET`: `MathChecker.check`'s `box` was not given."""


_UNSET = _Unset()


class MathChecker:
    """A process pool for math-verify plus a result cache. Servers own one and close it on shutdown.

    Args:
        workers: Worker processes at full priority (default: `gymfleet.grading.procpool.available_cpus()`).
        cache_size: How many `(gold, pred)` results to remember.
        memory_mb: Address-space limit per worker; None for no limit.
        slow_after_s: After this much CPU time an item's worker drops to low priority (see
            `gymfleet.grading.procpool`). Ordinary answers need 1-20 ms of CPU; what a poison input burns at full
            priority is taken from them.

    Raises:
        ImportError: math-verify is not installed, or its version is outside `>=0.9,<0.10`.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        cache_size: int = 16_384,
        memory_mb: int | None = 4096,
        slow_after_s: float | None = 0.1,
    ):
        if importlib.util.find_spec("math_verify") is None:  # fail where the server is built, not per answer
            raise ImportError("gymfleet.grading.mathcheck needs math-verify: pip install 'math-verify>=0.9,<0.10'")
        check_library_version(importlib.metadata.version("math-verify"))
        self.pool = ProcessPool(
            _verify_in_worker,
            size=workers,
            initializer=_warm_up,
            preload=("math_verify", __name__),
            memory_mb=memory_mb,
            slow_after_s=slow_after_s,
        )
        self._cache_size = cache_size
        self._cache: OrderedDict[bytes, MathResult] = OrderedDict()
        self._inflight: dict[bytes, asyncio.Future[MathResult]] = {}

    async def check(
        self, gold: str, pred: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_chars: int = MAX_CHARS,
        box: str | None | _Unset = _UNSET,
    ) -> MathResult:
        r"""Whether `pred` states the answer `gold` (the module docstring has the rules).

        Args:
            gold: The expected answer, bare or in `\(...\)` / `$...$`.
            pred: The model's output; its last `\boxed{}` is the answer (the rest is never parsed).
            timeout_s: CPU-time budget for the verification once a worker has it (the wall-clock backstop is 4x).
            max_chars: Longer inputs are refused (`too_long`) without parsing.
            box: `last_boxed(pred)`, when the caller has it already (it is not looked for again).

        Returns:
            The result; never raises for anything the inputs contain.

        Raises:
            MathPoolError: The worker pool is closed or cannot start workers.
        """
        if len(pred) > max_chars or len(gold) > max_chars:
            return MathResult(False, "too_long")
        answer = last_boxed(pred) if box is _UNSET else box
        if answer is None:
            return MathResult(False, "no_boxed_answer")
        pred = "\\boxed{" + answer + "}"
        gold_boxed = "\\boxed{" + strip_math_delimiters(gold) + "}"
        key = hashlib.blake2b(f"{len(gold_boxed)}:{gold_boxed}{pred}".encode(), digest_size=16).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        running = self._inflight.get(key)
        if running is None or running.get_loop() is not asyncio.get_running_loop():
            running = self._inflight[key] = asyncio.ensure_future(self._verify(key, gold_boxed, pred, timeout_s))
            running.add_done_callback(lambda task: self._inflight.get(key) is task and self._inflight.pop(key))
        return await asyncio.shield(running)

    async def _verify(self, key: bytes, gold_boxed: str, pred: str, timeout_s: float) -> MathResult:
        try:
            equal, reason, extracted = await self.pool.run(gold_boxed, pred, timeout_s=timeout_s)
        except ItemTimeout:
            return MathResult(False, "timeout")
        except WorkerCrashed:
            return MathResult(False, "crash")
        except RemoteError:
            return MathResult(False, "error")
        except PoolError as exc:
            raise MathPoolError(f"math verification pool: {exc}") from exc
        result = MathResult(equal, reason, extracted)
        self._cache[key] = result
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return result

    async def equal(self, gold: str, pred: str, **kwargs: Any) -> bool:
        """`check(...).equal`."""
        return (await self.check(gold, pred, **kwargs)).equal

    def close(self) -> None:
        """Kill the workers; later checks raise `MathPoolError`."""
        self.pool.close()


_default: MathChecker | None = None


def default_checker() -> MathChecker:
    """The process-wide checker behind `math_check` / `math_equal` (created on first use; workers start lazily)."""
    global _default
    if _default is None or _default.pool.closed:
        _default = MathChecker()
    return _default


def close_default_checker() -> None:
    """Kill the default checker's workers (a later call creates a fresh checker)."""
    if _default is not None:
        _default.close()


async def math_check(
    gold: str, pred: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_chars: int = MAX_CHARS
) -> MathResult:
    r"""Check `pred` against `gold` with the process-wide `MathChecker`.

    Args:
        gold: The expected answer, bare or in `\(...\)` / `$...$`.
        pred: The model's output.
        timeout_s: CPU-time budget per verification (the wall-clock backstop is 4x).
        max_chars: Longer inputs are `too_long`.

    Returns:
        The `MathResult`.

    Raises:
        MathPoolError: The worker pool cannot run (infrastructure).
    """
    return await default_checker().check(gold, pred, timeout_s=timeout_s, max_chars=max_chars)


async def math_equal(
    gold: str, pred: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, max_chars: int = MAX_CHARS
) -> bool:
    r"""Whether `pred` states the answer `gold`: `math_check(...).equal`. A timeout or parse failure is False.

    Raises:
        MathPoolError: The worker pool cannot run (infrastructure).
    """
    return (await math_check(gold, pred, timeout_s=timeout_s, max_chars=max_chars)).equal
