"""Proof assembly and forbidden constructs, table- and generator-tested; parity with NeMo-Gym's recorded rows."""

from __future__ import annotations

import itertools
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder
from resources_servers.math_formal_lean import feedback, proof
from resources_servers.math_formal_lean.proof import FORBIDDEN_COMMANDS, FORBIDDEN_NAMES

STATEMENT = "theorem t (n : ℕ) (h₀ : 0 < n) : n ≠ 0 := by\n"


@pytest.mark.parametrize(("text", "code"), [
    ("```lean4\nA\n```", "A"),
    ("```lean4\nfirst\n```\nthen\n```lean4\nsecond\n```", "second"),
    ("```lean\nplain\n```\n```lean4\nfour\n```", "four"),  # the first language with a block wins, not the last block
    ("```lean3\nthree\n```\n```python\nprint()\n```", "three"),
    ("```\nanon\n```", "anon"),
    ("```python\nx = 1\n```", "python\nx = 1"),  # any-language blocks keep the tag, as NeMo-Gym's
    ("  omega  ", "omega"),
    ("```lean4\nunclosed", "unclosed"),
    ("simp\n```", "simp"),
    ("", ""),
])  # fmt: skip
def test_extract_code(text, code):
    assert proof.extract_code(text) == code


def test_extract_code_first_mode():
    assert proof.extract_code("```lean4\none\n```\n```lean4\ntwo\n```", "first") == "one"


@pytest.mark.parametrize(("code", "body"), [
    ("theorem t : 1 = 1 := by\n  rfl", "  rfl"),
    ("theorem t : 1 = 1 := by rfl", "rfl"),
    ("theorem t : 1 = 1 := rfl", "rfl"),
    ("theorem t (a : ℕ)\n    (h : a = 1) :\n    a = 1 := by\n  exact h", "  exact h"),
    ("import Mathlib\nopen Real\n/-- doc -/\ntheorem t : True := by\n  trivial", "  trivial"),
    ("lemma helper : True := trivial\ntheorem t : True := by\n  exact helper", "  exact helper"),  # helper dropped
    ("example : True := by\n  trivial", "  trivial"),
    ("  nlinarith [sq_nonneg (a - b)]", "nlinarith [sq_nonneg (a - b)]"),  # bare tactics
    ("theorem t : True", "theorem t : True"),  # no `:=`: kept whole
    ("theorem t : True := by", ""),
    ("theorem t : True :=\n  by\n  trivial", "  trivial"),
    ("theorem t : True :=\n  by trivial", "trivial"),
])  # fmt: skip
def test_proof_body(code, body):
    assert proof.proof_body(code) == body


def test_a_restated_statement_is_replaced_by_the_rows():
    """Whatever theorem the model states, the program proves the row's statement."""
    code = proof.extract_code("```lean4\ntheorem t : True := by\n  trivial\n```")
    assert proof.assemble("import Mathlib\n", STATEMENT, proof.proof_body(code)) == (
        "import Mathlib\n" + STATEMENT + "  trivial")


# --- forbidden constructs: every name, every spelling, every place ------------------------------------------------

SPELLINGS = {
    "plain": lambda name: name,
    "guillemets": lambda name: f"«{name}»",
    "root": lambda name: f"_root_.{name}",
    "namespaced": lambda name: f"Lean.{name}",
    "full-width": lambda name: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in name),
    "zero-width": lambda name: name[0] + "\u200b" + name[1:],
    "look-alike": lambda name: name.translate(str.maketrans({"s": "ѕ", "o": "о", "a": "а", "e": "е", "c": "с",
                                                             "p": "р", "x": "х", "i": "і"})),
}
CODE_PLACES = {
    "tactic line": "  have h : n ≠ 0 := by omega\n  {}\n",
    "term": "  exact ({} _ true)\n",
    "after a comment": "  -- a comment\n  {}\n",
    "after a block comment": "  /- a /- nested -/ comment -/ {}\n",
    "interpolated string": '  exact (by simp [s!"x{{{}}}"])\n',
    "after a string": '  have : "--" = "--" := rfl\n  {}\n',
    "after a char": "  have : 'a' = 'a' := rfl\n  {}\n",
    "set_option": "  set_option debug.{} true in\n  omega\n",
}
HIDING_PLACES = {
    "line comment": "  omega -- {} later\n",
    "block comment": "  /- {} -/\n  omega\n",
    "nested block comment": "  /- outer /- {} -/ still comment -/\n  omega\n",
    "doc comment": "  /-- {} -/\n  omega\n",
    "string": '  have : "{0}" = "{0}" := rfl\n  omega\n',
    "escaped string": '  have : "\\"{0}\\"" = "" := by simp\n  omega\n',
    "raw string": '  have : r#"{}"# = "" := by simp\n  omega\n',
}


