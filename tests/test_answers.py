import doctest
import time

import pytest

from gymfleet.grading import answers, choices, latex, think

ABCD = "ABCD"
ONE_MB = 1_000_000
JUNK = "Let me reconsider the kinetics {k_1} and \\frac{1}{2} once more, 12 34. "
HUGE_JUNK = JUNK * (ONE_MB // len(JUNK))


@pytest.mark.parametrize("module", [answers, choices, latex, think], ids=lambda module: module.__name__)
def test_every_docstring_example_holds(module):
    outcome = doctest.testmod(module)
    assert outcome.attempted > 3 and outcome.failed == 0


def _fast(fn, *args, budget_s=2.0):
    """`fn(*args)`, checking the CPU time it took on this thread (unlike wall-clock time, a loaded machine does not
    inflate it; a quadratic scan or a backtracking regex on a megabyte overshoots it by orders of magnitude)."""
    start = time.thread_time()
    result = fn(*args)
    assert time.thread_time() - start < budget_s, f"{fn.__name__} took too long on {len(args[0])} chars"
    return result


# ---------------------------------------------------------------------------------------------- last_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(r"The answer is \boxed{B}.", "B", id="simple"),
        pytest.param(
            r"Option A fails the energy balance, so not \boxed{A}. Checking C instead... Final: \boxed{C}",
            "C",
            id="last-box-wins",
        ),
        pytest.param(r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", id="nested-braces"),
        pytest.param(r"\boxed{\text{B}}", r"\text{B}", id="text-wrapper-kept"),
        pytest.param(r"\fbox{D}", "D", id="fbox"),
        pytest.param(r"\boxed {  C  }", "C", id="space-before-brace-and-padding"),
        pytest.param(r"so the result is \boxed 5$ as claimed", "5", id="bare-token"),
        pytest.param(r"the total is \boxed 12.", "12", id="bare-token-sentence-end"),
        pytest.param(r"x = \boxed -0.5, y = 3", "-0.5", id="bare-token-before-comma"),
        pytest.param(r"\boxed{7} and then \boxed .", None, id="bare-token-only-punctuation"),
        pytest.param(r"\boxed{\{1, 2\}}", r"\{1, 2\}", id="escaped-braces"),
        pytest.param(r"\boxed{\boxed{A}}", "A", id="box-in-box-inner-starts-last"),
        pytest.param(r"\boxed{B} ... running out of tokens \boxed{C", "B", id="unclosed-last-falls-back"),
        pytest.param(r"\boxed{\frac{1}{2}", None, id="only-unclosed"),
        pytest.param(r"\boxed{}", None, id="empty-box"),
        pytest.param(r"\boxed{ }", None, id="blank-box"),
        pytest.param("The answer is B.", None, id="no-box"),
        pytest.param("", None, id="empty-string"),
        pytest.param(r"\boxedB", None, id="not-a-box"),
    ],
)
def test_last_boxed(text, expected):
    assert latex.last_boxed(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(HUGE_JUNK + r"\boxed{B}", "B", id="1mb-junk-then-box"),
        pytest.param("\\boxed{" * (ONE_MB // 7), None, id="1mb-of-unclosed-boxes"),
        pytest.param("\\boxed{" + "{" * ONE_MB, None, id="1mb-of-open-braces"),
        pytest.param(r"\boxed{A}" + "}" * ONE_MB, "A", id="1mb-of-close-braces"),
        pytest.param(HUGE_JUNK, None, id="1mb-no-box"),
    ],
)
def test_last_boxed_is_fast_on_huge_text(text, expected):
    assert _fast(latex.last_boxed, text) == expected


# ---------------------------------------------------------------------------------------------- strip_think


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<think>Option A? No.</think>\n\nAnswer: B", "Answer: B", id="complete-block"),
        pytest.param("Intro <think>x</think> middle <think>y</think> end", "Intro  middle  end", id="two-blocks"),
        pytest.param("reasoning from a template-opened think...</think>Answer: C", "Answer: C", id="orphan-close"),
        pytest.param("a</think>b</think>c", "c", id="last-orphan-close-wins"),
        pytest.param("<think>x</think>kept</think>final", "final", id="orphan-after-block-drops-all-before"),
        pytest.param("Answer: D\n<think>let me double-check", "Answer: D", id="unclosed-open"),
        pytest.param("<think>never finished", "", id="only-unclosed"),
        pytest.param("plain answer", "plain answer", id="no-tags"),
        pytest.param("<THINK>kept</THINK>", "<THINK>kept</THINK>", id="tags-are-case-sensitive"),
        pytest.param("", "", id="empty-string"),
    ],
)
def test_strip_think(text, expected):
    assert think.strip_think(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("<think>" * (ONE_MB // 7), id="1mb-of-opens"),
        pytest.param("</think>" * (ONE_MB // 8), id="1mb-of-closes"),
        pytest.param("<think></think>" * (ONE_MB // 15), id="1mb-of-blocks"),
    ],
)
def test_strip_think_is_fast_on_huge_text(text):
    assert _fast(think.strip_think, text) == ""


# ---------------------------------------------------------------------------------------------- answer_after


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("The enzyme is a kinase.\nAnswer: B", "B", id="plain"),
        pytest.param("**Answer:** B", "B", id="bold-label-and-colon"),
        pytest.param("**Answer**: C", "C", id="bold-label"),
        pytest.param("__Answer__: D", "D", id="underscore-label"),
        pytest.param("Answer : B", "B", id="space-before-colon"),
        pytest.param("answer: b", "b", id="lowercase-label"),
        pytest.param("**Answer: B**", "B", id="bold-around-everything"),
        pytest.param("Final Answer: A", "A", id="final-answer"),
        pytest.param("Answer:\nB", "B", id="value-on-next-line"),
        pytest.param("Answer: A\nWait, that ignores the pKa.\nAnswer: C", "C", id="last-label-wins"),
        pytest.param("Answer: A\nAnswer:", "A", id="empty-last-label-skipped"),
        pytest.param("Answer:   ", None, id="empty-value"),
        pytest.param("The answer is B", None, id="no-colon"),
        pytest.param("", None, id="empty-string"),
    ],
)
def test_answer_after(text, expected):
    assert answers.answer_after(text) == expected


def test_answer_after_custom_label():
    assert answers.answer_after("Verdict: yes\nFinal verdict: no", label="verdict") == "no"


def test_answer_values_plain_form_keeps_markdown():
    assert answers.answer_values("Answer: A\n**Answer:** B", markdown=False) == ["A", "** B"]


def test_answer_after_is_fast_on_huge_text():
    assert _fast(answers.answer_after, HUGE_JUNK + "\nAnswer: B") == "B"
    assert _fast(answers.answer_after, "Answer:" + " " * ONE_MB) is None


# ---------------------------------------------------------------------------------------------- choice_letter


@pytest.mark.parametrize(
    "payload, strict, lenient",
    [
        pytest.param("B", "B", "B", id="bare-letter"),
        pytest.param("(B)", "B", "B", id="parenthesised"),
        pytest.param("**B**", "B", "B", id="bold"),
        pytest.param("$B$", "B", "B", id="math-mode"),
        pytest.param(r"\text{B}", "B", "B", id="text-wrapper"),
        pytest.param(r"\text{\textbf{B}}", "B", "B", id="nested-wrappers"),
        pytest.param("B) PCR", "B", "B", id="label-paren-with-text"),
        pytest.param("B: PCR", "B", "B", id="label-colon-with-text"),
        pytest.param("B.", "B", "B", id="label-dot"),
        pytest.param("C. A ligand-gated channel", "C", "C", id="article-a-after-label-is-not-a-list"),
        pytest.param("E", None, None, id="letter-outside-options"),
        pytest.param("b", None, "B", id="lowercase-only-lenient"),
        pytest.param("I think it is C", None, "C", id="sentence-last-capital"),
        pytest.param("b because the others fail", None, "B", id="leading-lowercase-letter"),
        pytest.param("PCR", None, None, id="word-not-letter"),
        pytest.param("A or B", None, None, id="hedge-or"),
        pytest.param("A/B", None, None, id="hedge-slash"),
        pytest.param("A, C", None, None, id="hedge-comma"),
        pytest.param("A and B", None, None, id="hedge-and"),
        pytest.param("A and/or B", None, None, id="hedge-and-or"),
        pytest.param("(A) or (B)", None, None, id="hedge-parenthesised"),
        pytest.param(r"\text{A} or \text{B}", None, None, id="hedge-in-wrappers"),
        pytest.param("A B", None, None, id="hedge-whitespace"),
        pytest.param("A, A", None, "A", id="same-letter-twice-is-not-a-list"),
        pytest.param("A: PCR\nB: ELISA\nC: qPCR\nD: Northern blot", None, None, id="prompt-echo-options"),
        # Hedges in other separator forms: label punctuation, markdown and filler words between the letters.
        pytest.param("B. or C.", None, None, id="hedge-labels-dot-or"),
        pytest.param("B, or C", None, None, id="hedge-comma-or"),
        pytest.param("B) or C)", None, None, id="hedge-labels-paren-or"),
        pytest.param("**B** or **C**", None, None, id="hedge-bold-or"),
        pytest.param("B (or maybe C)", None, None, id="hedge-parenthetical"),
        pytest.param("either A or D", None, None, id="hedge-either-or"),
        pytest.param("B vs. D", None, None, id="hedge-versus"),
        pytest.param("B.\nC.", None, None, id="hedge-one-per-line"),
        pytest.param("[A] / [C]", None, None, id="hedge-brackets-slash"),
        pytest.param("C, not B", None, "C", id="exclusion-is-not-a-hedge"),
        # A label with option text after it.
        pytest.param("(B) Mercury", "B", "B", id="paren-label-with-text"),
        pytest.param(r"\text{(B) Mercury}", "B", "B", id="paren-label-with-text-in-wrapper"),
        pytest.param("[D] Northern blot", "D", "D", id="bracket-label-with-text"),
        pytest.param("**C.** Western blot", "C", "C", id="bold-label-with-text"),
        pytest.param("(BRCA1)", None, None, id="parenthesised-word-is-not-a-label"),
        # "A" and "I" used as words.
        pytest.param("A close look shows it is B", None, "B", id="article-a-leads-sentence"),
        pytest.param("a strong base, so D", None, "D", id="lowercase-article-a"),
        pytest.param("I'm fairly sure it's C", None, "C", id="pronoun-contraction"),
        pytest.param("It is B. A careful check agrees.", None, "B", id="article-a-after-the-answer"),
        pytest.param("A is correct", None, "A", id="letter-a-then-is"),
        pytest.param("B or A is correct", None, None, id="hedge-with-letter-a-then-is"),
        pytest.param("A. or B.", None, None, id="hedge-starting-with-letter-a"),
        pytest.param("B) a kinase, or possibly C", None, None, id="label-text-naming-another-letter"),
        pytest.param("B: Vitamin D deficiency", None, None, id="label-text-with-letter-needs-option-texts"),
        pytest.param("", None, None, id="empty"),
        pytest.param(None, None, None, id="none"),
    ],
)
def test_choice_letter(payload, strict, lenient):
    assert choices.choice_letter(payload, ABCD) == strict
    assert choices.choice_letter(payload, ABCD, lenient=True) == lenient


def test_choice_letter_accepts_letter_list():
    assert choices.choice_letter("J", ["A", "B", "J"]) == "J"
    assert choices.choice_letter("J", []) is None


def test_choice_letter_lenient_skips_capitals_outside_options():
    assert choices.choice_letter("Then D", ABCD, lenient=True) == "D"
    assert choices.choice_letter("So D, as in J", ABCD, lenient=True) == "D"
    assert choices.choice_letter("So D, as in J", "ABCDEFGHIJ", lenient=True) == "J"


@pytest.mark.parametrize(
    "payload, expected",
    [
        pytest.param("I would pick D", "D", id="pronoun-leads"),
        pytest.param("I think I is right", "I", id="pronoun-then-letter-i"),
        pytest.param("I was going to say H", "H", id="pronoun-i-was"),
        pytest.param("I fits the data best", "I", id="letter-i-then-verb"),
        pytest.param("H or I", None, id="hedge-ending-in-i"),
        pytest.param("I or J", None, id="hedge-starting-with-i"),
    ],
)
def test_choice_letter_pronoun_i_with_ten_options(payload, expected):
    assert choices.choice_letter(payload, "ABCDEFGHIJ", lenient=True) == expected


MERCURY = {"A": "Venus", "B": "Mercury", "C": "Hepatitis B or C infection", "D": None}


@pytest.mark.parametrize(
    "payload, expected",
    [
        pytest.param(r"\text{(B) Mercury}", "B", id="label-and-its-text"),
        pytest.param("B) mercury.", "B", id="label-and-its-text-casefolded"),
        pytest.param("(C) Hepatitis B or C infection", "C", id="own-text-holding-letters"),
        pytest.param("(B) Venus", None, id="label-of-one-text-of-another"),
        pytest.param("B: Venus", None, id="colon-label-text-of-another"),
        pytest.param("(B) the closest planet", "B", id="label-and-free-text"),
        pytest.param("(B) the closest planet, or (A)", None, id="label-and-text-naming-another-option"),
        pytest.param("(B) Mercury or (A) Venus", None, id="two-labelled-options"),
        pytest.param("Hepatitis B or C infection", None, id="option-text-alone-is-not-a-letter"),
    ],
)
def test_choice_letter_with_option_texts(payload, expected):
    assert choices.choice_letter(payload, MERCURY) == expected


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param("A or " * (ONE_MB // 5), id="1mb-hedge"),
        pytest.param(HUGE_JUNK + "B", id="1mb-junk"),
        pytest.param("\\text{" * 100_000 + "B" + "}" * 100_000, id="deep-wrappers"),
    ],
)
def test_choice_letter_is_fast_on_huge_payload(payload):
    _fast(choices.choice_letter, payload, ABCD, True)


# ---------------------------------------------------------------------------------------------- match_option_text

OPTIONS = {"A": "PCR", "B": "RT-PCR", "C": "Western blot", "D": None}


@pytest.mark.parametrize(
    "payload, substring, expected",
    [
        pytest.param("western blot", False, "C", id="exact-casefolded"),
        pytest.param(r"\text{Western   Blot}", False, "C", id="exact-through-wrapper"),
        pytest.param("a western blot", False, None, id="exact-needs-equality"),
        pytest.param("I would run a Western blot here", True, "C", id="substring"),
        pytest.param("RT-PCR", True, None, id="substring-ambiguous"),
        pytest.param("RT-PCR", False, "B", id="exact-unambiguous"),
        pytest.param("None", True, None, id="null-option-never-matches"),
        pytest.param("", True, None, id="empty"),
        pytest.param(None, True, None, id="none"),
    ],
)
def test_match_option_text(payload, substring, expected):
    assert choices.match_option_text(payload, OPTIONS, substring=substring) == expected


# ---------------------------------------------------------------------------------------------- last_number


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("12 apples, then 30 more", "30", id="int"),
        pytest.param("The yield is 87.5%", "87.5", id="decimal"),
        pytest.param("so x = -4", "-4", id="negative"),
        pytest.param("ΔG = −12.3 kJ", "-12.3", id="unicode-minus"),
        pytest.param("a total of $1,234,567.", "1234567", id="thousands"),
        pytest.param("the probability is 3/4", "3/4", id="fraction"),
        pytest.param("pages 3-4", "4", id="range-hyphen-not-sign"),
        pytest.param("the list 1, 2, 3", "3", id="comma-space-list"),
        pytest.param("12,34", "34", id="bad-thousands-group"),
        pytest.param("no digits here", None, id="none"),
        pytest.param("", None, id="empty"),
    ],
)
def test_last_number(text, expected):
    assert answers.last_number(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(HUGE_JUNK + " so 42", "42", id="1mb-junk-then-number"),
        pytest.param("7" + "x" * ONE_MB, "7", id="number-only-at-start"),
        pytest.param("9" * ONE_MB, "9" * ONE_MB, id="1mb-digits"),
        pytest.param("1," * (ONE_MB // 2), "1", id="1mb-comma-list"),
        pytest.param("x" * ONE_MB, None, id="1mb-no-digits"),
    ],
)
def test_last_number_is_fast_on_huge_text(text, expected):
    assert _fast(answers.last_number, text) == expected


# ---------------------------------------------------------------------------------------------- small blocks


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("  Polymerase\tChain \n Reaction  ", "polymerase chain reaction", id="whitespace"),
        pytest.param("ÉLISA", "élisa", id="accents-casefolded"),
        pytest.param("", "", id="empty"),
    ],
)
def test_normalize(text, expected):
    assert answers.normalize(text) == expected


