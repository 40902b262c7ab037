r"""genrm_compare's pure parts: comparison pairs, GenRM verdict parsing, and the group aggregation (spec §2.9).

Nothing here does I/O; `app.py` calls the judge and feeds the verdicts in. Every function is table-tested with
hand-computed values in `tests/test_scoring.py`.

Aggregation (`aggregate`), in order:

1. Tie-breaker (`simple_tiebreaker`): a comparison whose two scores are equal is split by its ranking,
   `adj = 3.5 - ranking`, `score_1 += adj`, `score_2 -= adj` (ranking 1 = response_1 much better, 6 = response_2).
2. Base score: the mean of a response's scores over every comparison it took part in, as response_1 or response_2
   (none: `default_score`).
3. Length bonuses (only when one of the four coefficients is > 0, and N >= 2). The threshold is the
   `max(0, int(N * top_percentile) - 1)`-th base score in descending order. The response with the shortest non-empty
   reasoning (the stripped, concatenated reasoning summaries; the first one on a tie) gets `reasoning_bonus` when its
   base score is >= the threshold; likewise the shortest non-empty answer gets `answer_bonus`. Then each response
   gets `w_reasoning * group_reasoning_length_penalty_coeff + w_answer * group_answer_length_penalty_coeff`, where
   `w = 1 - (L - min L) / (max L - min L)`, zero-centred by subtracting the group's mean (all 0 when every length is
   equal).
4. Style penalty (coefficient > 0, N >= 2): density = (markdown headers + list items + bold spans + emoji code
   points) / the stripped length, both counted with fenced code blocks removed; zero-centred weights as above (lower
   density, higher weight) times the coefficient.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import statistics
from collections.abc import Sequence
from typing import Any, Literal

from gymfleet.grading.judge import json_objects

RANKING_MIDPOINT = 3.5
SCORE_RANGE = (1.0, 5.0)
RANKING_RANGE = (1.0, 6.0)
EMPTY_ANSWER = "None"
"""What the GenRM is shown for an empty answer (NeMo-Gym's placeholder)."""
VERDICT_KEYS = ("score_1", "score_2", "ranking")
MAX_PARSED_CHARS = 100_000
"""Only this much of the end of a GenRM reply is searched for its JSON (the verdict closes the reply)."""

Strategy = Literal["circular", "all_pairs"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One GenRM comparison: helpfulness of each response (1-5) and their ranking (1-6)."""

    score_1: float
    score_2: float
    ranking: float


def comparison_pairs(strategy: Strategy, n: int) -> list[tuple[int, int]]:
    """The `(response_1, response_2)` index pairs a group of `n` responses is judged on.

    Examples:
        >>> comparison_pairs("circular", 3)
        [(0, 1), (1, 2), (2, 0)]
        >>> comparison_pairs("all_pairs", 3)
        [(0, 1), (0, 2), (1, 2)]
        >>> comparison_pairs("circular", 1)
        []
    """
    if strategy not in ("circular", "all_pairs"):
        raise ValueError(f"unknown comparison strategy {strategy!r}; use 'circular' or 'all_pairs'")
    if n < 2:
        return []
    if strategy == "all_pairs":
        return list(itertools.combinations(range(n), 2))
    return [(i, (i + 1) % n) for i in range(n)]


# ---------------------------------------------------------------------------------------------- verdicts

_FENCED_JSON = re.compile(r"```json\s*(.*?)\s*```", re.IGNORECASE | re.DOTALL)  # "```json {...} ```"; not "```py"


def parse_verdict(text: str | None, default_score: float = 3.0, default_ranking: float = 3.5) -> Verdict | None:
    r"""The verdict in a GenRM reply, or None when it holds none (the caller retries, then uses the defaults).

    The first object in a fenced ```json block that holds `score_1`, `score_2` or `ranking` (directly or under
    `overall`) wins; else the last such top-level `{...}` object in the text. A key it lacks takes its default.
    Values are numbers or numeric strings; an object with a boolean, non-finite or out-of-range value (scores outside
    1-5, a ranking outside 1-6) is not a verdict, and the search goes on.

    Examples:
        >>> parse_verdict('Both fine.\n```json\n{"score_1": 4, "score_2": 3, "ranking": 2}\n```')
        Verdict(score_1=4.0, score_2=3.0, ranking=2.0)
        >>> parse_verdict('{"score_1": 2} then {"overall": {"score_2": 5, "ranking": 6}}')
        Verdict(score_1=3.0, score_2=5.0, ranking=6.0)
        >>> parse_verdict("Response 1 is better.") is None
        True
    """
    if not text:
        return None
    text = text[-MAX_PARSED_CHARS:]
    decoder = json.JSONDecoder()
    for block in _FENCED_JSON.findall(text):
        for obj in json_objects(block, decoder):
            found = _verdict_of(obj, default_score, default_ranking)
            if found is not None:
                return found
    last = None
    for obj in json_objects(text, decoder):
        last = _verdict_of(obj, default_score, default_ranking) or last
    return last


def _verdict_of(obj: Any, default_score: float, default_ranking: float) -> Verdict | None:
    if isinstance(obj, dict) and isinstance(obj.get("overall"), dict):
        obj = obj["overall"]
    if not isinstance(obj, dict) or not any(key in obj for key in VERDICT_KEYS):
        return None
    values = []
    limits = ((default_score, SCORE_RANGE), (default_score, SCORE_RANGE), (default_ranking, RANKING_RANGE))
    for key, (default, (low, high)) in zip(VERDICT_KEYS, limits, strict=True):
        value = _number(obj.get(key, default))
        if value is None or not low <= value <= high:
            return None
        values.append(value)
    return Verdict(*values)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------------------------------------- response text


def response_parts(response: dict[str, Any]) -> tuple[str, str]:
    """`(reasoning, answer)` of a Responses object: concatenated reasoning summaries, and message `output_text`.

    Examples:
        >>> response_parts({"output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hm"}]},
        ...     {"type": "message", "content": [{"type": "output_text", "text": "Paris."}]}]})
        ('hm', 'Paris.')
    """
    reasoning, answer = [], []
    output = response.get("output") if isinstance(response, dict) else None
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "reasoning" and isinstance(item.get("summary"), list):
            reasoning += [part["text"] for part in item["summary"]
                          if isinstance(part, dict) and isinstance(part.get("text"), str)]
        elif item.get("type") == "message" and isinstance(item.get("content"), list):
            answer += [part["text"] for part in item["content"] if isinstance(part, dict)
                       and part.get("type") == "output_text" and isinstance(part.get("text"), str)]
    return "".join(reasoning), "".join(answer)


def shown_answer(answer: str) -> str:
    """The text the GenRM is shown for an answer: `"None"` when it is empty or blank."""
    return answer if answer.strip() else EMPTY_ANSWER


# ---------------------------------------------------------------------------------------------- aggregation


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """A group's rewards and how they were reached (all lists in response order)."""

    rewards: list[float]
    base_scores: list[float]
    """Mean tie-broken score over each response's comparisons, before bonuses."""
    length_adjustments: list[float]
    """Top-percentile bonuses plus the group length adjustment."""
    style_adjustments: list[float]
    metrics: dict[str, float]
    """`mean_individual_score`, `std_individual_score` (population) and `tiebreak_usage_rate`, over all
    comparisons (absent when there were none)."""


@dataclasses.dataclass(frozen=True)
class Shaping:
    """The aggregation's coefficients (the config fields of the same names)."""

    default_score: float = 3.0
    reasoning_bonus: float = 0.0
    answer_bonus: float = 0.0
    top_percentile: float = 0.2
    group_reasoning_length_penalty_coeff: float = 0.0
    group_answer_length_penalty_coeff: float = 0.0
    group_style_penalty_coeff: float = 0.0


def tiebreak(verdict: Verdict) -> tuple[float, float]:
    """The two scores a comparison gives, a tie split by the ranking.

    Examples:
        >>> tiebreak(Verdict(4, 4, 2))
        (5.5, 2.5)
        >>> tiebreak(Verdict(4, 3, 6))
        (4, 3)
    """
    if verdict.score_1 != verdict.score_2:
        return verdict.score_1, verdict.score_2
    adjustment = RANKING_MIDPOINT - verdict.ranking
    return verdict.score_1 + adjustment, verdict.score_2 - adjustment


def base_scores(
    n: int, comparisons: Sequence[tuple[tuple[int, int, int], Verdict]], default_score: float = 3.0
) -> tuple[list[float], dict[str, float]]:
    """Each response's mean tie-broken score over its comparisons (`default_score` without any), and the metrics.

    Args:
        n: Group size.
        comparisons: `((i, j, judge_index), verdict)`, response i shown as response_1; summed in the order given
            (the caller sorts by `(judge_index, i, j)`, so float sums do not depend on arrival order).
        default_score: A response without comparisons.
    """
    totals, counts = [0.0] * n, [0] * n
    individual: list[float] = []
    ties = 0
    for (i, j, _judge), verdict in comparisons:
        individual += [verdict.score_1, verdict.score_2]
        ties += verdict.score_1 == verdict.score_2
        first, second = tiebreak(verdict)
        totals[i] += first
        totals[j] += second
        counts[i] += 1
        counts[j] += 1
    scores = [total / count if count else default_score for total, count in zip(totals, counts, strict=True)]
    metrics: dict[str, float] = {}
    if comparisons:
        metrics = {"mean_individual_score": statistics.fmean(individual),
                   "std_individual_score": statistics.pstdev(individual),
                   "tiebreak_usage_rate": ties / len(comparisons)}
    return scores, metrics


def zero_centred_weights(values: Sequence[float]) -> list[float]:
    """`1 - (v - min) / (max - min)` minus its mean: the smallest value gets the most; all 0 when all are equal.

    Examples:
        >>> zero_centred_weights([10, 20, 30])
        [0.5, 0.0, -0.5]
        >>> zero_centred_weights([7, 7])
        [0.0, 0.0]
    """
    if not values:
        return []
    low, high = min(values), max(values)
    if low == high:
        return [0.0] * len(values)
    raw = [1.0 - (value - low) / (high - low) for value in values]
    mean = sum(raw) / len(raw)
    return [weight - mean for weight in raw]


def length_adjustments(
    scores: Sequence[float], reasoning_lengths: Sequence[int], answer_lengths: Sequence[int], shaping: Shaping
) -> list[float]:
    """What the length rules (module docstring, step 3) add to each base score."""
    n = len(scores)
    adjustments = [0.0] * n
    coefficients = (shaping.reasoning_bonus, shaping.answer_bonus, shaping.group_reasoning_length_penalty_coeff,
                    shaping.group_answer_length_penalty_coeff)
    if n < 2 or not any(c > 0 for c in coefficients):
        return adjustments
    threshold = sorted(scores, reverse=True)[max(0, int(n * shaping.top_percentile) - 1)]
    for lengths, bonus in ((reasoning_lengths, shaping.reasoning_bonus), (answer_lengths, shaping.answer_bonus)):
        candidates = [(length, index) for index, length in enumerate(lengths) if length > 0]
        if bonus > 0 and candidates:
            _, shortest = min(candidates)
            if scores[shortest] >= threshold:
                adjustments[shortest] += bonus
    if shaping.group_reasoning_length_penalty_coeff > 0 or shaping.group_answer_length_penalty_coeff > 0:
        for index, (w_reasoning, w_answer) in enumerate(
            zip(zero_centred_weights(reasoning_lengths), zero_centred_weights(answer_lengths), strict=True)
        ):
            adjustments[index] += (w_reasoning * shaping.group_reasoning_length_penalty_coeff
                                   + w_answer * shaping.group_answer_length_penalty_coeff)
    return adjustments


_CODE_BLOCK = re.compile(r"```.*?```", re.DOTALL)  # "```py\nx = 1\n```" is not style; an unclosed ``` stays text
_HEADER = re.compile(r"^#{1,6}\s", re.MULTILINE)  # "## Setup"; not "#hashtag"
_LIST_ITEM = re.compile(r"^\s*(?:\d+\.|[-*+])\s", re.MULTILINE)  # "1. Boil", "- salt"; not "-5 degrees"
_BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")  # "**Note**", "__Note__"; not "**" across lines
_EMOJI = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff\U00002702-\U000027b0"
    "\U000024c2-\U0001f251\U0001f900-\U0001f9ff\U0001fa00-\U0001fa6f\U0001fa70-\U0001faff\U00002600-\U000026ff"
    "\U00002700-\U000027bf]"
)  # one per code point: "🎉🎉" is 2; "€" is none


def style_density(text: str) -> float:
    """Markdown headers, list items, bold spans and emoji per character, fenced code removed (0.0 when empty).

    Examples:
        >>> style_density("## Plan\\n- rest")
        0.14285714285714285
        >>> style_density("```\\n# not a header\\n```")
        0.0
    """
    text = _CODE_BLOCK.sub("", text)
    length = len(text.strip())
    if length == 0:
        return 0.0
    elements = sum(len(pattern.findall(text)) for pattern in (_HEADER, _LIST_ITEM, _BOLD, _EMOJI))
    return elements / length


def style_adjustments(answers: Sequence[str], coefficient: float) -> list[float]:
    """What the style rule (module docstring, step 4) adds to each score."""
    if coefficient <= 0 or len(answers) < 2:
        return [0.0] * len(answers)
    return [weight * coefficient for weight in zero_centred_weights([style_density(text) for text in answers])]


def aggregate(
    comparisons: Sequence[tuple[tuple[int, int, int], Verdict]],
    reasonings: Sequence[str],
    answers: Sequence[str],
    shaping: Shaping,
) -> Aggregate:
    """A group's rewards from its comparisons and its responses' reasoning and answer texts (module docstring).

    Args:
        comparisons: `((i, j, judge_index), verdict)` in any order; summed sorted by `(judge_index, i, j)`.
        reasonings: Each response's concatenated reasoning summaries.
        answers: Each response's answer text (`output_text`).
        shaping: The coefficients.
    """
    n = len(answers)
    ordered = sorted(comparisons, key=lambda item: (item[0][2], item[0][0], item[0][1]))
    scores, metrics = base_scores(n, ordered, shaping.default_score)
    lengths = length_adjustments(scores, [len(text.strip()) for text in reasonings],
                                 [len(text.strip()) for text in answers], shaping)
    styles = style_adjustments(answers, shaping.group_style_penalty_coeff)
    rewards = [score + length + style for score, length, style in zip(scores, lengths, styles, strict=True)]
    return Aggregate(rewards, scores, lengths, styles, metrics)


def reward_floor(shaping: Shaping) -> float:
    """A value below any reward `aggregate` can give: the lowest tie-broken score (1 - 2.5), minus every coefficient.

    A zero-centred weight is above -1, so a group adjustment costs less than its coefficient, and bonuses only add.

    Examples:
        >>> reward_floor(Shaping(group_reasoning_length_penalty_coeff=0.3, group_answer_length_penalty_coeff=0.35,
        ...                      group_style_penalty_coeff=0.05))
        -2.2
    """
    lowest = SCORE_RANGE[0] - (RANKING_RANGE[1] - RANKING_MIDPOINT)
    penalties = (shaping.group_reasoning_length_penalty_coeff + shaping.group_answer_length_penalty_coeff
                 + shaping.group_style_penalty_coeff)
    return round(lowest - penalties, 12)
