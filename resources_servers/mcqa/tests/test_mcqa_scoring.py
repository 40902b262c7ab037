import time
from typing import get_args

import pytest

from resources_servers.mcqa.scoring import GradingMode, options_letters, score

OPTIONS = [
    {"A": "Polymerase chain reaction"},
    {"B": "ELISA"},
    {"C": "Western blot"},
    {"D": "Northern blot"},
]
# Arrow-unified rows: every dict carries every key, null where the option is not that letter.
ARROW_OPTIONS = [
    {"A": "Polymerase chain reaction", "B": None, "C": None},
    {"A": None, "B": "ELISA", "C": None},
    {"A": None, "B": None, "C": "Western blot"},
]
PCR_OPTIONS = [{"A": "PCR"}, {"B": "RT-PCR"}, {"C": "Sanger sequencing"}, {"D": "Mass spectrometry"}]
FULLWIDTH_B = "Ｂ"
ARABIC_B = "ب"
BENGALI_D = "ক"

PROMPT_ECHO = (
    "Which assay detects a specific protein in a lysate after SDS-PAGE?\n"
    "A: Polymerase chain reaction\nB: ELISA\nC: Western blot\nD: Northern blot\n"
    "Put the letter of your choice in \\boxed{}."
)
COT = "The question asks about protein detection after gel separation. PCR and Northern blots target nucleic acids. "

# The regex of a NeMo-Gym template that asks for "Answer: \boxed{{X}}" (format-string braces, often copied).
BOXED_TEMPLATE_REGEX = r"\\boxed\{\s*([A-Za-z])\s*\}"
PLANETS = [{"A": "Venus"}, {"B": "Mercury"}, {"C": "Mars"}, {"D": "Jupiter"}]
HEPATITIS = [{"A": "Hepatitis A"}, {"B": "Hepatitis B or C co-infection"}, {"C": "Vitamin D deficiency"},
             {"D": "Iron overload"}]

STRICT, LENIENT_BOXED = "strict_single_letter_boxed", "lenient_boxed"
COLON, COLON_MD = "lenient_answer_colon", "lenient_answer_colon_md"


def case(text, expected, mode, extracted, *, options=OPTIONS, output_regex=None, id):
    reward = float(extracted is not None and extracted == expected.strip().upper())
    return pytest.param(text, options, expected, mode, output_regex, reward, extracted, id=id)