def _examples(places: dict[str, str]):
    """Every place x spelling x name (`set_option` only with the option's name)."""
    for (place, template), (spelling, spell), name in itertools.product(
            places.items(), SPELLINGS.items(), sorted(FORBIDDEN_NAMES)):
        if place != "set_option" or name == "skipKernelTC":
            yield pytest.param(template.format(spell(name)), name, id=f"{place}-{spelling}-{name}")


@pytest.mark.parametrize(("code", "name"), list(_examples(CODE_PLACES)))
def test_a_forbidden_name_in_code_is_found_however_spelt(code, name):
    assert name in proof.forbidden_constructs(code)


@pytest.mark.parametrize(("code", "name"), list(_examples(HIDING_PLACES)))
def test_a_forbidden_name_in_a_comment_or_string_is_not_code(code, name):
    assert proof.forbidden_constructs(code) == []


@pytest.mark.parametrize("command", sorted(FORBIDDEN_COMMANDS))
def test_commands_that_run_code_are_found(command):
    assert proof.forbidden_constructs(f"  omega\n{command} IO.println 1\n") == [command]
    assert proof.forbidden_constructs(f"  omega -- {command} later\n") == []


@pytest.mark.parametrize("code", [
    "  nlinarith [sq_nonneg (a - b), sq_nonneg (a + b)]",
    "  have h_sorry_free : 1 = 1 := rfl\n  exact h_sorry_free",  # identifiers merely containing a name
    "  intro x'\n  exact x'.le",
    "  simp [Nat.succ_le_iff, admitted_lemma]",
    "  rcases h with ⟨k, rfl⟩\n  exact ⟨2 * k ^ 2, by ring⟩",
    "  norm_num [Nat.pow_mod]",
    "  native_decide",
    "  exact Classical.byContradiction fun h => by simp_all",
    "  constructor <;> linarith",
    "  have : (axiomatic : ℕ) = 0 := sorry_free_lemma",
])  # fmt: skip
def test_ordinary_proofs_are_not_flagged(code):
    assert proof.forbidden_constructs(code) == []


def test_an_unterminated_comment_or_string_hides_nothing_after_it_from_lean_either():
    # Lean reads the rest as comment/string (and fails to compile); no name is code.
    assert proof.forbidden_constructs("  omega /- sorry") == []
    assert proof.forbidden_constructs('  exact "sorry') == []


def test_each_name_reported_once_in_order():
    assert proof.forbidden_constructs("  sorry\n  admit\n  sorry\naxiom x : False") == ["sorry", "admit", "axiom"]


# --- the verdict ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "stdout", "stderr", "verdict"), [
    ("completed", "", "", "completed"),
    ("completed", "a.lean:3:8: warning: declaration uses 'sorry'\n", "", "has_sorry"),
    ("completed", "", "SORRY appears", "has_sorry"),
    ("completed", "unused variable `sorryish`", "", "completed"),
    ("failed", "a.lean:1:1: error: x", "", "failed"),
    ("timeout", "", "", "timeout"),
])  # fmt: skip
def test_proof_status(status, stdout, stderr, verdict):
    assert proof.proof_status(status, stdout, stderr) == verdict


def test_error_feedback_marks_the_error_in_context():
    program = "\n".join(f"line {number}" for number in range(1, 11))
    text = feedback.error_feedback("failed", "/p/x.lean:6:5: error: boom\n  detail\n", "", program)
    assert "line 2\nline 3\nline 4\nline 5\nline <error>6</error>\nline 7\n" in text
    assert "Message: boom\n  detail" in text
    many = "".join(f"/p/x.lean:{line}:0: error: e{line}\n" for line in range(1, 11))
    text = feedback.error_feedback("failed", many, "", program)
    assert text.count("Error ") == feedback.MAX_ERRORS and "2 more errors not shown" in text
    assert feedback.error_feedback("timeout", "", "", program) == feedback.TIMEOUT_FEEDBACK
    assert feedback.error_feedback("failed", "x" * 3000, "", program).endswith("... [Truncated]")
    assert feedback.error_feedback("failed", "", "", program) == feedback.NO_OUTPUT_FEEDBACK


# --- parity with NeMo-Gym 0.7.0's recorded rows ---------------------------------------------------------------------

def _nemo_gym_rows():
    folder = nemo_gym_folder("math_formal_lean") / "data"
    problems = {}
    for line in (folder / "minif2f_test.jsonl").read_text().splitlines():
        row = json.loads(line)
        problems[row["name"]] = row
    recorded = []
    for line in (folder / "example_rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        text = "".join(part["text"] for item in row["response"]["output"] if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")
        recorded.append((text, row))
    for line in (folder / "multi_turn_success_examples.jsonl").read_text().splitlines():
        row = json.loads(line)
        recorded.append((row["all_attempts"][-1]["generation"], row))
    cases = []
    for text, row in recorded:
        name = re.search(r"theorem (\S+)", row["predicted_proof"]).group(1)
        cases.append(pytest.param(text, row, problems[name], id=name))
    return cases


