"""gymfleet.grading.text: word counts, the rule and Punkt sentence splitters, NLTK tokens, seeded language
detection."""

from __future__ import annotations

import time

import pytest

from gymfleet.grading import text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("don't e-mail 3.14", 6),
        ("state_of_art", 1),
        ("这是一个没有空格的中文句子", 1),
        ("नमस्ते दुनिया", 2),  # vowel signs are combining marks, so each Hindi word is one run
        ("  \n\t ", 0),
        ("", 0),
    ],
    ids=["apostrophe-hyphen-decimal", "underscore", "unspaced-chinese", "hindi-combining-marks", "blank", "empty"],
)
def test_word_count(value, expected):
    assert text.word_count(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Mr. Smith went to Washington. He was happy.", ["Mr. Smith went to Washington.", "He was happy."]),
        ("Pi is 3.14 approx. Yes.", ["Pi is 3.14 approx.", "Yes."]),
        ("Wait... what? Really!", ["Wait...", "what?", "Really!"]),
        ("He works at Acme Inc. He is fine.", ["He works at Acme Inc", "He is fine."]),
        ("I live in the U.S. He does not.", ["I live in the U.S.", "He does not."]),
        ("I live in the U.S. and he does not.", ["I live in the U.S. and he does not."]),
        ("Use e.g. this. Then i.e. that.", ["Use e.g. this.", "Then i.e. that."]),
        ("He said \u201chi.\u201d Then left.", ["He said \u201chi\u201d.", "Then left."]),
        ('She said "hi." Then left.', ['She said "hi".', "Then left."]),
        ("Line one\nLine two", ["Line one Line two"]),
        ("Hello!! World?!", ["Hello!", "!", "World?", "!"]),
        ("Version 1.2.3 is out. Yes.", ["Version 1.2.", "3 is out.", "Yes."]),
        ("The end.)", ["The end.", ")"]),
        ("Visit example.com today. Thanks.", ["Visit example.com today.", "Thanks."]),
        ("She has a Ph.D. in physics. Nice.", ["She has a Ph.D. in physics.", "Nice."]),
        ("I said <stop> hello <prd> world", ["I said", "hello . world"]),
        ("", []),
        ("  \n ", []),
    ],
    ids=[
        "title-abbreviation", "decimal", "ellipsis", "company-before-starter-loses-dot", "acronym-before-starter",
        "acronym-mid-sentence", "eg-ie", "curly-quote-moves", "straight-quote-moves", "line-feed-is-space",
        "repeated-marks", "version-number", "closing-paren", "website", "phd", "literal-markers", "empty",
        "whitespace",
    ],
)
def test_rule_sentences(value, expected):
    assert text.rule_sentences(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Hello there. This is a TEST. Done!", ["Hello there.", "This is a TEST.", "Done!"]),
        ("Dr. Smith arrived at 5 p.m. yesterday. He left.", ["Dr. Smith arrived at 5 p.m. yesterday.", "He left."]),
        ("1. First item.\n2. Second item.", ["1.", "First item.", "2.", "Second item."]),
        ("Title\n\n* a\n* b", ["Title\n\n* a\n* b"]),
        ("Really??? Yes!!! No?!", ["Really???", "Yes!!!", "No?", "!"]),
        ("e.g. this works. i.e. that too.", ["e.g.", "this works.", "i.e.", "that too."]),
        ("He said, \u201cHello there.\u201d Then he left.", ["He said, \u201cHello there.\u201d", "Then he left."]),
        ("   ", []),
    ],
    ids=["plain", "known-abbreviations", "list-markers", "bullets-one-sentence", "repeated-marks", "eg-ie-end",
         "curly-quote-nltk-3.10.2+", "blank"],
)
def test_punkt_sentences(value, expected):
    assert text.punkt_sentences(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("I can't do THIS -- it's U.S.A.-made, ok?",
         ["I", "ca", "n't", "do", "THIS", "--", "it", "'s", "U.S.A.-made", ",", "ok", "?"]),
        ('She said "hi."', ["She", "said", "``", "hi", ".", "''"]),
        ("well-known e-mail 3.14 $5", ["well-known", "e-mail", "3.14", "$", "5"]),
        ("It was necessary\u2014if not urgent.", ["It", "was", "necessary", "\u2014", "if", "not", "urgent", "."]),
        ("The 'quoted' word", ["The", "'", "quoted", "'", "word"]),
        ("Don't stop. Hello!", ["Do", "n't", "stop", ".", "Hello", "!"]),
        ("", []),
    ],
    ids=["contractions-acronym", "straight-quotes", "hyphen-decimal-dollar", "em-dash", "single-quotes",
         "two-sentences", "empty"],
)
def test_nltk_words(value, expected):
    assert text.nltk_words(value) == expected
    assert list(text.iter_nltk_words(value)) == expected


def test_detect_language_is_seeded_and_reads_plain_languages():
    assert {text.detect_language("hello") for _ in range(10)} == {text.detect_language("hello")}
    assert text.detect_language("The weather is lovely today and we are going to the beach.") == "en"
    assert text.detect_language("Hoy hace muy buen tiempo y vamos a ir a la playa con mis amigos.") == "es"


@pytest.mark.parametrize("value", ["", "12 + 30 = 42", "!!! ???"], ids=["empty", "digits", "punctuation"])
def test_detect_language_without_letters_is_none(value):
    assert text.detect_language(value) is None


def test_punkt_has_no_time_limit_on_a_long_dotted_text():
    # NLTK's own regex time limit (5 s for a whole scan) would make this pass or fail depending on machine load.
    started = time.thread_time()
    assert len(text.punkt_sentences("x. " * 60_000)) == 1  # "x." reads as an initial: no sentence ends
    assert time.thread_time() - started < 30


def test_rule_sentences_is_fast_on_a_megabyte():
    for value in ("x. " * 333_333, "<stop>" * 170_000, "a.b." * 250_000, "\n" * 1_000_000):
        started = time.thread_time()
        text.rule_sentences(value)
        assert time.thread_time() - started < 3, value[:8]


@pytest.mark.parametrize(
    ("reference", "candidate", "expected"),
    [
        ("ls -la\n", "ls -la\n", 1.0),
        ("ls -la\n", "ls -al\n", 12 / 14),  # "ls -" + "a" (or "l") + "\n": 6 of 7 characters each side
        ("abcd", "bcde", 6 / 8),
        ("abc", "xyz", 0.0),
        ("", "", 1.0),
        ("", "ls\n", 0.0),
        ("ls\n", "", 0.0),
    ],
    ids=["identical", "swapped-flags", "shifted", "disjoint", "both-empty", "reference-empty", "candidate-empty"],
)
def test_sequence_similarity(reference, candidate, expected):
    assert text.sequence_similarity(reference, candidate) == pytest.approx(expected)


def test_sequence_similarity_argument_order_matters_for_long_candidates():
    long_text, short_text = "echo a a a a a\n" * 20, "echo b\n"  # 300 characters: autojunk applies to it as candidate
    # As reference it is not junk-filtered: "echo " and "\n" match, 6 characters of 7 + 300.
    assert text.sequence_similarity(long_text, short_text) == pytest.approx(12 / 307)
    assert text.sequence_similarity(short_text, long_text) < text.sequence_similarity(long_text, short_text)