CASES = [
    # strict_single_letter_boxed
    case(COT + r"So the answer is \boxed{C}.", "C", STRICT, "C", id="strict-correct"),
    case(COT + r"So the answer is \boxed{B}.", "C", STRICT, "B", id="strict-wrong"),
    case(COT + r"\boxed{C}", " c ", STRICT, "C", id="strict-gold-needs-strip-and-upper"),
    case(r"First thought \boxed{B}. Actually no: \boxed{C}", "C", STRICT, "C", id="strict-last-box-wins"),
    case(r"\boxed{C} ... on reflection \boxed{B}", "C", STRICT, "B", id="strict-last-box-wins-wrong"),
    case(r"\boxed{\text{C}}", "C", STRICT, "C", id="strict-text-wrapper"),
    case(r"\boxed{\textbf{C}}", "C", STRICT, "C", id="strict-textbf-wrapper"),
    case(r"\boxed{(C)}", "C", STRICT, "C", id="strict-parenthesised"),
    case(r"\boxed{C) Western blot}", "C", STRICT, "C", id="strict-letter-paren-text"),
    case(r"\boxed{C: Western blot}", "C", STRICT, "C", id="strict-letter-colon-text"),
    case(r"\boxed{c}", "C", STRICT, None, id="strict-lowercase-rejected"),
    case(r"\boxed{E}", "C", STRICT, None, id="strict-letter-outside-options"),
    case(r"\boxed{Western blot}", "C", STRICT, None, id="strict-option-text-rejected"),
    case(r"\boxed{B or C}", "C", STRICT, None, id="strict-hedge-or"),
    case(r"\boxed{B/C}", "C", STRICT, None, id="strict-hedge-slash"),
    case(r"\boxed{B, C}", "C", STRICT, None, id="strict-hedge-comma"),
    case(
        r"\boxed{A: PCR B: ELISA C: Western blot D: Northern blot}", "A", STRICT, None, id="strict-all-options-in-box"
    ),
    case("The answer is C.", "C", STRICT, None, id="strict-no-box"),
    case(PROMPT_ECHO, "C", STRICT, None, id="strict-prompt-echo-empty-box"),
    case(PROMPT_ECHO + "\n" + r"\boxed{C}", "C", STRICT, "C", id="strict-prompt-echo-then-answer"),
    case(r"\boxed{C", "C", STRICT, None, id="strict-unclosed-box"),
    case("", "C", STRICT, None, id="empty"),
    case(" \n\t ", "C", STRICT, None, id="whitespace-only"),
    case("x" * 1_000_000 + r"\boxed{C}", "C", STRICT, "C", id="strict-1mb-junk-then-box"),
    case(r"\boxed{C}" + "x" * 1_000_000, "C", STRICT, None, id="strict-box-beyond-scan-window"),
    case(r"\boxed{B}", "B", STRICT, "B", options=ARROW_OPTIONS, id="strict-arrow-null-keys"),
    # strict: hedges in other separator forms score 0 whichever letter is gold
    case(r"\boxed{B. or C.}", "C", STRICT, None, id="strict-hedge-labels-dot-or"),
    case(r"\boxed{B, or C}", "B", STRICT, None, id="strict-hedge-comma-or"),
    case(r"\boxed{\textbf{B} or \textbf{C}}", "C", STRICT, None, id="strict-hedge-bold-wrappers"),
    case(r"\boxed{(B) or (C)}", "B", STRICT, None, id="strict-hedge-parenthesised"),
    case(r"\boxed{B (or possibly C)}", "B", STRICT, None, id="strict-hedge-parenthetical"),
    case(r"\boxed{C) Western blot, or else B}", "C", STRICT, None, id="strict-label-text-naming-another"),
    case(r"\boxed{A, B, C, D}", "D", STRICT, None, id="strict-every-letter"),
    case(r"\boxed{\text{A or B or C or D}}", "A", STRICT, None, id="strict-every-letter-or"),
    # strict: a box holding a label and option text
    case(r"\boxed{\text{(B) Mercury}}", "B", STRICT, "B", options=PLANETS, id="strict-paren-label-and-text"),
    case(r"The closest planet is \boxed{\text{(B) Mercury}}", "C", STRICT, "B", options=PLANETS,
         id="strict-paren-label-and-text-wrong"),
    case(r"\boxed{[D] Jupiter}", "D", STRICT, "D", options=PLANETS, id="strict-bracket-label-and-text"),
    case(r"\boxed{\text{(B) Venus}}", "B", STRICT, None, options=PLANETS, id="strict-label-of-one-text-of-another"),
    case(r"\boxed{\text{(A) Venus}}", "A", STRICT, "A", options=PLANETS, id="strict-label-and-text-first-option"),
    case(r"\boxed{B) Hepatitis B or C co-infection}", "B", STRICT, "B", options=HEPATITIS,
         id="strict-own-text-holding-letters"),
    case(r"\boxed{C: Vitamin D deficiency}", "C", STRICT, "C", options=HEPATITIS, id="strict-own-text-naming-d"),
    case(r"\boxed{C: lack of vitamin D}", "C", STRICT, None, options=HEPATITIS, id="strict-paraphrase-naming-d"),
    case(r"\boxed{D}", "D", STRICT, None, options=ARROW_OPTIONS, id="strict-letter-only-in-null-keys"),
    # lenient_boxed
    case(r"\boxed{C}", "C", LENIENT_BOXED, "C", id="lenient-boxed-letter"),
    case(r"\boxed{Western blot}", "C", LENIENT_BOXED, "C", id="lenient-boxed-option-text"),
    case(r"\boxed{\text{I would use a western   blot}}", "C", LENIENT_BOXED, "C", id="lenient-boxed-text-substring"),
    case(r"\boxed{RT-PCR}", "B", LENIENT_BOXED, None, options=PCR_OPTIONS, id="lenient-boxed-ambiguous-text"),
    case(r"\boxed{Sanger sequencing}", "C", LENIENT_BOXED, "C", options=PCR_OPTIONS, id="lenient-boxed-unique-text"),
    case("The answer is Western blot.", "C", LENIENT_BOXED, None, id="lenient-boxed-needs-a-box"),
    case(r"\boxed{Western blot or ELISA}", "C", LENIENT_BOXED, None, id="lenient-boxed-two-texts"),
    case(r"\boxed{(B) Venus}", "A", LENIENT_BOXED, None, options=PLANETS, id="lenient-boxed-label-and-other-text"),
    case(r"\boxed{B. or C. Western blot}", "C", LENIENT_BOXED, None, id="lenient-boxed-hedge-then-text"),
    case(r"\boxed{\text{(B) Mercury}}", "B", LENIENT_BOXED, "B", options=PLANETS, id="lenient-boxed-label-and-text"),
    # lenient_answer_colon
    case(COT + "\nAnswer: C", "C", COLON, "C", id="colon-letter"),
    case("answer:\n\nc", "C", COLON, "C", id="colon-lowercase-next-line"),
    case("Answer: western blot", "C", COLON, "C", id="colon-option-text"),
    case(r"Answer: \text{C}", "C", COLON, "C", id="colon-text-wrapper"),
    case("Answer: C\nAnswer: B", "C", COLON, "C", id="colon-first-match-wins"),
    case("**Answer:** C", "C", COLON, None, id="colon-markdown-not-handled"),
    case("Answer: C because blots detect proteins", "C", COLON, None, id="colon-letter-with-explanation"),
    case("Answer: E", "C", COLON, None, id="colon-letter-outside-options"),
    case("The correct option is C.", "C", COLON, None, id="colon-no-label"),
    # lenient_answer_colon_md
    case(COT + "\n**Answer:** C", "C", COLON_MD, "C", id="md-bold"),
    case("__Answer__: c", "C", COLON_MD, "C", id="md-underscore-lowercase"),
    case("**Answer:** (c)", "C", COLON_MD, None, id="md-lowercase-in-parens-not-read"),
    case("Answer: C is the only protein assay", "C", COLON_MD, "C", id="md-leading-letter"),
    case("**Answer:** I am confident it is C", "C", COLON_MD, "C", id="md-last-standalone-capital"),
    case("Answer: B\nOn reflection...\n**Answer:** C", "C", COLON_MD, "C", id="md-last-label-wins"),
    case("Answer: C\n**Answer:** B or C", "C", COLON_MD, "C", id="md-hedge-skipped-earlier-used"),
    case("**Answer:** B or C", "C", COLON_MD, None, id="md-hedge-only"),
    case("**Answer:** B. or C.", "C", COLON_MD, None, id="md-hedge-labels-dot-or"),
    case("**Answer:** B, or C", "B", COLON_MD, None, id="md-hedge-comma-or"),
    case("**Answer:** **B** or **C**", "C", COLON_MD, None, id="md-hedge-bold"),
    case("Answer: B (or maybe C)", "B", COLON_MD, None, id="md-hedge-parenthetical"),
    case("**Answer:** A close look shows it is C", "C", COLON_MD, "C", id="md-article-a-leads"),
    case("**Answer:** A close look shows it is C", "A", COLON_MD, "C", id="md-article-a-is-not-choice-a"),
    case("**Answer:** I'm confident it's D", "D", COLON_MD, "D", id="md-pronoun-contraction"),
    case("Answer: A is the only one that amplifies DNA", "A", COLON_MD, "A", id="md-letter-a-then-is"),
    case("**Answer:** a careful reading points nowhere", "A", COLON_MD, None, id="md-lowercase-article-only"),
    case("**Answer:** Western blot", "C", COLON_MD, None, id="md-option-text-not-a-letter"),
    case(PROMPT_ECHO + "\nAnswer: $LETTER", "C", COLON_MD, None, id="md-template-placeholder"),
    # output_regex takes priority over the mode
    case("The final choice: C", "C", STRICT, "C", output_regex=r"final choice:\s*([A-D])", id="regex-str"),
    case(r"choice: B ... \boxed{C}", "C", STRICT, "B", output_regex=r"choice:\s*([A-D])", id="regex-beats-box"),
    case("choice: A\nchoice: C", "C", STRICT, "C", output_regex=r"choice:\s*(\w)", id="regex-last-match"),
    case("CHOICE: c", "C", STRICT, "C", output_regex=r"choice:\s*(\w)", id="regex-ignorecase-upper"),
    case(
        "Answer: C",
        "C",
        STRICT,
        "C",
        output_regex=[r"final:\s*(\w)", r"answer:\s*(\w)"],
        id="regex-list-second-yields",
    ),
    case(
        "final: B\nAnswer: C",
        "C",
        STRICT,
        "B",
        output_regex=[r"final:\s*(\w)", r"answer:\s*(\w)"],
        id="regex-list-first-wins",
    ),
    # output_regex yields nothing: the mode reads the text, as NeMo-Gym does
    case(r"\boxed{C}", "C", STRICT, "C", output_regex=r"answer:\s*(\w)", id="regex-no-match-falls-back"),
    case(
        COT + r"Answer: \boxed{{C}}", "C", STRICT, "C", output_regex=BOXED_TEMPLATE_REGEX, id="regex-doubled-braces"
    ),
    case(r"Answer: \boxed{{B}}", "C", STRICT, "B", output_regex=BOXED_TEMPLATE_REGEX, id="regex-doubled-braces-wrong"),
    case(
        r"Answer: \boxed{{B or C}}", "C", STRICT, None, output_regex=BOXED_TEMPLATE_REGEX, id="regex-fallback-hedge"
    ),
    case(r"\boxed{{C}}", "C", STRICT, "C", output_regex=[r"final:\s*(\w)", r"x\s*(\d)"], id="regex-list-none-match"),
    case("answer: 7 so \\boxed{C}", "C", STRICT, "C", output_regex=r"answer:\s*(.+?)\s", id="regex-yields-no-letter"),
    case("**Answer:** C", "C", COLON_MD, "C", output_regex=r"Final Choice:\s*([A-Z])", id="regex-fallback-row-mode"),
    case("Final Choice: B\n**Answer:** C", "C", COLON_MD, "B", output_regex=r"Final Choice:\s*([A-Z])",
         id="regex-match-beats-row-mode"),
    case(r"\boxed{D}", "D", STRICT, None, output_regex=r"answer:\s*(\w)", options=ARROW_OPTIONS,
         id="regex-fallback-letter-outside-options"),
    case("answer: Z", "C", STRICT, "Z", output_regex=r"answer:\s*(\w)", id="regex-letter-outside-options"),
    case("answer: western blot", "C", STRICT, "C", output_regex=r"answer:\s*(.+)", id="regex-option-text"),
    case("answer: 7", "C", STRICT, None, output_regex=r"answer:\s*(.+)", id="regex-digit-not-a-letter"),
    case(f"الإجابة: {ARABIC_B}", "B", STRICT, "B", output_regex=r"الإجابة:\s*(\S)", id="regex-arabic-letter"),
    case(f"উত্তর: {BENGALI_D}", "D", STRICT, "D", output_regex=r"উত্তর:\s*(\S)", id="regex-bengali-letter"),
    case(f"答案：{FULLWIDTH_B}", "B", STRICT, "B", output_regex=r"答案：\s*(\S)", id="regex-fullwidth-letter"),
    case("Answer is C", "C", STRICT, "C", output_regex=r"(?<=answer is )[A-D]", id="regex-without-group"),
    case("Answer is C", "C", STRICT, None, output_regex=r"answer is [A-D]", id="regex-whole-match-not-a-letter"),
    case(r"\boxed{C}", "C", STRICT, "C", output_regex=[], id="regex-empty-list-means-mode"),
]


