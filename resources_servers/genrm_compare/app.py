r"""genrm_compare: RLHF rewards from a generative reward model (GenRM) comparing the rollouts of one prompt in pairs.

## Task fields
- `responses_create_params.input`: the conversation; its messages (text parts joined) are what the GenRM sees
  before the two replies. Nothing else of the row is read but the grouping fields below.
- `principle` (optional): the judging principle for this row (with `use_principle`); part of the group key.
- `_ng_task_index` (added by the rollout collector and by NeMo-RL's async GRPO), `prompt_id` (optional): group
  keys. `_ng_rollout_index` (optional): the rollout's place in its group.
- Any other field (`dataset`, `agent_ref`, ...) is echoed. NeMo-Gym's genrm_compare rows are accepted as they are.

## Reward
Group-relative, on the GenRM's 1-5 helpfulness scale plus shaping (spec 2.9); higher is better, and only the
differences inside a group mean anything.
1. Grouping (cohort `/verify`): with `num_rollouts_per_prompt` N > 1, a `/verify` waits until N rollouts of its
   prompt have arrived. The group key is `task_idx::<_ng_task_index>::<h>` (else `prompt_id::<prompt_id>::<h>`,
   else `<h>`), h = sha256 of the input and the row's principle. A rollout takes the slot of its `_ng_rollout_index`
   when that is in 0..N-1 and free (so pairs, and rewards, do not depend on arrival order), else the lowest free one.
   As each rollout arrives, every comparison between it and a rollout already there starts at once. With N <= 1,
   `/verify` returns `default_score` without asking the GenRM.
2. Pairs: `circular` = (i, i+1 mod N), N comparisons; `all_pairs` = every i < j; each repeated
   `num_judges_per_comparison` times. Response i is shown as `response_1`.
3. One comparison: a Chat Completions request to the GenRM: the conversation, then a `principle` message (with
   `use_principle`: the row's principle, else `default_principle`), then `response_1` and `response_2` messages
   holding each reply's `output_text` (reasoning excluded; an empty reply is shown as `None`). The reply's text
   (`<think>` blocks dropped) is parsed by `scoring.parse_verdict`: the first object with `score_1`, `score_2` or
   `ranking` (directly or under `overall`) in a ```json block, else the last such object; missing keys default.
   A reply without a valid verdict is asked again up to `genrm_parse_retries` times, `genrm_parse_retry_sleep_s`
   apart; then the comparison counts as `(default_score, default_score, default_ranking)`.
4. Aggregation (`scoring.aggregate`, comparisons summed in `(judge_index, i, j)` order): the tie-breaker
   (equal scores are split by `3.5 - ranking`), the mean over each reply's comparisons (`default_score` without
   any), the top-percentile bonuses for the shortest non-empty reasoning and answer, the group length adjustment
   and the style penalty, exactly as `scoring`'s docstring gives them.
5. Injection: a reply holding a GenRM verdict (`score_1`/`score_2` with a number in any key-value spelling, a
   rating such as `Score: 5/5`), a claim about which of `response_1`/`response_2` is better,
   or what the shared screen
   finds (`gymfleet.grading.judge_input.screen`, on the NFKC-normalised text: chat-template turn markers of the
   common model families, text addressed to a grader, an instruction override), or "ignore ... instructions ...
   rank / rate / prefer / better ..." for a pairwise judge, is
   never shown to the GenRM. It gets `scoring.reward_floor` (1 - 2.5 minus the three group
   coefficients: below any reward the aggregation can give), with `judge_injection` listing why. Its comparisons
   are skipped (its partners are scored on their other comparisons), and the group is aggregated without it.
Response fields: `genrm_position` (the slot), `genrm_cohort_size`, `genrm_base_score` (before shaping; null when
flagged), `genrm_length_adjustment`, `genrm_style_adjustment`, `genrm_comparisons` (this reply's comparisons:
`{response_1, response_2, judge_index, score_1, score_2, ranking, parsed, attempts}`, `parsed` false when the
defaults were used), `genrm_metrics` (the group's `mean_individual_score`, `std_individual_score`,
`tiebreak_usage_rate`), `judge_provenance` (the distinct `{judge_server, judge_model, prompt_version, seed}` of its
comparisons), `judge_injection` (null, or the reasons).

`POST /compare` `{conversation_history: [{role, content}], response_objs: [Responses objects], principle?}` judges
a whole group at once by the same rules and answers `{rewards, comparison_results: [{response_i, response_j,
judge_idx, score_1, score_2, ranking}], metrics, judge_injection, judge_provenance}`; fewer than two responses get
`default_score` each.

Failures, kept out of rewards (`_ng_failure_class`):
- `judge_failed` for every member of a group when any of its GenRM calls fails (unreachable, timed out, an error
  status once `judge_max_attempts` are spent, a reply that is not a completion): rewards are group-relative, so no
  member's reward stands without the others. A failed group stays registered until it is full or its deadline
  passes, so its late members fail at once; a resubmitted group starts afresh. On `/compare` it is an HTTP 503
  with `error_type: judge_failed`.
- `cohort_timeout` for every member that arrived when a group is still short of N rollouts `cohort_timeout_s` after
  its first arrival; the group is then dropped (a late member starts a new group).
- `cohort_conflict` for a `/verify` whose `_ng_rollout_index` is already in its pending group with a different
  response. The same response again (a retried request) joins the first and gets its result.
Groups are held in memory only while pending: a full group leaves the registry at once, an expired one at its
deadline; the next rollouts of the same key start a new group.

## Differences from NeMo-Gym
- A GenRM call that fails is a `judge_failed` group, not a silent `(3.0, 3.0, 3.5)` comparison: a judge outage
  must not train the policy on neutral rewards. (An unparseable verdict still gets the defaults, as documented.)
- Groups have a deadline (`cohort_timeout_s`) and are dropped when done; NeMo-Gym waits forever and keeps every
  completed reward for the life of the process.
- Slots follow `_ng_rollout_index`, so who is compared with whom, and the float sums, do not depend on arrival
  order; judging runs concurrently (NeMo-Gym judges under the group's lock, one arrival at a time).
- Verdict values must be finite numbers in range (scores 1-5, ranking 1-6, not booleans); an object with any
  other value is not a verdict and the search goes on. NeMo-Gym takes any `float()`-able value.
- The GenRM is any model server reached over Chat Completions with the custom roles in the messages (NeMo-Gym
  sends them as `metadata` to its own `genrm_model` server, which adds the roles).
- The injection rule (Reward 5) and our own default principle (`principle.txt`).
- The conversation's `input_text` parts are shown to the GenRM too (NeMo-Gym keeps only `output_text` parts).

## Config
- `genrm_model_server`: the GenRM's model server, `{type: responses_api_models, name: ...}` or a plain name
  (NeMo-Gym's key; checked at startup when N > 1).
- `genrm_responses_create_params` ({}): sampling for GenRM calls in Responses form (`max_output_tokens`,
  `temperature`, `top_p`, `seed`, ...), sent as Chat fields (`max_output_tokens` becomes `max_tokens`); `input`
  is ignored.
- `judge_timeout_s` (600), `judge_max_attempts` (3), `judge_max_concurrency` (256): per-attempt deadline, attempts
  per call (connection failures, 429 with `Retry-After`, 5xx), GenRM calls in flight at once.
- `num_rollouts_per_prompt` (1): N; must equal the trainer's generations per prompt (16 in NeMo-RL's recipes).
- `cohort_timeout_s` (1800): how long a group may wait for its members, from its first arrival.
- `verify_timeout_s` (2400): the backstop of one `/verify`; must exceed `cohort_timeout_s` by the time judging
  takes after the last arrival.
- `comparison_strategy` (circular), `num_judges_per_comparison` (1), `aggregator_method` (simple_tiebreaker, the
  only one), `use_principle` (false), `default_principle` (null: `principle.txt`).
- `reasoning_bonus`, `answer_bonus` (0), `top_percentile` (0.2), `group_reasoning_length_penalty_coeff`,
  `group_answer_length_penalty_coeff`, `group_style_penalty_coeff` (0; all >= 0).
- `default_score` (3.0), `default_ranking` (3.5), `genrm_parse_retries` (3), `genrm_parse_retry_sleep_s` (0.2),
  `debug_logging` (false: log each group's rewards at INFO).
- `max_open_groups` (4096): groups pending at once (`/verify` groups short of members plus `/compare` calls being
  judged); a `/verify` that would open one more, or a `/compare`, is a 429 `busy` with `Retry-After` (nothing
  judged; clients retry). `max_compare_responses` (64): a `/compare` with more responses is a 413.
- `num_workers` must be 1: a group's members must reach the same process.

## Tools
None. `POST /compare` is the batch route (above).

## Version history
- v1: NeMo-Gym's cohort `/verify`, `/compare`, strategies and aggregation; deadlines, rollout-index slots,
  concurrent judging, `judge_failed` groups, verdict range checks, the injection rule.
- v2: the injection rule uses the shared screen (`gymfleet.grading.judge_input`): look-alike and zero-width
  spellings, turn markers of other model families and notes to a grader are caught too. Departure from the other
  judged environments: the GenRM's chat layout (its roles) is fixed by the model, so answers are not put in a
  nonce block.
- v3: a score written in a reply in any key-value spelling (`[[score_1=5]]`, `score 2 = 1`, look-alikes), a
  rating written as `Verdict: 5/5`, and a claim about the GenRM's own roles ("Response 1 is
  better", "prefer response_2") are injections too (found by `tests/test_judge_injection_property.py`: a GenRM that
  obeys scores written in a candidate gave `[[score_1=5]]` the top score).
- v4: the shared screen's honest-text revision (`gymfleet.grading.judge_input`, "Screen history").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response as StarletteResponse

from gymfleet.errors import BusyError, JudgeError, ServerRefError
from gymfleet.grading.judge import JudgeClient, JudgeReply, chat_text, load_prompt, prompt_version
from gymfleet.grading.think import strip_think
from gymfleet.serving.bodies import read_json, validate
from gymfleet.serving.resources import ResourcesServer
from gymfleet.serving.server import JSONResponse, add_route
from resources_servers.genrm_compare.cohorts import Cohort, CohortTimeout, Member
from resources_servers.genrm_compare.models import (
    CompareRequest,
    Comparison,
    GenRMCompareConfig,
    GenRMCompareRequest,
    GenRMCompareResponse,
)
from resources_servers.genrm_compare.prompt import (  # noqa: F401  (GENRM_LABELS: re-exported)
    GENRM_LABELS,
    chat_params,
    conversation_messages,
    injection_reasons,
)
from resources_servers.genrm_compare.scoring import (
    Verdict,
    aggregate,
    comparison_pairs,
    parse_verdict,
    response_parts,
    reward_floor,
    shown_answer,
)

log = logging.getLogger(__name__)

LAYOUT = "chat roles: conversation, principle?, response_1, response_2; JSON verdict score_1/score_2/ranking\n"
"""What the GenRM request looks like; with the principle, it is the prompt whose version rewards record."""



class GenRMCompareServer(ResourcesServer):
    """Pairwise GenRM comparison of a prompt's rollouts, as cohorts (`/verify`) or a batch (`/compare`)."""

    config: GenRMCompareConfig
    reverify_mode = "unsupported"  # a reward depends on the rest of its group
    reward_libraries = ()

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = self.config
        self.judge = JudgeClient(config.genrm_model_server, self.client, timeout_s=config.judge_timeout_s,
                                 max_concurrency=config.judge_max_concurrency, max_attempts=config.judge_max_attempts)
        self.default_principle = config.default_principle or load_prompt(__file__, "principle.txt").strip()
        self.prompt_version = prompt_version(LAYOUT + (self.default_principle if config.use_principle else ""),
                                             "genrm_roles")
        self.cohorts: dict[str, Cohort] = {}
        """Pending groups by key (full and expired ones are dropped)."""
        self.comparing = 0
        """`/compare` calls being judged (they count against `max_open_groups` too)."""

    async def startup(self) -> None:
        await super().startup()
        if self.config.num_rollouts_per_prompt <= 1:
            log.warning("%s: num_rollouts_per_prompt is %d, so every /verify answers default_score %.1f without a "
                        "comparison (only POST /compare judges). For GRPO, set it to the trainer's generations per "
                        "prompt, e.g. ++%s.resources_servers.genrm_compare.num_rollouts_per_prompt=16",
                        self.config.name, self.config.num_rollouts_per_prompt, self.config.default_score,
                        self.config.name)
        try:
            self.judge.url()
        except ServerRefError:
            if self.config.num_rollouts_per_prompt > 1:
                raise
            log.warning("GenRM server %r is not in the fleet: /verify answers default_score (N <= 1), and /compare "
                        "will fail", self.config.genrm_model_server)

    def routes(self, app: FastAPI) -> None:
        super().routes(app)

        async def compare_route(request: Request) -> StarletteResponse:
            body = validate(CompareRequest, await read_json(request))
            limit = self.config.max_compare_responses
            if len(body.response_objs) > limit:
                detail = (f"{self.config.name}: /compare got {len(body.response_objs)} responses, more than "
                          f"max_compare_responses={limit}; send groups of at most {limit}")
                return JSONResponse({"detail": detail, "error_type": "request_too_large"}, status_code=413)
            self._admit_group("a /compare")
            self.comparing += 1
            try:
                return JSONResponse(await self._compare(body))
            except JudgeError as exc:
                self.metrics.failures.labels("judge_failed").inc()
                log.warning("/compare failed (judge_failed): %s", exc)
                return JSONResponse({"detail": str(exc), "error_type": "judge_failed"}, status_code=503)
            finally:
                self.comparing -= 1

        add_route(app, "/compare", compare_route)

    # ------------------------------------------------------------------------------------------ cohort /verify

    async def verify(self, body: GenRMCompareRequest) -> GenRMCompareResponse | dict[str, Any]:
        config = self.config
        size = config.num_rollouts_per_prompt
        if size <= 1:
            return GenRMCompareResponse.echo(body, reward=config.default_score, **_unjudged(0, 1))
        member = _member(_rollout_index(body), _response_dict(body))
        conversation = conversation_messages(body.responses_create_params.input)
        key = _cohort_key(body, conversation)
        cohort = self.cohorts.get(key)
        if cohort is None:
            self._admit_group(f"group {key}")
            cohort = self.cohorts[key] = self._new_cohort(key, size, conversation, self._principle(body.principle))
            cohort.timer = asyncio.get_running_loop().call_later(config.cohort_timeout_s, self._expire, key, cohort)
        try:
            slot = cohort.slot_of(member.rollout_index, member.digest)
        except ValueError as exc:
            return self._failure("cohort_conflict", f"group {key}: {exc}")
        if slot is None:
            slot = cohort.add(member)
            if cohort.full:  # out of the registry at once; the timer let go of it too
                cohort.timer.cancel()
                del self.cohorts[key]
        try:
            outcome = await asyncio.shield(cohort.outcome)
        except CohortTimeout as exc:
            return self._failure("cohort_timeout", str(exc))
        return GenRMCompareResponse.echo(body, **outcome[slot])

    def _admit_group(self, what: str) -> None:
        """Refuse a new group (`BusyError`: 429) while `max_open_groups` are pending."""
        limit = self.config.max_open_groups
        if len(self.cohorts) + self.comparing >= limit:
            raise BusyError(f"{what} would open group {limit + 1}: max_open_groups={limit} groups are pending "
                            f"(groups still waiting for their {self.config.num_rollouts_per_prompt} rollouts, and "
                            "/compare calls being judged); retry later, or raise max_open_groups",
                            retry_after_s=5.0)

    def _expire(self, key: str, cohort: Cohort) -> None:
        if self.cohorts.get(key) is cohort:
            del self.cohorts[key]
        if not cohort.full:
            cohort.fail(CohortTimeout(f"group {key}: {cohort.arrived} of {cohort.size} rollouts arrived within "
                                      f"cohort_timeout_s={self.config.cohort_timeout_s:g}s"))

    def _failure(self, failure_class: str, reason: str) -> dict[str, Any]:
        self.metrics.failures.labels(failure_class).inc()
        log.warning("verify failed (%s): %s", failure_class, reason)
        return {"reward": 0.0, "_ng_failure_class": failure_class, "failure": reason}

    # ------------------------------------------------------------------------------------------ judging

    def _principle(self, principle: str | None) -> str | None:
        return (principle or self.default_principle) if self.config.use_principle else None

    def _new_cohort(self, key: str, size: int, conversation: list[dict[str, str]], principle: str | None) -> Cohort:
        pairs = [(i, j, judge) for judge in range(self.config.num_judges_per_comparison)
                 for i, j in comparison_pairs(self.config.comparison_strategy, size)]

        async def compare(first: Member, second: Member, pair: tuple[int, int, int]) -> Comparison:
            return await self._judge_pair(conversation, principle, first, second, pair)

        return Cohort(key, size, pairs, compare, self._finish)

    async def _judge_pair(self, conversation: list[dict[str, str]], principle: str | None, first: Member,
                          second: Member, pair: tuple[int, int, int]) -> Comparison:
        """One comparison, asked again while the reply holds no verdict; JudgeError when a call fails."""
        config = self.config
        messages = [*conversation, *([{"role": "principle", "content": principle}] if principle else []),
                    {"role": "response_1", "content": shown_answer(first.answer)},
                    {"role": "response_2", "content": shown_answer(second.answer)}]
        params = chat_params(config.genrm_responses_create_params)
        attempts = config.genrm_parse_retries + 1
        for attempt in range(1, attempts + 1):
            completion = await self.judge.chat({"messages": messages, **params})
            text = chat_text(completion)
            verdict = parse_verdict(strip_think(text) if text else None, config.default_score, config.default_ranking)
            seed = params.get("seed")
            reply = JudgeReply(text or "", self.judge.server, completion.get("model") or params.get("model"),
                               seed if isinstance(seed, int) else None)
            if verdict is not None:
                return _comparison(pair, verdict, True, attempt, reply.provenance(self.prompt_version))
            if attempt < attempts:
                await asyncio.sleep(config.genrm_parse_retry_sleep_s)
        log.warning("GenRM reply for pair %s held no verdict after %d attempts; using the defaults: %r", pair,
                    attempts, (text or "")[-300:])
        fallback = Verdict(config.default_score, config.default_score, config.default_ranking)
        return _comparison(pair, fallback, False, attempts, reply.provenance(self.prompt_version))

    def _finish(self, members: list[Member], comparisons: list[Comparison]) -> list[dict[str, Any]]:
        """Per-slot response fields of a full group (module docstring, Reward 4 and 5)."""
        config = self.config
        comparisons = sorted(comparisons, key=lambda c: (c.judge_index, c.response_1, c.response_2))
        judged = [member.slot for member in members if not member.injection]
        position = {slot: index for index, slot in enumerate(judged)}
        result = aggregate(
            [((position[c.response_1], position[c.response_2], c.judge_index),
              Verdict(c.score_1, c.score_2, c.ranking)) for c in comparisons],
            [members[slot].reasoning for slot in judged], [members[slot].answer for slot in judged],
            config.shaping(),
        )
        floor = reward_floor(config.shaping())
        outcome = []
        for member in members:
            own = [c for c in comparisons if member.slot in (c.response_1, c.response_2)]
            provenance = list({orjson.dumps(c.provenance): c.provenance for c in own if c.provenance}.values())
            fields: dict[str, Any] = {
                "genrm_position": member.slot, "genrm_cohort_size": len(members),
                "genrm_comparisons": [c.model_dump() for c in own], "genrm_metrics": result.metrics,
                "judge_provenance": provenance, "judge_injection": member.injection or None,
            }
            if member.injection:
                fields.update(reward=floor, genrm_base_score=None, genrm_length_adjustment=0.0,
                              genrm_style_adjustment=0.0)
            else:
                index = position[member.slot]
                fields.update(reward=result.rewards[index], genrm_base_score=result.base_scores[index],
                              genrm_length_adjustment=result.length_adjustments[index],
                              genrm_style_adjustment=result.style_adjustments[index])
            outcome.append(fields)
        if config.debug_logging:
            log.info("GenRM group of %d: rewards %s", len(members), [round(f["reward"], 4) for f in outcome])
        return outcome

    # ------------------------------------------------------------------------------------------ batch /compare

    async def _compare(self, body: CompareRequest) -> dict[str, Any]:
        config = self.config
        size = len(body.response_objs)
        if size < 2:
            return {"rewards": [config.default_score] * size, "comparison_results": [], "metrics": {},
                    "judge_injection": [None] * size, "judge_provenance": []}
        conversation = conversation_messages(body.conversation_history)
        cohort = self._new_cohort("compare", size, conversation, self._principle(body.principle))
        for index, response in enumerate(body.response_objs):
            cohort.add(_member(index, response))
        outcome = await asyncio.shield(cohort.outcome)
        comparisons = sorted({(c["response_1"], c["response_2"], c["judge_index"]): c
                              for fields in outcome for c in fields["genrm_comparisons"]}.items())
        provenance = {orjson.dumps(p): p for fields in outcome for p in fields["judge_provenance"]}
        return {
            "rewards": [fields["reward"] for fields in outcome],
            "comparison_results": [{"response_i": c["response_1"], "response_j": c["response_2"],
                                    "judge_idx": c["judge_index"], "score_1": c["score_1"], "score_2": c["score_2"],
                                    "ranking": c["ranking"]} for _, c in comparisons],
            "metrics": outcome[0]["genrm_metrics"],
            "judge_injection": [fields["judge_injection"] for fields in outcome],
            "judge_provenance": list(provenance.values()),
        }


