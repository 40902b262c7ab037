"""The instruction registry: the 54 instruction ids NeMo-Gym's `instruction_following` grades, and their checkers.

Ids 1-25 (in the reference's order) are Google's IFEval instructions; the rest come from AllenAI's IFEvalG set.
Several ids share a checker (`keywords:word_count_different_numbers` is `keywords:frequency`, `copy:copying_simple`
is `copy:copy`, `letters:letter_counting2` is `keywords:letter_frequency`).
"""

from __future__ import annotations

from typing import Any

from gymfleet.errors import did_you_mean
from resources_servers.instruction_following.checkers import (
    change_case,
    combination,
    copy,
    count,
    detectable_content,
    detectable_format,
    first_word,
    keywords,
    language,
    last_word,
    length_constraints,
    letters,
    new,
    paragraphs,
    punctuation,
    startend,
)
from resources_servers.instruction_following.checkers.base import Checker, Kwargs, RowError

INSTRUCTIONS: dict[str, type[Checker]] = {
    "keywords:existence": keywords.Existence,
    "keywords:frequency": keywords.Frequency,
    "keywords:forbidden_words": keywords.ForbiddenWords,
    "keywords:letter_frequency": keywords.LetterFrequency,
    "language:response_language": language.ResponseLanguage,
    "length_constraints:number_sentences": length_constraints.NumberSentences,
    "length_constraints:number_paragraphs": length_constraints.NumberParagraphs,
    "length_constraints:number_words": length_constraints.NumberWords,
    "length_constraints:nth_paragraph_first_word": length_constraints.NthParagraphFirstWord,
    "detectable_content:number_placeholders": detectable_content.NumberPlaceholders,
    "detectable_content:postscript": detectable_content.Postscript,
    "detectable_format:number_bullet_lists": detectable_format.NumberBulletLists,
    "detectable_format:constrained_response": detectable_format.ConstrainedResponse,
    "detectable_format:number_highlighted_sections": detectable_format.NumberHighlightedSections,
    "detectable_format:multiple_sections": detectable_format.MultipleSections,
    "detectable_format:json_format": detectable_format.JsonFormat,
    "detectable_format:title": detectable_format.Title,
    "combination:two_responses": combination.TwoResponses,
    "combination:repeat_prompt": combination.RepeatPrompt,
    "startend:end_checker": startend.EndChecker,
    "change_case:capital_word_frequency": change_case.CapitalWordFrequency,
    "change_case:english_capital": change_case.EnglishCapital,
    "change_case:english_lowercase": change_case.EnglishLowercase,
    "punctuation:no_comma": punctuation.NoComma,
    "startend:quotation": startend.Quotation,
    "copy:repeat_phrase": copy.RepeatPhrase,
    "copy:copy": copy.Copy,
    "new:copy_span_idx": new.CopySpanIdx,
    "detectable_format:sentence_hyphens": detectable_format.SentenceHyphens,
    "keywords:no_adjacent_consecutive": keywords.NoAdjacentConsecutive,
    "detectable_format:square_brackets": detectable_format.SquareBrackets,
    "keywords:word_once": keywords.WordOnce,
    "keywords:word_count_different_numbers": keywords.Frequency,
    "keywords:exclude_word_harder": keywords.ExcludeWordHarder,
    "paragraphs:paragraphs": paragraphs.TwoDividedParagraphs,
    "paragraphs:paragraphs2": paragraphs.TwoBlankLineParagraphs,
    "first_word:first_word_sent": first_word.FirstWordSent,
    "first_word:first_word_answer": first_word.FirstWordAnswer,
    "last_word:last_word_sent": last_word.LastWordSent,
    "last_word:last_word_answer": last_word.LastWordAnswer,
    "detectable_format:bigram_wrapping": detectable_format.BigramWrapping,
    "copy:copying_simple": copy.Copy,
    "copy:copying_multiple": copy.CopyingMultiple,
    "punctuation:punctuation_dot": punctuation.NoDot,
    "punctuation:punctuation_exclamation": punctuation.NoExclamation,
    "count:lowercase_counting": count.LowercaseCounting,
    "letters:letter_counting": letters.LetterCounting,
    "letters:letter_counting2": keywords.LetterFrequency,
    "count:counting_composition": count.CountingComposition,
    "count:count_unique": count.CountUnique,
    "count:count_increment_word": count.CountIncrementWord,
    "keywords:palindrome": keywords.Palindrome,
    "keywords:keyword_specific_position": keywords.KeywordSpecificPosition,
    "keywords:start_end": keywords.StartEnd,
}


def build(instruction_id: str, kwargs: dict[str, Any] | None) -> Checker:
    """Configure the checker for one instruction.

    Args:
        instruction_id: A registry id such as `keywords:existence`.
        kwargs: The row's kwargs for it; null (and null values) count as absent.

    Returns:
        The configured checker.

    Raises:
        RowError: If the id is unknown, or a kwarg is missing where the reference would draw it at random.
        NotFollowed: If the reference rejects these kwargs whatever the response.
    """
    checker = INSTRUCTIONS.get(instruction_id)
    if checker is None:
        raise RowError(
            f"unknown instruction id {instruction_id!r}.{did_you_mean(instruction_id, INSTRUCTIONS)} "
            f"The {len(INSTRUCTIONS)} known ids are listed in resources_servers/instruction_following/registry.py"
        )
    return checker(Kwargs(instruction_id, kwargs or {}, checker.kwargs))