NEMO_GYM_ROWS = _nemo_gym_rows()


def test_nemo_gym_ships_recorded_rows():
    assert len(NEMO_GYM_ROWS) == 7


@pytest.mark.parametrize(("text", "row", "problem"), NEMO_GYM_ROWS)
def test_same_program_and_verdict_as_nemo_gym(text, row, problem):
    body = proof.proof_body(proof.extract_code(text))
    program = proof.assemble(problem["header"], problem["formal_statement"], body)
    assert program == row["predicted_proof"]
    output = row["compiler_output"]
    output = json.loads(output) if isinstance(output, str) else output
    assert proof.proof_status(output["process_status"], output["stdout"], output["stderr"]) == row["proof_status"]
    assert proof.forbidden_constructs(proof.proof_body(proof.extract_code(text))) == []


def test_no_minif2f_statement_uses_a_forbidden_name():
    """The statements and headers are trusted text, but a name the rows use could never be forbidden."""
    folder = nemo_gym_folder("math_formal_lean") / "data"
    for line in (folder / "minif2f_test.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert proof.forbidden_constructs(row["formal_statement"]) == [], row["name"]


# --- generated programs: the lexer against a grammar of Lean's closed constructs -----------------------------------

_PLAIN = st.text(alphabet="abcxyz ₀ℕ→:=()+*0123.,", max_size=12)
"""Filler text: no quote, brace, comment marker or backslash, and no forbidden name."""


def _closed(hidden: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """One construct Lean reads as a unit, with `hidden` somewhere in its non-code contents (constructs are joined
    with spaces: `h'"'` is the name `h'` and a string to Lean too)."""
    inside = st.tuples(_PLAIN, hidden, _PLAIN).map("".join)
    block = st.recursive(inside.map(lambda text: f"/-{text}-/"),
                         lambda nested: st.tuples(_PLAIN, nested, _PLAIN).map(lambda t: f"/-{t[0]}{t[1]}{t[2]}-/"),
                         max_leaves=4)
    return st.one_of(
        inside.map(lambda text: f"--{text}\n"),
        block,
        inside.map(lambda text: f'"{text}"'),
        inside.map(lambda text: f'"{text}\\"{text}"'),
        st.tuples(inside, _PLAIN).map(lambda t: f's!"{t[0]}{{x + {t[1].strip() or "1"}}}{t[0]}"'),
        inside.map(lambda text: f'r#"{text}"#'),
        st.sampled_from(["'a'", "'\\n'", "'\\x41'", "'{'", "'\"'"]),
        st.sampled_from(["h₀", "Nat.succ_le", "foo'", "«a b»", "x.1", "sorry_free", "h_admit"]),
        st.sampled_from([" ", "\n", "(", ")", ":=", "[", "]", ",", "{", "}", "⟨", "⟩"]),
    )


_NAMES = sorted(FORBIDDEN_NAMES)
_SPELL = st.sampled_from(list(SPELLINGS.values()))
_HIDDEN = st.tuples(st.sampled_from(_NAMES), _SPELL).map(lambda t: t[1](t[0]))


@settings(max_examples=400, deadline=None)
@given(st.lists(_closed(_HIDDEN), max_size=12))
def test_forbidden_names_inside_closed_constructs_are_never_code(parts):
    assert proof.forbidden_constructs(" ".join(parts)) == []


@settings(max_examples=400, deadline=None)
@given(st.lists(_closed(_HIDDEN), max_size=8), st.sampled_from(_NAMES), _SPELL, st.lists(_closed(_HIDDEN), max_size=8))
def test_a_forbidden_name_after_any_closed_constructs_is_found(before, name, spell, after):
    code = " ".join(before) + "\n " + spell(name) + " \n" + " ".join(after)
    assert name in proof.forbidden_constructs(code)


@settings(max_examples=400, deadline=None)
@given(st.lists(_closed(_HIDDEN), max_size=6), st.sampled_from(_NAMES))
def test_a_forbidden_name_inside_an_interpolation_is_found(around, name):
    code = " ".join(around) + f' s!"text {{{name} x}} more" ' + " ".join(around)
    assert name in proof.forbidden_constructs(code)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(['"', "{", "}", "/-", "-/", "--", "\n", "'", 'r#"', '"#', "\\", "«", "»", "sorry",
                                  "x", " ", "#eval", "s!"]), max_size=200).map("".join))
def test_any_text_is_lexed_without_error(text):
    assert isinstance(proof.forbidden_constructs(text), list)


def test_deep_nesting_cannot_exhaust_recursion():
    assert proof.forbidden_constructs('s!"{' * 50_000) == []
    assert proof.forbidden_constructs("/-" * 50_000) == []
    assert proof.forbidden_constructs('s!"{' * 50_000 + "sorry") == ["sorry"]