def test_tail():
    assert answers.tail("abcdef", 3) == "def"
    assert answers.tail("abc", 10) == "abc"
    assert answers.tail("abc", 0) == ""
    with pytest.raises(ValueError, match="max_chars"):
        answers.tail("abc", -1)


def _letter_params(script, letters, ascii_letters):
    return [pytest.param(ch, a, id=f"{script}-{a}") for ch, a in zip(letters, ascii_letters, strict=True)]


@pytest.mark.parametrize(
    "ch, expected",
    [
        *_letter_params("fullwidth", "ＡＢＣＤＺ", "ABCDZ"),
        *_letter_params("fullwidth-lower", "ａｂｚ", "ABZ"),
        *_letter_params("arabic", "أبجد", "ABCD"),
        *_letter_params("bengali", "অবডক", "ABCD"),
        pytest.param("c", "C", id="ascii-lower"),
        pytest.param("7", "7", id="digit"),
        pytest.param("ab", "AB", id="longer-string"),
    ],
)
def test_normalize_letter(ch, expected):
    assert choices.normalize_letter(ch) == expected


def test_unwrap_latex_text():
    assert latex.unwrap_latex_text(r"\mathrm{  C }") == "C"
    assert latex.unwrap_latex_text(r"\texttt{B}") == r"\texttt{B}"


