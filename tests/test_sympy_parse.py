"""`gymfleet.grading.sympy_parse`: SymPy's `parse_expr` with a namespace built once gives SymPy's own answers.

The property, over generated inputs: the wrapped and the original `parse_expr` return the same expression (same
`srepr`) or raise the same type of exception, with `evaluate` on and off; and math-verify, with the wrapper installed,
extracts and compares every answer of a generated corpus exactly as without it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sympy import srepr
from sympy.parsing.sympy_parser import parse_expr

from gymfleet.grading.sympy_parse import sympy_namespace, with_namespace

ROOT = Path(__file__).resolve().parents[1]

# Names that mean something to SymPy or to Python (S, N, Q, E, I, pi, beta, lambda-ish, builtins), and plain ones.
_NAMES = ["x", "y", "t", "n", "k", "E", "I", "pi", "oo", "S", "N", "Q", "beta", "gamma", "zeta", "alpha",
          "max", "min", "abs", "sqrt", "sin", "log", "factorial", "Rational", "Symbol", "len", "sum", "round"]
_ATOMS = ["0", "1", "7", "-3", "42", "1000000007", "0.5", "3.14159", "1e-6", "2.", ".25", "1/3",
          "123456789012345678901"]


def _expression(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if depth > 3 or roll < 0.3:
        return rng.choice(_ATOMS + _NAMES)
    if roll < 0.6:
        op = rng.choice(["+", "-", "*", "/", "**", "%", "//"])
        return f"{_expression(rng, depth + 1)}{op}{_expression(rng, depth + 1)}"
    if roll < 0.85:
        args = ", ".join(_expression(rng, depth + 1) for _ in range(rng.randint(1, 2)))
        return f"{rng.choice(['sqrt', 'max', 'min', 'abs', 'sin', 'log', 'Max', 'Rational', 'Integer'])}({args})"
    return rng.choice(["(", "[", "x +", ")", "2 3", "lambda", "a b", "__import__", "1..2", "", "x = 1"])


def _outcome(call, text: str, evaluate: bool) -> str:
    try:
        return "ok " + srepr(call(text, evaluate=evaluate))
    except Exception as exc:  # noqa: BLE001 - the exception is the outcome under comparison
        # The type only: for inputs that hand SymPy a class as a value (`sin(O)`, `Max(min, x)`), which method
        # fails first follows set iteration order, so SymPy's own message varies between two identical calls.
        return f"raise {type(exc).__name__}"


def test_the_namespace_is_sympys():
    namespace = sympy_namespace()
    assert namespace["max"].__name__ == "Max" and namespace["min"].__name__ == "Min"
    assert namespace["Rational"].__module__.startswith("sympy") and namespace["len"] is len


@pytest.mark.parametrize("evaluate", [True, False])
def test_wrapped_parse_expr_answers_as_sympy_does(evaluate):
    wrapped = with_namespace(parse_expr)
    rng = random.Random(27 + evaluate)
    texts = [_expression(rng) for _ in range(300)] + _ATOMS + _NAMES
    compared = 0
    for text in texts:
        expected = _outcome(parse_expr, text, evaluate)
        if _outcome(parse_expr, text, evaluate) != expected:
            continue  # SymPy answers this one differently from call to call (a class handed over as a value)
        assert _outcome(wrapped, text, evaluate) == expected, text
        compared += 1
    assert compared > 0.9 * len(texts)


def test_one_call_cannot_change_the_next():
    wrapped = with_namespace(parse_expr)
    local: dict = {}
    wrapped("(pi := 3)", local_dict=local)  # an assignment expression writes to the local namespace it is given
    assert srepr(wrapped("pi")) == srepr(parse_expr("pi")) == "pi"


_CORPUS_SCRIPT = textwrap.dedent("""
    import json, logging, random, sys
    sys.path.insert(0, sys.argv[1])
    logging.disable(logging.CRITICAL)
    import math_verify as mv
    from sympy.core.cache import clear_cache
    from bench.math_verify_throughput import _ordinary
    from gymfleet.grading.mathcheck import _WARM_UP_CASES
    from gymfleet.grading import sympy_parse
    rng = random.Random(5)
    cases = [("\\\\boxed{" + g + "}", p) for g, p in _WARM_UP_CASES]
    cases += [("\\\\boxed{" + g + "}", t) for g, t in (_ordinary(rng, i) for i in range(20))]
    cases += [("\\\\boxed{x^2 - 1}", "\\\\boxed{(x-1)(x+1)}"), ("\\\\boxed{\\\\max(2, 3)}", "\\\\boxed{3}"),
              ("\\\\boxed{E}", "\\\\boxed{e}"), ("\\\\boxed{N}", "N = 4, so \\\\boxed{4}"), ("\\\\boxed{1e3}", "1000")]
    runs = []
    for mode in ("original", "installed"):
        if mode == "installed":
            sympy_parse.install()
            assert mv.parser.parse_expr is not sympy_parse._ORIGINAL
        for cached in (mv.parser.parse_latex_cached, mv.parser.parse_expr_cached):
            cached.cache_clear()
        clear_cache()
        out = []
        for gold, pred in cases:
            g = mv.parse(gold, (mv.LatexExtractionConfig(),), parsing_timeout=None)
            p = mv.parse(pred, (mv.ExprExtractionConfig(), mv.LatexExtractionConfig()), parsing_timeout=None)
            out.append([[str(x) for x in g], [str(x) for x in p], mv.verify(g, p, timeout_seconds=None)])
        runs.append(out)
    print(json.dumps(runs))
""")


def test_math_verify_reads_a_corpus_the_same_with_it_installed():
    done = subprocess.run([sys.executable, "-c", _CORPUS_SCRIPT, str(ROOT)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    original, installed = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(original) > 30 and any(equal for *_, equal in original) and not all(equal for *_, equal in original)
    assert installed == original