# ---------------------------------------------------------------------------------------------- helpers


def _comparison(pair: tuple[int, int, int], verdict: Verdict, parsed: bool, attempts: int,
                provenance: dict[str, Any]) -> Comparison:
    return Comparison(response_1=pair[0], response_2=pair[1], judge_index=pair[2], score_1=verdict.score_1,
                      score_2=verdict.score_2, ranking=verdict.ranking, parsed=parsed, attempts=attempts,
                      provenance=provenance)


def _unjudged(slot: int, size: int) -> dict[str, Any]:
    return {"genrm_position": slot, "genrm_cohort_size": size, "genrm_base_score": None,
            "genrm_length_adjustment": 0.0, "genrm_style_adjustment": 0.0, "genrm_comparisons": [],
            "genrm_metrics": {}, "judge_provenance": [], "judge_injection": None}


def _rollout_index(body: GenRMCompareRequest) -> int | None:
    index = (body.__pydantic_extra__ or {}).get("_ng_rollout_index")
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def _response_dict(body: GenRMCompareRequest) -> dict[str, Any]:
    return body.response.model_dump(mode="json", include={"output"})


def _member(rollout_index: int | None, response: dict[str, Any]) -> Member:
    reasoning, answer = response_parts(response)
    digest = hashlib.sha256(orjson.dumps([reasoning, answer])).hexdigest()
    return Member(rollout_index, digest, reasoning, answer, injection_reasons(answer))


def _cohort_key(body: GenRMCompareRequest, conversation: list[dict[str, str]]) -> str:
    digest = hashlib.sha256(orjson.dumps({"input": conversation, "principle": body.principle},
                                         option=orjson.OPT_SORT_KEYS)).hexdigest()
    task = (body.__pydantic_extra__ or {}).get("_ng_task_index")
    if task is not None:
        return f"task_idx::{task}::{digest}"
    if body.prompt_id is not None:
        return f"prompt_id::{body.prompt_id}::{digest}"
    return digest
