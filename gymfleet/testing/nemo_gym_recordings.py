"""What NeMo-Gym recorded with a folder's rollouts, read back for replay (`gymfleet.testing.nemo_gym_corpus`).

A folder's `data/example_rollouts*.jsonl` holds one row per rollout: the task row the agent was given, what the
agent and `/verify` (or the episode) added (`response`, `reward`, ...) and `_ng_task_index`/`_ng_rollout_index`.
What a replay needs back from them:

- **the task row**: NeMo-Gym writes the inputs it fed the agent beside the rollouts
  (`<rollouts>_materialized_inputs.jsonl`, keyed by `_ng_task_index`/`_ng_rollout_index`), which keep per-row
  fields a prompt does not tell apart (grl_sokoban's five tasks share one prompt and differ by `seed`); else the
  task row of `data/*.jsonl` with the row's prompt, or with all of it but the observation gymnasium_agent
  appended (`task_for`);
- **the model's turns** of an episode (`recorded_turns`): gymnasium_agent's output cut where the environment
  answered, or, where a folder's own generator kept only the last turn's `response` and every step's action in a
  `trajectory` (openair_congestion), those actions;
- **what the environment answered** (`recorded_start`, `recorded_observations`): the observation gymnasium_agent
  appended after the task's prompt, and after each turn, to tell an episode that cannot be replayed (an environment
  that deals at random) from one that disagrees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TASK_FILE_LIMIT = 50_000_000
"""Task files larger than this are not read to complete rollout rows (a bench run reads every folder's data)."""

EPISODE_OUTPUT_KEYS = frozenset({"reward", "response", "info", "terminated", "truncated", "failure_kind",
                                 "failure_reason", "mask_sample"})
"""What NeMo-Gym's gymnasium_agent adds to a task row (left out of the replayed `/reset` when the task is not in
`data/`)."""

MATERIALIZED = "_materialized_inputs.jsonl"


def _jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a Git LFS pointer or an empty line
        if isinstance(row, dict):
            rows.append(row)
    return rows


def recorded_rows(folder: Path) -> list[dict]:
    """The recorded rollouts (`data/example_rollouts*.jsonl`) that carry a reward and a response."""
    return [row for path in sorted((folder / "data").glob("example_rollouts*.jsonl")) for row in _jsonl(path)
            if isinstance(row.get("reward"), (int, float)) and row.get("response")]


def _messages(row: dict) -> Any:
    """A row's prompt as (role, content) pairs: recorded rollouts spell the same messages with more fields."""
    messages = (row.get("responses_create_params") or {}).get("input")
    if isinstance(messages, list):
        messages = [(m.get("role"), m.get("content")) if isinstance(m, dict) else m for m in messages]
    return messages


def _prompt_key(row: dict) -> str:
    return json.dumps(_messages(row), sort_keys=True)  # lists of pairs: what json.dumps of a prefix gives too


def task_rows(folder: Path) -> dict[str, list[dict]]:
    """The folder's task rows (`data/*.jsonl` but the rollouts) by their prompt (several tasks may share one): a
    recorded rollout keeps only some task fields (mcqa's rows lack `options`), so its `/verify` body is the task row
    with the rollout over it."""
    found: dict[str, list[dict]] = {}
    for path in sorted((folder / "data").glob("*.jsonl")):
        if "rollouts" in path.name or path.stat().st_size > TASK_FILE_LIMIT:
            continue
        for row in _jsonl(path):
            found.setdefault(_prompt_key(row), []).append(row)
    return found


def materialized_inputs(folder: Path) -> dict[tuple[Any, Any], list[dict]]:
    """The inputs NeMo-Gym fed its agent for the recorded rollouts, by (`_ng_task_index`, `_ng_rollout_index`)
    (several rollout files may share indices: `task_for` tells them apart by prompt)."""
    found: dict[tuple[Any, Any], list[dict]] = {}
    for path in sorted((folder / "data").glob(f"example_rollouts*{MATERIALIZED}")):
        if path.stat().st_size <= TASK_FILE_LIMIT:
            for row in _jsonl(path):
                found.setdefault((row.get("_ng_task_index"), row.get("_ng_rollout_index")), []).append(row)
    return found


def _extends(row: dict, task: dict) -> bool:
    """Whether `row`'s prompt is `task`'s, or `task`'s followed by what the agent appended (the first observation)."""
    mine, theirs = _messages(row), _messages(task)
    if isinstance(mine, list) and isinstance(theirs, list):
        return mine[:len(theirs)] == theirs
    return mine == theirs


def task_for(row: dict, tasks: dict[str, list[dict]], inputs: dict[tuple[Any, Any], list[dict]]) -> dict:
    """The task row `row` was recorded from (see the module docstring); `{}` when neither has it. Of tasks that share
    the row's prompt, the one whose own fields the row repeats most (conversational_tool_use_simulation's tasks share
    their system prompt and differ by `id`); a tie takes the first for the row's whole prompt, and nothing for the
    prompt less its last message (that match is too loose to guess)."""
    for task in inputs.get((row.get("_ng_task_index"), row.get("_ng_rollout_index")), []):
        if _extends(row, task):
            return task
    messages = _messages(row)
    prompts = [messages, messages[:-1]] if isinstance(messages, list) and messages else [messages]
    for exact, prompt in zip((True, False), prompts, strict=False):  # else all but the appended first observation
        task = _likeliest(row, tasks.get(json.dumps(prompt, sort_keys=True), []), tie_takes_first=exact)
        if task is not None:
            return task
    return {}


def _likeliest(row: dict, candidates: list[dict], tie_takes_first: bool) -> dict | None:
    if len(candidates) <= 1 or all(task == candidates[0] for task in candidates):
        return candidates[0] if candidates else None
    scores = [sum(key in row and row[key] == value for key, value in task.items() if key != "responses_create_params")
              for task in candidates]
    best = max(scores)
    return candidates[scores.index(best)] if tie_takes_first or scores.count(best) == 1 else None


def replay_request(row: dict, task: dict, computed: frozenset[str] = frozenset()) -> dict:
    """The `/verify` body NeMo-Gym's agent sent for a recorded rollout `row`: its task row, the recorded `response`
    and the row's `_ng_*` keys. A recorded row is the verify *answer* (the task echoed plus what verify computed:
    `extracted_answer`, ...), so sending it whole would hand verify its own outputs as inputs (a folder that builds
    `Answer(**body.model_dump(), extracted_answer=...)` then fails with "multiple values"). Without its task row
    (not in `data/`), the row less `reward` and less the keys verify computed (`computed`: what it added to the
    folder's other rows, `verify_outputs`) is the best there is."""
    if not task:
        return {key: value for key, value in row.items() if key != "reward" and key not in computed}
    keys = {key: value for key, value in row.items() if key.startswith("_ng_")}
    return {**task, "response": row["response"], **keys}


def verify_outputs(rows: list[dict], tasks: list[dict]) -> frozenset[str]:
    """The keys a folder's `/verify` adds to its task rows (`tasks[i]` is `rows[i]`'s, `{}` where it has none), seen
    in its rows whose task is known (iheval's `row_id`, `generation`, its scorers' flags): what a row replayed
    without its task must not send back as input."""
    added: set[str] = set()
    for row, task in zip(rows, tasks, strict=True):
        if task:
            added |= {key for key in row if key not in task and key != "response" and not key.startswith("_ng_")}
    return frozenset(added)


def episode_body(row: dict, task: dict) -> dict:
    """The `/reset` (and `/step`) body of a recorded episode: its task row, with the values the row recorded for the
    task's own fields (openair_congestion's rows were recorded with `max_steps: 2` over its task's 16; the prompt
    stays the task's: gymnasium_agent appends the first observation to the recorded one). Without its task row,
    the row less what the episode added."""
    if not task:
        return {key: value for key, value in row.items() if key not in EPISODE_OUTPUT_KEYS}
    return {**task, **{key: row[key] for key in task if key in row and key != "responses_create_params"
                       and key not in EPISODE_OUTPUT_KEYS}}


def is_gymnasium(folder: Path) -> bool:
    """Whether the folder's server speaks NeMo-Gym's Gymnasium protocol (`/reset`, `/step`) instead of `/verify`."""
    return "GymnasiumServer" in (folder / "app.py").read_text(errors="replace")


def model_turns(output: list) -> list[list]:
    """A recorded episode's output cut into the model's turns: each turn ends where the environment's answer
    (a `function_call_output` or a user message, appended by gymnasium_agent after `/step`) begins."""
    turns: list[list] = [[]]
    for item in output:
        if isinstance(item, dict) and (item.get("type") == "function_call_output" or item.get("role") == "user"):
            if turns[-1]:
                turns.append([])
        else:
            turns[-1].append(item)
    return [turn for turn in turns if turn]


def recorded_turns(row: dict) -> list[list]:
    """The model's turns of a recorded episode: `model_turns` of its output, or, where the row keeps more steps in a
    `trajectory` of `{action: {name, arguments}}` than its output shows, one tool call per recorded action."""
    turns = model_turns(row["response"].get("output") or [])
    trajectory = row.get("trajectory")
    if not isinstance(trajectory, list) or len(trajectory) <= len(turns):
        return turns
    actions = [step.get("action") if isinstance(step, dict) else None for step in trajectory]
    if not all(isinstance(action, dict) and isinstance(action.get("name"), str) for action in actions):
        return turns
    return [[{"type": "function_call", "id": f"fc_{index}", "call_id": f"call_{index}", "status": "completed",
              "name": action["name"], "arguments": json.dumps(action.get("arguments") or {})}]
            for index, action in enumerate(actions)]


def recorded_observations(row: dict) -> list[str | None]:
    """What the environment answered each model turn of `model_turns` with, as gymnasium_agent recorded it (the user
    message it appended after `/step`; None where the turn's answer holds none, as after the last turn)."""
    answers: list[str | None] = []
    in_turn = False
    for item in row["response"].get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") != "function_call_output" and item.get("role") != "user":
            if not in_turn:
                answers.append(None)
            in_turn = True
            continue
        in_turn = False
        if item.get("role") == "user" and answers and answers[-1] is None:
            answers[-1] = _text(item.get("content"))
    return answers


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return content if isinstance(content, str) else ""


def recorded_start(row: dict, task: dict) -> str | None:
    """The first observation of a recorded episode: the message gymnasium_agent appended to the task's prompt after
    `/reset` (None when the row does not show one)."""
    mine, theirs = _messages(row), _messages(task) if task else None
    if not (isinstance(mine, list) and isinstance(theirs, list)) or len(mine) <= len(theirs) \
            or mine[:len(theirs)] != theirs:
        return None
    added = mine[len(theirs)]
    return _text(added[1]) if isinstance(added, tuple) else None


_AGENTIF = ("by an earlier agentif whose reward was the row's constraint success rate: each recorded reward is "
            "round(n_true / (n_true + n_false), 4) of the row's own counts (9/12 = 0.75), while 0.7.0's verify "
            "rewards the instruction success rate, float(isr_pass), 0 for four of the five (and needs a judge "
            "model, whose calls were not recorded)")
OTHER_RECORDING: dict[tuple[str, int], str] = {
    **{("agentif", index): _AGENTIF for index in range(5)},
    **{("lc_niah", index): "with `overlap_metric_rule: lcs` where the shipped config says `ngram16`: its own "
                           "verify, called in process, gives the recorded rewards with `lcs` and gymfleet's with "
                           "the shipped config" for index in range(5)},
    ("math_with_code", 4): "by an earlier `_extract_boxed_answer` that cut a boxed answer at its first `}` (the "
                           "rows' recorded `extracted_answer`: `\\sqrt{2`, `\\dfrac{83`): 0.7.0's matches braces "
                           "and scores `\\boxed{\\sqrt{2}}` against the expected `\\(\\sqrt{2}\\)` 1.0",
    ("mcqa", 2): "before 0.7.0's boxed-letter parsing: `\\boxed{C: <option text>}` was extracted_answer None "
                 "(reward 0); 0.7.0's mcqa/app.py extracts C (reward 1)",
    ("terminus_judge", 4): "with `check_twice_swap: true` where the shipped config says `false`: its two judge calls "
                           "are the first pass ([[A=B]]) and the swap pass, GOLD and CANDIDATE exchanged ([[A!=B]]), "
                           "so `reward_if_swap_fails` 0.0; the shipped config stops at the first pass's [[A=B]]: 1.0",
}
"""Recorded rows, by (folder, index in `recorded_rows`), that another version or config of the folder recorded:
0.7.0's own code scores them as gymfleet serves them (each reason's evidence is checked in
`tests/test_nemo_gym_recordings.py` or `tests/test_nemo_gym_folders.py`). The corpus bench counts such a row apart
(`OTHER_VERSION`) only when it disagrees."""

_HUGE_POWER = ("math-verify needs about 12 CPU seconds to prove this pair equal (powers of 2016 and more), past "
               "the folder's own library_verifier_timeout_seconds on a loaded 2-core machine: then 0 by the folder's "
               "rule, else the recorded 1")
MACHINE_BOUND: dict[tuple[str, int], str] = {
    ("math_with_judge", 1): _HUGE_POWER,  # example_rollouts.jsonl's row 1
    ("math_with_judge", 5): _HUGE_POWER,  # example_rollouts_terminus_2.jsonl's row 0
}
"""Recorded rows, by (folder, index in `recorded_rows`), whose reward depends on the machine's speed: the folder
scores them 0 when its own time bound runs out. The corpus bench counts such a row apart (`SLOW_MACHINE`) only when
it scores 0 (`tests/test_nemo_gym_folders.py` checks the served reward is the recorded one or 0)."""
