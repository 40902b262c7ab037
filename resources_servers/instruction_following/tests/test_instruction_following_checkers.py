"""Every instruction id on a realistic response that follows it and one that does not (`<id>-pass` / `<id>-fail`)."""

from __future__ import annotations

import pytest

from resources_servers.instruction_following import grading
from resources_servers.instruction_following.registry import INSTRUCTIONS

PROSE = (
    "Mulching keeps the soil moist during hot weeks. It also feeds worms and slowly improves the structure of the "
    "bed. Spread it about five centimetres deep and keep it away from the stems."
)


def followed(instruction_id: str, kwargs: dict | None, text: str) -> bool:
    checkers = grading.build_checkers([instruction_id], [kwargs])
    return grading.follow_list(checkers, text)[0]


def case(instruction_id, kwargs, text, expected, *, note=""):
    suffix = ("pass" if expected else "fail") + (f"-{note}" if note else "")
    return pytest.param(instruction_id, kwargs, text, expected, id=f"{instruction_id}-{suffix}")


CASES = [
    # keywords
    case("keywords:existence", {"keywords": ["compost", "nitrogen"]},
         "Good compost balances carbon-rich browns with nitrogen-rich greens such as grass clippings.", True),
    case("keywords:existence", {"keywords": ["compost", "nitrogen"]},
         "Good compost balances dry leaves with fresh kitchen scraps.", False),
    case("keywords:frequency", {"keyword": "river", "frequency": 3, "relation": "at least"},
         "The river rose overnight. By morning the river had covered the path, and the river bank was gone.", True),
    case("keywords:frequency", {"keyword": "river", "frequency": 3, "relation": "at least"},
         "The river rose overnight and covered the path.", False),
    case("keywords:frequency", {"keyword": "very", "frequency": 2, "relation": "less than"},
         "The talk was very clear and well paced.", True, note="less-than"),
    case("keywords:forbidden_words", {"forbidden_words": ["cheap", "deal"]},
         "This laptop offers solid value for students on a budget.", True),
    case("keywords:forbidden_words", {"forbidden_words": ["cheap", "deal"]},
         "This laptop is a great Deal for students.", False),
    case("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
         "The zebra dozed in the hazy afternoon sun.", True),
    case("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"},
         "The horse slept in the afternoon sun.", False),
    case("keywords:word_once", {"keyword": "budget"},
         "Plan the trip around a clear budget and book trains early.", True),
    case("keywords:word_once", {"keyword": "budget"},
         "Set a budget first. Then check the budget every evening.", False),
    case("keywords:word_count_different_numbers", {"keyword": "tea", "frequency": 2, "relation": "at least"},
         "Green tea and black tea come from the same plant.", True),
    case("keywords:word_count_different_numbers", {"keyword": "tea", "frequency": 2, "relation": "at least"},
         "Green tea comes from the same plant as its darker cousin.", False),
    case("keywords:exclude_word_harder", {"keyword": "basically"},
         "Interest rates rise when central banks want to slow spending.", True),
    case("keywords:exclude_word_harder", {"keyword": "basically"},
         "Interest rates basically rise when central banks want to slow spending.", False),
    case("keywords:no_adjacent_consecutive", None, "Zebras graze quietly by wide wells.", True),
    case("keywords:no_adjacent_consecutive", None, "Some tall trees grow slowly.", False),
    case("keywords:palindrome", None, "We saw a racecar speed past the stadium.", True),
    case("keywords:palindrome", None, "Trains depart hourly from the central station.", False),
    case("keywords:keyword_specific_position", {"keyword": "bread", "n": 2, "m": 3},
         "Start with flour. Knead the bread dough for ten minutes.", True),
    case("keywords:keyword_specific_position", {"keyword": "bread", "n": 2, "m": 3},
         "Start with flour. Knead the dough for ten minutes to make bread.", False),
    case("keywords:start_end", None, "Patience wins races, and sometimes even arguments need patience", True),
    case("keywords:start_end", None, "Patience wins races, and sometimes even arguments need patience.", False),
    # language and case
    case("language:response_language", {"language": "fr"},
         "Le marché du samedi propose des fruits frais et du pain chaud.", True),
    case("language:response_language", {"language": "fr"},
         "The Saturday market sells fresh fruit and warm bread.", False),
    case("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
         "Check the CPU and the GPU temperatures before gaming.", True),
    case("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
         "Check the processor temperature before gaming.", False),
    case("change_case:english_capital", None, "ALWAYS BACK UP YOUR FILES BEFORE AN UPDATE.", True),
    case("change_case:english_capital", None, "ALWAYS back up your files before an update.", False),
    case("change_case:english_lowercase", None, "always back up your files before an update.", True),
    case("change_case:english_lowercase", None, "Always back up your files before an update.", False),
    # length
    case("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, PROSE, True),
    case("length_constraints:number_sentences", {"num_sentences": 5, "relation": "at least"}, PROSE, False),
    case("length_constraints:number_paragraphs", {"num_paragraphs": 2},
         "Bread needs time to rise.\n\n***\n\nBake it in a hot oven until golden.", True),
    case("length_constraints:number_paragraphs", {"num_paragraphs": 2},
         "Bread needs time to rise.\n\nBake it in a hot oven until golden.", False),
    case("length_constraints:number_words", {"num_words": 40, "relation": "less than"}, PROSE, True),
    case("length_constraints:number_words", {"num_words": 20, "relation": "less than"}, PROSE, False),
    case("length_constraints:nth_paragraph_first_word",
         {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "secondly"},
         "First, pick a sunny spot.\n\nSecondly, water deeply once a week.\n\nFinally, mulch the bed.", True),
    case("length_constraints:nth_paragraph_first_word",
         {"num_paragraphs": 3, "nth_paragraph": 2, "first_word": "secondly"},
         "First, pick a sunny spot.\n\nThen water deeply once a week.\n\nFinally, mulch the bed.", False),
    case("paragraphs:paragraphs", None, "Cats sleep most of the day.\n***\nDogs need daily walks.", True),
    case("paragraphs:paragraphs", None, "Cats sleep most of the day.\n\nDogs need daily walks.", False),
    case("paragraphs:paragraphs2", None, "Cats sleep most of the day.\n\nDogs need daily walks.", True),
    case("paragraphs:paragraphs2", None, "Cats sleep most of the day.\nDogs need daily walks.", False),
    # detectable content and format
    case("detectable_content:number_placeholders", {"num_placeholders": 2},
         "Dear [name], your parcel will arrive at [address] tomorrow.", True),
    case("detectable_content:number_placeholders", {"num_placeholders": 2},
         "Dear customer, your parcel will arrive at [address] tomorrow.", False),
    case("detectable_content:postscript", {"postscript_marker": "P.S."},
         "See you at the reunion!\n\nP.S. Bring the old photo albums.", True),
    case("detectable_content:postscript", {"postscript_marker": "P.S."},
         "See you at the reunion! Bring the old photo albums.", False),
    case("detectable_format:number_bullet_lists", {"num_bullets": 3},
         "Packing list:\n* passport\n* charger\n* rain jacket", True),
    case("detectable_format:number_bullet_lists", {"num_bullets": 3},
         "Packing list:\n* passport\n* charger", False),
    case("detectable_format:constrained_response", None, "The data supports it. My answer is yes.", True),
    case("detectable_format:constrained_response", None, "Yes, the data supports it.", False),
    case("detectable_format:number_highlighted_sections", {"num_highlights": 2},
         "Use *fresh* basil and **good** olive oil.", True),
    case("detectable_format:number_highlighted_sections", {"num_highlights": 2},
         "Use *fresh* basil and good olive oil.", False),
    case("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
         "Section 1\nGather the ingredients.\nSection 2\nMix and bake.", True),
    case("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
         "Part 1\nGather the ingredients.\nPart 2\nMix and bake.", False),
    case("detectable_format:json_format", None, '```json\n{"city": "Lyon", "population": 522250}\n```', True),
    case("detectable_format:json_format", None, 'Here is the data: {"city": "Lyon"}', False),
    case("detectable_format:title", None, "<<Autumn Walks>>\nThe leaves crunch underfoot.", True),
    case("detectable_format:title", None, "Autumn Walks\nThe leaves crunch underfoot.", False),
    case("detectable_format:sentence_hyphens", None, "The sun rose.-Birds sang.-We set off.", True),
    case("detectable_format:sentence_hyphens", None, "The sun rose. Birds sang. We set off.", False),
    case("detectable_format:square_brackets", None, "[Rivers] [carve] [valleys]", True),
    case("detectable_format:square_brackets", None, "[Rivers carve] valleys", False),
    case("detectable_format:bigram_wrapping", None, "<<Rivers carve>> <<deep valleys>>", True),
    case("detectable_format:bigram_wrapping", None, "<<Rivers carve deep>> <<valleys>>", False),
    # combination, start/end, words
    case("combination:two_responses", None, "Take the train.\n******\nRent a bike.", True),
    case("combination:two_responses", None, "Take the train.\n******\nTake the train.", False),
    case("combination:repeat_prompt", {"prompt_to_repeat": "Name a hardy houseplant."},
         "Name a hardy houseplant. The snake plant survives low light and neglect.", True),
    case("combination:repeat_prompt", {"prompt_to_repeat": "Name a hardy houseplant."},
         "The snake plant survives low light and neglect.", False),
    case("startend:end_checker", {"end_phrase": "Any other questions?"},
         "Preheat the oven to 200 C. Any other questions?", True),
    case("startend:end_checker", {"end_phrase": "Any other questions?"},
         "Preheat the oven to 200 C. Let me know if you have any other questions.", False),
    case("startend:quotation", None, '"Slow and steady wins the race."', True),
    case("startend:quotation", None, "Slow and steady wins the race.", False),
    case("first_word:first_word_sent", {"first_word": "today"}, "Today we rest. Today we plan.", True),
    case("first_word:first_word_sent", {"first_word": "today"}, "Today we rest. Tomorrow we plan.", False),
    case("first_word:first_word_answer", {"first_word": "honestly"}, "Honestly the film was too long.", True),
    case("first_word:first_word_answer", {"first_word": "honestly"}, "Honestly, the film was too long.", False),
    case("last_word:last_word_sent", {"last_word": "again"}, "We tried again. It failed again!", True),
    case("last_word:last_word_sent", {"last_word": "again"}, "We tried again. It failed.", False),
    case("last_word:last_word_answer", {"last_word": "tomorrow"}, "The shop opens at nine tomorrow.", True),
    case("last_word:last_word_answer", {"last_word": "tomorrow"}, "Tomorrow the shop opens at nine.", False),
    # copy
    case("copy:repeat_phrase", {"phrase": "Actions speak louder than words", "small_n": 2},
         "Actions speak softer than words, some say. Actions shout louder than words.", True),
    case("copy:repeat_phrase", {"phrase": "Actions speak louder than words", "small_n": 2},
         "Actions speak softer than words. Actions speak louder than words.", False),
    case("copy:copy", {"prompt_to_repeat": "Translate 'good morning' into Spanish."},
         "Translate 'good morning' into Spanish.", True),
    case("copy:copy", {"prompt_to_repeat": "Translate 'good morning' into Spanish."}, "Buenos días.", False),
    case("copy:copying_simple", {"prompt_to_repeat": "List three primary colours."},
         "list three primary colours.", True),
    case("copy:copying_simple", {"prompt_to_repeat": "List three primary colours."},
         "List three primary colours. Red, yellow and blue.", False),
    case("copy:copying_multiple", {"prompt_to_repeat": "Stay curious.", "N": 3},
         "Stay curious.\n******\nStay curious.\n******\nStay curious.", True),
    case("copy:copying_multiple", {"prompt_to_repeat": "Stay curious.", "N": 3},
         "Stay curious.\n******\nStay curious.", False),
    case("new:copy_span_idx", {"prompt_to_repeat": "Water boils at 100 degrees Celsius.", "n_start": 0, "n_end": 11},
         "Water boils", True),
    case("new:copy_span_idx", {"prompt_to_repeat": "Water boils at 100 degrees Celsius.", "n_start": 0, "n_end": 11},
         "Water boils at", False),
    # punctuation
    case("punctuation:no_comma", None, "Bring water and snacks and a map.", True),
    case("punctuation:no_comma", None, "Bring water, snacks and a map.", False),
    case("punctuation:punctuation_dot", None, "Bring water and snacks and a map", True),
    case("punctuation:punctuation_dot", None, "Bring water and snacks and a map.", False),
    case("punctuation:punctuation_exclamation", None, "What a view.", True),
    case("punctuation:punctuation_exclamation", None, "What a view!", False),
    # counts and letters
    case("count:lowercase_counting", {"N": 3}, "Rome Paris and Oslo are capitals", True),
    case("count:lowercase_counting", {"N": 3}, "Rome and Paris are two lovely capitals", False),
    case("letters:letter_counting", {"N": 20, "relation": "less than"}, "Yes, go.", True),
    case("letters:letter_counting", {"N": 20, "relation": "less than"},
         "Yes, go ahead and book the tickets now.", False),
    case("letters:letter_counting2", {"letter": "q", "let_frequency": 1, "let_relation": "at least"},
         "The queen quietly left.", True),
    case("letters:letter_counting2", {"letter": "q", "let_frequency": 1, "let_relation": "at least"},
         "The king slowly left.", False),
    case("count:counting_composition", {"n_sent": 2, "n_words": 4},
         "Birds sing loudly. Bees hum softly.\n***\nFrogs croak nightly. Owls hoot too.\n***\n"
         "Wind moves trees. Rain taps roofs.", True),
    case("count:counting_composition", {"n_sent": 2, "n_words": 4},
         "Birds sing loudly. Bees hum softly.\n***\nFrogs croak nightly.", False),
    case("count:count_unique", None, "Every morning I walk two dogs.", True),
    case("count:count_unique", None, "Every morning I walk my dog and my cat.", False),
    case("count:count_increment_word", {"keyword1": "salt", "keyword2": "pepper"},
         "Add salt first, then pepper, and a final pinch of pepper.", True),
    case("count:count_increment_word", {"keyword1": "salt", "keyword2": "pepper"},
         "Add salt and pepper to taste.", False),
]
# One valid kwargs object per id (from its first case), for tests that need every instruction at once.
KWARGS_BY_ID: dict[str, dict | None] = {}
for _param in CASES:
    KWARGS_BY_ID.setdefault(_param.values[0], _param.values[1])


@pytest.mark.parametrize(("instruction_id", "kwargs", "text", "expected"), CASES)
def test_checker(instruction_id, kwargs, text, expected):
    assert followed(instruction_id, kwargs, text) is expected


def test_every_registered_id_has_a_pass_and_a_fail_case():
    covered = {(param.values[0], param.values[3]) for param in CASES}
    missing = [(iid, outcome) for iid in INSTRUCTIONS for outcome in (True, False) if (iid, outcome) not in covered]
    assert not missing
    assert len(INSTRUCTIONS) == 54
