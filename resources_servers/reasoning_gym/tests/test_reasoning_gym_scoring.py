"""reasoning_gym extraction and scoring, table-tested on realistic model outputs (no server)."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest

from resources_servers.reasoning_gym.scoring import extract_answer, first_plain_box, score

ROWS = {
    row["metadata"]["source_dataset"]: row
    for row in map(json.loads, (Path(__file__).parents[1] / "data/example.jsonl").read_text().splitlines())
}
KK, ARITH, COUNTDOWN = ROWS["knights_knaves"], ROWS["basic_arithmetic"], ROWS["countdown"]


def _nemo_extract(text: str) -> str:
    """NeMo-Gym's extraction as its behaviour spec states it, with the package's own tag extractor (imported here:
    reasoning_gym takes ~1 CPU s to import, and every xdist worker collects this file)."""
    from reasoning_gym.utils import extract_answer as package_extract_answer

    tagged = package_extract_answer(text, tag_name="answer")
    if tagged is not None:
        return tagged
    boxed = re.search(r"\\boxed\{([^}]+)\}", text)
    return boxed.group(1).strip() if boxed else text.strip()


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("Let me check both cases...\n<answer>-3123</answer>", "-3123", id="answer-tags"),
        pytest.param("<answer>12</answer> Wait, I made an error.\n<answer> 13 </answer>", "13", id="last-tag-wins"),
        pytest.param("<answer></answer> \\boxed{5}", "", id="empty-tag-does-not-fall-back"),
        pytest.param("So the result is \\boxed{-3123}.", "-3123", id="boxed-fallback"),
        pytest.param("\\boxed{1} or maybe \\boxed{2}", "1", id="first-box-wins"),
        pytest.param("\\boxed{\\frac{3}{4}}", "\\frac{3", id="nested-box-cut-at-first-brace"),
        pytest.param("\\boxed{} then \\boxed{7}", "7", id="empty-box-skipped"),
        pytest.param("<answer>unclosed \\boxed{4}", "4", id="unclosed-tag-falls-back-to-box"),
        pytest.param("  Harper is a villain.\n", "Harper is a villain.", id="whole-text-fallback"),
        pytest.param("<ANSWER>4</ANSWER>", "<ANSWER>4</ANSWER>", id="tags-are-case-sensitive"),
        pytest.param("", "", id="empty"),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected == _nemo_extract(text)


def test_extract_answer_matches_nemo_on_random_text():
    rng = random.Random(3)
    pieces = ["<answer>", "</answer>", "\\boxed{", "}", "{", " ", "x", "\n", "<answer", "\\boxed"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        assert extract_answer(text) == _nemo_extract(text), text


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("<answer>" * 200_000, id="unclosed-answer-tags"),
        pytest.param("\\boxed{" * 200_000, id="unclosed-boxes"),
        pytest.param("x" * 2_000_000 + "<answer>7</answer>", id="answer-after-2mb"),
    ],
)
def test_extract_answer_is_fast_on_huge_text(text):
    start = time.thread_time()
    extract_answer(text)
    assert time.thread_time() - start < 2


def _entry(row):
    return {"question": row["question"], "answer": row["answer"], "metadata": row["metadata"]}


@pytest.mark.parametrize(
    "row, answer, expected",
    [
        pytest.param(KK, "Harper is a villain, and Victoria is a hero.", 1.0, id="kk-correct"),
        pytest.param(KK, "Harper is a villain and Victoria is a hero", 1.0, id="kk-correct-loose-punctuation"),
        pytest.param(KK, "Victoria is a villain, and Harper is a hero.", 0.0, id="kk-swapped"),
        pytest.param(KK, KK["question"], 0.0, id="kk-prompt-echo"),
        pytest.param(ARITH, "-3123", 1.0, id="arith-correct"),
        pytest.param(ARITH, "-3,123", 0.0, id="arith-thousands-separator"),
        pytest.param(ARITH, "-3123.0", pytest.approx(5 / 7), id="arith-partial-credit-decimal"),
        pytest.param(COUNTDOWN, COUNTDOWN["answer"], 1.0, id="countdown-correct"),
        pytest.param(COUNTDOWN, "11 - 25 + 5 + 78", 0.05, id="countdown-wrong-value-partial"),
        pytest.param(COUNTDOWN, "I could not find one.", 0.01, id="countdown-prose-format-credit"),
    ],
)
def test_score(row, answer, expected):
    assert score(row["metadata"]["source_dataset"], answer, _entry(row)) == expected


def test_scorer_that_raises_scores_zero():
    assert score("knights_knaves", "Harper is a villain", {"question": "", "answer": None, "metadata": {}}) == 0.0


def test_first_plain_box_is_linear_on_empty_boxes():
    start = time.thread_time()
    assert first_plain_box("\\boxed{}" * 300_000) is None
    assert time.thread_time() - start < 2


def test_task_names_come_from_the_cache_and_importing_reasoning_gym_corrects_it(tmp_path, monkeypatch):
    from reasoning_gym.factory import DATASETS

    from resources_servers.reasoning_gym import scoring

    monkeypatch.setenv("GYMFLEET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(scoring, "_known_tasks", None)
    assert scoring.tasks() == frozenset(DATASETS)  # no cache yet: from reasoning-gym itself, then cached
    cached = scoring._cache_path()
    assert json.loads(cached.read_text()) == sorted(DATASETS)
    cached.write_text('["knights_knaves"]')  # out of date (an editable install grew tasks, same version)
    monkeypatch.setattr(scoring, "_known_tasks", None)
    assert scoring.tasks() == {"knights_knaves"}  # a fresh process reads the cache
    assert scoring.load() == frozenset(DATASETS) == scoring.tasks()  # the server's warm-up corrects it
    assert json.loads(cached.read_text()) == sorted(DATASETS)
