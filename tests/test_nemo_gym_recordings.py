"""Reading NeMo-Gym's recorded rollouts back for replay (`gymfleet.testing.nemo_gym_recordings`) and how the corpus
bench counts a row that cannot be replayed here: each row's own task (tasks that share a prompt told apart by the
inputs NeMo-Gym materialized), an episode's turns and start, a judge the folder called with no answer recorded, and
the rows another version of a folder recorded, each with its evidence checked against the wheel's own files."""

from __future__ import annotations

import ast
import json
import random
import re

from fastapi import FastAPI, Request

from gymfleet.testing import serve
from gymfleet.testing.judge_replay import JudgeReplay
from gymfleet.testing.nemo_gym_corpus import DIVERGED, JUDGE_MISSING, FolderResult, _replay
from gymfleet.testing.nemo_gym_recordings import (
    MACHINE_BOUND,
    OTHER_RECORDING,
    episode_body,
    materialized_inputs,
    recorded_rows,
    recorded_start,
    recorded_turns,
    task_for,
    task_rows,
)
from gymfleet.testing.nemo_gym_wheel import nemo_gym_folder

PROMPT = [{"role": "system", "content": "play"}, {"role": "user", "content": "start"}]


def _write(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _observation(seed: int) -> str:
    return f"board of seed {seed}"


def test_each_recorded_row_gets_its_own_task_even_where_tasks_share_a_prompt(tmp_path):
    """grl_sokoban's five tasks share one prompt and differ by seed; gymnasium_agent appends the first observation to
    the recorded prompt. Over generated folders (tasks sharing prompts, rollouts shuffled, several rollouts a task),
    each row's task is the one NeMo-Gym materialized for its (task, rollout) index."""
    for trial in range(20):
        rng = random.Random(trial)
        seeds = rng.sample(range(10_000), rng.randint(2, 6))
        tasks = [{"seed": seed, "responses_create_params": {"input": PROMPT}} for seed in seeds]
        rollouts, inputs = [], []
        for task_index, task in enumerate(tasks):
            for rollout_index in range(rng.randint(1, 3)):
                keys = {"_ng_task_index": task_index, "_ng_rollout_index": rollout_index}
                inputs.append({**task, **keys})
                prompt = [*PROMPT, {"role": "user", "content": _observation(task["seed"]), "type": "message"}]
                rollouts.append({"responses_create_params": {"input": prompt}, "response": {"output": []},
                                 "reward": 1.0, **keys})
        rng.shuffle(rollouts)
        folder = tmp_path / str(trial)
        _write(folder / "data" / "example.jsonl", tasks)
        _write(folder / "data" / "example_rollouts.jsonl", rollouts)
        _write(folder / "data" / "example_rollouts_materialized_inputs.jsonl", inputs)
        by_prompt, materialized = task_rows(folder), materialized_inputs(folder)
        for row in recorded_rows(folder):
            task = task_for(row, by_prompt, materialized)
            assert _observation(task["seed"]) == recorded_start(row, task), (trial, row)
            assert task["_ng_task_index"] == row["_ng_task_index"]


def test_without_materialized_inputs_a_row_gets_the_task_with_its_prompt(tmp_path):
    folder = tmp_path / "f"
    _write(folder / "data" / "example.jsonl", [{"x": 1, "responses_create_params": {"input": "q1"}},
                                               {"x": 2, "responses_create_params": {"input": "q2"}}])
    row = {"responses_create_params": {"input": "q2", "model": "m"}, "response": {}, "_ng_task_index": 0}
    assert task_for(row, task_rows(folder), materialized_inputs(folder))["x"] == 2
    assert task_for({**row, "responses_create_params": {"input": "q3"}}, task_rows(folder), {}) == {}


def test_of_tasks_sharing_a_prompt_a_row_gets_the_one_whose_fields_it_repeats_never_a_loose_guess(tmp_path):
    """conversational_tool_use_simulation's tasks share their system prompt and differ by `id`; its recorded rows
    add the simulated user's first message to the prompt."""
    system = [{"role": "system", "content": "you are an agent"}]
    tasks = [{"id": f"t{n}", "responses_create_params": {"input": system}} for n in range(4)]
    folder = tmp_path / "f"
    _write(folder / "data" / "example.jsonl", tasks)
    by_prompt = task_rows(folder)
    for n in range(4):
        row = {"id": f"t{n}", "responses_create_params": {"input": [*system, {"role": "user", "content": "hi"}]}}
        assert task_for(row, by_prompt, {})["id"] == f"t{n}"
        assert task_for({**row, "responses_create_params": {"input": system}}, by_prompt, {})["id"] == f"t{n}"
    anonymous = {"responses_create_params": {"input": [*system, {"role": "user", "content": "hi"}]}}
    assert task_for(anonymous, by_prompt, {}) == {}, "the prompt less a message, shared by four: no guess"
    assert task_for({"responses_create_params": {"input": system}}, by_prompt, {})["id"] == "t0", "as before"


def test_an_episode_replays_the_rows_own_task_fields_and_its_recorded_trajectory():
    """openair_congestion's generator recorded `max_steps: 2` over its task's 16 and kept only the last turn in
    `response`, every step's action in `trajectory`."""
    task = {"max_steps": 16, "seed": 1, "responses_create_params": {"input": PROMPT}}
    last = {"type": "function_call", "name": "noop", "arguments": "{}"}
    row = {**task, "max_steps": 2, "reward": -0.8, "info": {}, "responses_create_params": {"input": [*PROMPT, "x"]},
           "response": {"output": [last]}, "trajectory": [{"action": {"name": "boost", "arguments": {"db": 3}}},
                                                          {"action": {"name": "noop", "arguments": {}}}]}
    body = episode_body(row, task)
    assert body == {**task, "max_steps": 2}, "the task's prompt, the row's values for the task's fields"
    turns = recorded_turns(row)
    assert [(turn[0]["name"], json.loads(turn[0]["arguments"])) for turn in turns] == [("boost", {"db": 3}),
                                                                                        ("noop", {})]
    assert recorded_turns({**row, "trajectory": [{"action": {"name": "noop"}}]}) == [[last]], "output has as many"
    said = {"role": "assistant", "content": "a"}
    heard = {"role": "user", "content": "obs"}
    assert recorded_turns({"response": {"output": [said, heard, said]}}) == [[said], [said]]


def _episode_app(mode: str) -> FastAPI:
    """An environment that deals from its seed (`seeded`), deals at random (`deals`), or deals from its seed and
    then draws at random (`drifts`, as grl_tetris does from state its seeded reset does not reset)."""
    app = FastAPI()
    drawn = iter(range(1000, 2000))
    steps = iter(range(1000))

    @app.post("/reset")
    async def reset(request: Request) -> dict:
        body = await request.json()
        return {"observation": _observation(next(drawn) if mode == "deals" else body["seed"]), "info": {}}

    @app.post("/step")
    async def step(request: Request) -> dict:
        body = await request.json()
        last = next(steps) % 2 == 1
        seen = f"after {next(drawn) if mode == 'drifts' else body['seed']}"
        return {"observation": None if last else seen, "reward": 0.5, "terminated": last, "truncated": False,
                "info": {}}

    return app


def test_an_episode_that_goes_otherwise_than_recorded_is_counted_apart_never_as_agreeing(tmp_path):
    """blackjack deals at random (no seed), grl_tetris draws later pieces from state its seeded reset keeps:
    whatever reward a replay gets, it is another game."""
    folder = tmp_path / "env"
    (folder / "data").mkdir(parents=True)
    (folder / "app.py").write_text("class Env(GymnasiumServer): ...\n")
    task = {"seed": 7, "responses_create_params": {"input": PROMPT}}
    prompt = [*PROMPT, {"role": "user", "content": _observation(7)}]
    _write(folder / "data" / "example.jsonl", [task])
    moves = [{"role": "assistant", "content": "hit"}, {"role": "user", "content": "after 7"},
             {"role": "assistant", "content": "stand"}]
    _write(folder / "data" / "example_rollouts.jsonl", [
        {**task, "responses_create_params": {"input": prompt}, "reward": 1.0, "response": {"output": moves}}])
    for mode, agree, blocked in [("seeded", 1, {}), ("deals", 0, {DIVERGED: 1}), ("drifts", 0, {DIVERGED: 1})]:
        result = FolderResult("env")
        with serve(_episode_app(mode)) as url:
            _replay(folder, url, result)
        assert (result.agree, result.rows, result.blocked) == (agree, 1, blocked), (mode, result.why)


def test_a_row_whose_verify_called_a_judge_nobody_recorded_is_counted_as_lacking_a_judge(tmp_path):
    """agentif and longmemeval score a failed judge call 0 themselves (no `judge_failed`): the stand-in judge counts
    the calls it could not answer, so such a row is told apart from one that disagrees without calling it."""
    import httpx

    app = FastAPI()
    judge_url = {}

    @app.post("/verify")
    async def verify(request: Request) -> dict:
        body = await request.json()
        if body["question"] == "judged":
            async with httpx.AsyncClient() as client:
                await client.post(f"{judge_url['url']}/responses", json={"input": "is it right?"})
        return {"reward": 0.0}

    rows = [{"responses_create_params": {"input": q}, "question": q, "response": {"output": []}, "reward": 1.0}
            for q in ("judged", "plain")]
    folder = tmp_path / "f"
    _write(folder / "data" / "example_rollouts.jsonl", rows)
    _write(folder / "data" / "example.jsonl", [{k: v for k, v in row.items() if k != "reward"} for row in rows])
    (folder / "app.py").write_text("")
    result = FolderResult("f")
    with JudgeReplay(rows) as judge, serve(app) as url:
        judge_url["url"] = judge.url
        _replay(folder, url, result, judge=judge)
    assert (result.agree, result.rows, result.blocked) == (0, 2, {JUDGE_MISSING: 1}), "plain disagrees: counted"
    assert judge.misses == 1


def _recorded(name: str) -> list[dict]:
    return recorded_rows(nemo_gym_folder(name))


def _judge_sections(call: dict) -> list[str]:
    """The two answers a terminus_judge prompt compares: the texts after its last `GOLD:` and `CANDIDATE:` labels
    (its examples use the same labels before them)."""
    prompt = call["responses_create_params"]["input"][0]["content"]
    return [part.strip() for part in re.split(r"\n(?:GOLD|CANDIDATE):\n", prompt)[-2:]]


def test_every_row_said_to_be_recorded_by_another_version_exists_and_the_evidence_holds():
    """The reasons in OTHER_RECORDING, checked against the wheel's own files (so none outlives its reason)."""
    for name, index in [*OTHER_RECORDING, *MACHINE_BOUND]:
        assert index < len(_recorded(name)), (name, index)
    app = (nemo_gym_folder("agentif") / "app.py").read_text()
    assert "reward=float(isr_pass)" in app, "0.7.0's agentif rewards the instruction success rate"
    for row in _recorded("agentif"):
        csr = row["n_true"] / (row["n_true"] + row["n_false"])
        assert row["reward"] == round(csr, 4) and (row["reward"] != row["isr_pass"] or row["isr_pass"] == 1)
    for row in _recorded("lc_niah"):  # the folder's rule: answer_score * (1 - overlap), overlap per its config
        assert abs(row["reward"] - row["answer_score"] * (1 - row["overlap_lcs"])) < 1e-9
        assert abs(row["reward"] - row["answer_score"] * (1 - row["overlap_ngram16"])) > 1e-3
    assert "overlap_metric_rule: ngram16" in (nemo_gym_folder("lc_niah") / "configs" / "lc_niah.yaml").read_text()
    swapped = _recorded("terminus_judge")[4]  # its judge calls: the first pass, then GOLD and CANDIDATE exchanged
    first, swap = (_judge_sections(call) for call in swapped["judge_evaluations"])
    assert first == swap[::-1] and len(first) == 2 and swapped["reward"] == 0.0
    assert [call["verdict_label"] for call in swapped["judge_evaluations"]] == ["[[A=B]]", "[[A!=B]]"]
    terminus = (nemo_gym_folder("terminus_judge") / "configs" / "terminus_judge.yaml").read_text()
    assert "check_twice_swap: false" in terminus and "reward_if_swap_fails: 0.0" in terminus
    for name, index in MACHINE_BOUND:  # symbolic answers with powers of 2016 and more, recorded as proven equal
        row = _recorded(name)[index]
        assert row["reward"] == 1.0 and re.search(r"\*\*\s*(20[1-9]\d|[3-9]\d{3})", row["extracted_answer"]), row


def test_math_with_code_s_own_0_7_0_answer_extraction_scores_the_row_recorded_as_0_as_correct():
    """math_with_code's row 4 recorded `extracted_answer: "\\sqrt{2"` (reward 0): its 0.7.0 helpers, taken from its
    app.py and run on the recorded answer text, extract `\\sqrt{2}` and match the expected `\\(\\sqrt{2}\\)`."""
    source = (nemo_gym_folder("math_with_code") / "app.py").read_text()
    tree = ast.parse(source)
    wanted = {"_normalize_answer", "_answers_match", "_extract_boxed_answer"}
    helpers = ast.Module([node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted],
                         type_ignores=[])
    scope = {"Optional": __import__("typing").Optional, "re": re}
    exec(compile(helpers, "math_with_code/app.py", "exec"), scope)  # noqa: S102 - the folder's own pure helpers
    row = _recorded("math_with_code")[4]
    assert ("math_with_code", 4) in OTHER_RECORDING and row["reward"] == 0.0 and row["extracted_answer"] == "\\sqrt{2"
    text = "".join(part["text"] for part in row["response"]["output"][-1]["content"])
    extracted = scope["_extract_boxed_answer"](text)
    assert extracted == "\\sqrt{2}"
    expected = json.loads((nemo_gym_folder("math_with_code") / "data" / "example.jsonl").read_text().splitlines()[3])
    assert scope["_answers_match"](extracted, expected["expected_result"])


def test_a_machine_bound_row_is_counted_apart_only_when_the_folders_time_bound_scored_it_0(tmp_path):
    from gymfleet.testing.nemo_gym_corpus import SLOW_MACHINE

    app = FastAPI()

    @app.post("/verify")
    async def verify(request: Request) -> dict:
        return {"reward": (await request.json())["score"]}

    rows = [{"responses_create_params": {"input": f"q{i}"}, "score": score, "response": {"output": []}, "reward": 1.0}
            for i, score in enumerate([0.0, 0.0, 0.0, 0.0, 0.0, 0.5])]
    folder = tmp_path / "math_with_judge"  # MACHINE_BOUND names its rows 1 and 5
    _write(folder / "data" / "example_rollouts.jsonl", rows)
    _write(folder / "data" / "example.jsonl", [{k: v for k, v in row.items() if k != "reward"} for row in rows])
    (folder / "app.py").write_text("")
    result = FolderResult("math_with_judge")
    with serve(app) as url:
        _replay(folder, url, result)
    assert (result.agree, result.rows, result.blocked) == (0, 6, {SLOW_MACHINE: 1}), "row 5 scored 0.5: disagrees"


def test_a_refused_row_of_a_folder_that_grades_in_containers_is_counted_as_lacking_them(tmp_path):
    """terminal_bench_4 serves here, but its `/verify` requires the `session_id` and `termination` of the container
    sandbox its `/seed_session` made (its `environment.py` runs tasks in docker images): a refused row of such a
    folder is counted as lacking containers; the same refusal from a folder without containers still disagrees."""
    from fastapi.responses import JSONResponse

    from gymfleet.testing.nemo_gym_corpus import CONTAINERS

    app = FastAPI()

    @app.post("/verify")
    async def verify() -> JSONResponse:
        return JSONResponse({"detail": [{"loc": ["body", "session_id"], "msg": "Field required"}]}, status_code=422)

    rows = [{"responses_create_params": {"input": "q"}, "task_name": "t", "response": {"output": []}, "reward": 1.0}]
    for modules, blocked in [({"environment.py": "image = settings.docker_image\n"}, {CONTAINERS: 1}),
                             ({"util.py": "image = None\n"}, {})]:
        folder = tmp_path / str(len(blocked)) / "tb"
        _write(folder / "data" / "example_rollouts.jsonl", rows)
        _write(folder / "data" / "example.jsonl", [{k: v for k, v in rows[0].items() if k != "reward"}])
        (folder / "app.py").write_text("")
        for name, text in modules.items():
            (folder / name).write_text(text)
        result = FolderResult("tb")
        with serve(app) as url:
            _replay(folder, url, result)
        assert (result.agree, result.rows, result.blocked) == (0, 1, blocked), result.why
        assert result.why and "verify 422" in result.why[0]


def test_a_judge_configured_by_the_policy_url_is_the_stand_in_judge(tmp_path):
    """verifif's judge is `judge_base_url: ${policy_base_url}`: ng_run's policy URL is the stand-in judge's, so its
    calls reach the stand-in, which counts those nobody recorded (a judge model lacking), not a refused port."""
    from gymfleet.testing.nemo_gym_corpus import _ng_run

    command = _ng_run(tmp_path / "config.yaml", tmp_path / "verifif", ["verifif"], [], "http://127.0.0.1:5/v1")
    assert "+policy_base_url=http://127.0.0.1:5/v1" in command