@pytest.mark.parametrize("text, options, expected, mode, output_regex, reward, extracted", CASES)
def test_score(text, options, expected, mode, output_regex, reward, extracted):
    assert score(text, options, expected, mode, output_regex) == (reward, extracted)


@pytest.mark.parametrize("mode", get_args(GradingMode))
def test_every_mode_grades_empty_output_as_zero(mode):
    assert score("", OPTIONS, "A", mode) == (0.0, None)


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="unknown grading_mode 'strict'"):
        score(r"\boxed{A}", OPTIONS, "A", "strict")


def test_empty_gold_never_rewards():
    assert score(r"\boxed{A}", OPTIONS, "") == (0.0, "A")


@pytest.mark.parametrize("mode", get_args(GradingMode))
def test_huge_pathological_output_is_fast(mode):
    text = ("\\boxed{" + "Answer: A or " * 3 + "{") * 60_000
    start = time.thread_time()  # CPU seconds (milliseconds when idle): a loaded machine's wall clock is no measure
    score(text, OPTIONS, "A", mode, None)
    assert time.thread_time() - start < 1.0


def test_options_letters():
    assert options_letters(OPTIONS) == ["A", "B", "C", "D"]
    assert options_letters(ARROW_OPTIONS) == ["A", "B", "C"]
    assert options_letters([{"a": "x"}, {"AB": "y"}, {"1": "z"}, {}]) == ["A"]