# ---------------------------------------------------------------------------------------------- last_fenced_block


@pytest.mark.parametrize(("text", "code"), [
    ("```python\nprint(1)\n```", "print(1)"),
    ("Idea first.\n```\na = 1\n```\nThen:\n```python\nb = 2\nprint(b)\n```\nDone.", "b = 2\nprint(b)"),
    ("One fence only ```python\nprint(1)", None),
    ("No code at all.", None),
    ("```python\n```", ""),
    ("text ``` inline\nx = 1\n``` end", "x = 1"),
], ids=["plain", "last-block-wins", "unclosed", "none", "empty-block", "fence-inside-lines"])
def test_last_fenced_block(text, code):
    assert answers.last_fenced_block(text) == code


# ---------------------------------------------------------------------------------------------- last_tagged


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("Reasoning...\n<answer>Zoey is a sage</answer>", "Zoey is a sage", id="simple"),
        pytest.param("<answer>12</answer> wait, no: <answer>13</answer>", "13", id="last-pair-wins"),
        pytest.param("<answer>\n  42 \n</answer>", "42", id="stripped-multiline"),
        pytest.param("<answer>  </answer>", "", id="empty-pair-is-empty-string"),
        pytest.param("<answer>7</answer> then cut off <answer>8", "7", id="unclosed-last-falls-back"),
        pytest.param("<answer>8", None, id="only-unclosed"),
        pytest.param("<answer><answer>x</answer></answer>", "<answer>x", id="nested-pairs-with-first-close"),
        pytest.param("<Answer>5</Answer>", None, id="case-sensitive"),
        pytest.param("</answer>5<answer>", None, id="close-before-open"),
        pytest.param("no tags at all", None, id="none"),
    ],
)
def test_last_tagged(text, expected):
    assert answers.last_tagged(text) == expected


def test_last_tagged_other_tag():
    assert answers.last_tagged("<final>B</final><answer>A</answer>", tag="final") == "B"


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("<answer>" * (ONE_MB // 8), None, id="million-unclosed-openings"),
        pytest.param(HUGE_JUNK + "<answer>C</answer>", "C", id="answer-after-1mb"),
        pytest.param("<answer>x</answer>" * (ONE_MB // 18), "x", id="many-pairs"),
    ],
)
def test_last_tagged_is_fast_on_huge_text(text, expected):
    assert _fast(answers.last_tagged, text) == expected
