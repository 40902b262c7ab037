"""Checkers that re-implement a reference regex in linear time agree with that regex, and stay fast on 1 MB.

The reference's regexes (`^\\s*\\*[^*].*$`, `\\[.*?\\]`, `<<[^\\n]+>>`, `first .*? last`) rescan from every start
position and go quadratic on adversarial outputs; the equivalence tests compare our scans with the plain regex on
many small random texts over the characters that matter.
"""

from __future__ import annotations

import random
import re
import time

import pytest

from resources_servers.instruction_following import registry
from resources_servers.instruction_following.checkers.base import Kwargs, Text
from resources_servers.instruction_following.checkers.copy import RepeatPhrase
from resources_servers.instruction_following.checkers.detectable_content import count_bracket_groups
from resources_servers.instruction_following.checkers.detectable_format import Title, _count_line_items
from resources_servers.instruction_following.tests.test_instruction_following_checkers import KWARGS_BY_ID

SAMPLES = 3000


def _texts(alphabet: list[str], seed: int, max_len: int = 14):
    rng = random.Random(seed)
    for _ in range(SAMPLES):
        yield "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max_len)))


def test_bullet_scan_matches_the_reference_regexes():
    star, dash = re.compile(r"^\s*\*[^\*].*$", re.MULTILINE), re.compile(r"^\s*-.*$", re.MULTILINE)
    for text in _texts(["*", "-", " ", "\n", "a", "\t"], seed=1):
        assert _count_line_items(text, "*") == len(star.findall(text)), repr(text)
        assert _count_line_items(text, "-") == len(dash.findall(text)), repr(text)


def test_bracket_scan_matches_the_reference_regex():
    for text in _texts(["[", "]", "a", "\n"], seed=2):
        assert count_bracket_groups(text) == len(re.findall(r"\[.*?\]", text)), repr(text)


def test_title_scan_matches_the_reference_regex():
    title = Title(Kwargs("detectable_format:title", {}, ()))
    for text in _texts(["<", ">", "a", " ", "\n"], seed=3):
        expected = any(m.lstrip("<").rstrip(">").strip() for m in re.findall(r"<<[^\n]+>>", text))
        assert title.check(Text(text)) is expected, repr(text)


@pytest.mark.parametrize("phrase", ["go to sea", "go", "a.b c a.b"], ids=["three-words", "one-word", "dot-pattern"])
def test_repeat_phrase_stretches_match_the_reference_regex(phrase):
    checker = RepeatPhrase(Kwargs("copy:repeat_phrase", {"phrase": phrase, "small_n": 2}, RepeatPhrase.kwargs))
    first, last = phrase.split()[0], phrase.split()[-1]
    reference = re.compile(f"{first} .*? {last}")
    for text in _texts(["go ", "sea ", "to ", " ", "\n", "a.b ", "axb", "c "], seed=4, max_len=10):
        assert checker._stretches(text) == reference.findall(text), repr(text)


MEGABYTE = 1_000_000
ADVERSARIAL = {
    "open-angles": "<<a" * (MEGABYTE // 3),
    "open-brackets": "[" * MEGABYTE,
    "line-feeds": "\n" * MEGABYTE,
    "spaces": " " * MEGABYTE,
    "indented-stars": "\n *" * (MEGABYTE // 3),
    "stars": "*" * MEGABYTE,
    "repeated-first-word": "Actions " * (MEGABYTE // 8),
    "hyphens": "a-" * (MEGABYTE // 2),
    "markers": "<stop><prd>" * (MEGABYTE // 11),
    "one-long-word": "a" * MEGABYTE,
}


# Checkers built on NLTK tokens: linear too, but NLTK needs seconds per megabyte, so they get one input of their own.
NLTK_IDS = {
    "length_constraints:number_sentences", "change_case:capital_word_frequency", "count:count_unique",
    "count:counting_composition", "keywords:keyword_specific_position", "keywords:start_end",
}  # fmt: skip


def _grade_all(text: str, instruction_ids) -> float:
    """CPU seconds this thread spent grading `text` on `instruction_ids` (not wall-clock: load does not inflate it)."""
    graded = Text(text)
    started = time.thread_time()
    for instruction_id in instruction_ids:
        registry.build(instruction_id, KWARGS_BY_ID[instruction_id]).check(graded)
    return time.thread_time() - started


@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_every_checker_is_fast_on_an_adversarial_megabyte(text):
    # About a second on an idle machine; the reference's regexes would take hours on several of these.
    assert _grade_all(text, set(KWARGS_BY_ID) - NLTK_IDS) < 20


def test_nltk_checkers_are_fast_on_a_megabyte_long_sentence():
    assert _grade_all("[" * MEGABYTE, NLTK_IDS) < 60  # about 5 s on an idle machine
