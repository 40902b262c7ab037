"""proof_refinement_agent: attempt, verify, and on failure ask again with the environment's correction prompt.

NeMo-Gym's `proof_refinement_agent` (used by math_formal_lean's multi-turn config), over simple_agent's episode:
`/run` seeds the session, then for each turn runs an episode (`simple_agent`'s model ⇄ tools loop) and POSTs
`/verify` with the row, the episode's `response` and `turn_index` (0 first). It stops when the answer needs no
correction (`needs_correction` false or absent: solved, or nothing to fix), after `max_correction_turns` corrections,
when the environment gives no `correction_prompt`, or when the verify answer is an infrastructure failure row
(`_ng_failure_class`: returned as it is, never retried as the model's fault). Otherwise the next turn's request is
the row's `responses_create_params` with its input replaced by one user message, the `correction_prompt` (a fresh
conversation, as NeMo-Gym does: the earlier attempt is quoted inside the prompt).

The answer is the last `/verify` answer (so the reward is the last attempt's), plus `total_turns` and, with
`include_all_attempts`, `all_attempts`: per turn `turn_index`, `input`, `response`, `generation` (the first output
text of the answer), `proof_status`, `reward`, `error_feedback`, `correction_prompt`.

Departure from NeMo-Gym: a correction turn keeps every sampling parameter of the row's request (`max_output_tokens`,
`tools`, ...), not only `model`, `temperature`, `top_p` and `max_tokens` (a Chat Completions name NeMo-Gym's
Responses requests do not use, so its correction turns lost their output limit).
"""

from __future__ import annotations

from typing import Any

from agents.simple_agent.app import SimpleAgent, SimpleAgentConfig
from gymfleet.serving.agent import RunRequest

FAILURE_KEY = "_ng_failure_class"


class ProofRefinementAgentConfig(SimpleAgentConfig):
    """proof_refinement_agent's fields (and simple_agent's)."""

    max_correction_turns: int = 0
    """Corrections after the first attempt (0: a single attempt, like simple_agent)."""
    include_all_attempts: bool = True
    """Add `all_attempts` (every turn's prompt, response and verdict) to the answer."""


class ProofRefinementAgent(SimpleAgent):
    """simple_agent with a verify-and-correct loop."""

    config: ProofRefinementAgentConfig

    async def run(self, body: RunRequest, raw: dict[str, Any], cookies: dict[str, str]):
        if self.config.skip_verification:  # nothing to correct against: one attempt, as simple_agent
            return await super().run(body, raw, cookies)
        env = self.config.resources_server
        cookies = await self.seed(raw, cookies)
        params = raw["responses_create_params"]
        attempts: list[dict[str, Any]] = []
        turn = 0
        while True:
            response, cookies = await self.respond(params, cookies)
            verified = await self.client.post(env, "/verify", json={**raw, "response": response, "turn_index": turn},
                                              cookies=cookies, timeout_s=self.config.verify_timeout_s)
            verified.raise_for_status()
            cookies = {**cookies, **verified.cookies}
            result = verified.json()
            attempts.append({"turn_index": turn, "input": params["input"], "response": response,
                             "generation": _first_output_text(response), "proof_status": result.get("proof_status"),
                             "reward": result.get("reward"), "error_feedback": result.get("error_feedback"),
                             "correction_prompt": result.get("correction_prompt")})
            prompt = result.get("correction_prompt")
            if (FAILURE_KEY in result or not result.get("needs_correction") or turn >= self.config.max_correction_turns
                    or not prompt):
                break
            params = {**raw["responses_create_params"], "input": [{"role": "user", "content": prompt}]}
            turn += 1
        result["total_turns"] = turn + 1
        if self.config.include_all_attempts:
            result["all_attempts"] = attempts
        return result, cookies


def _first_output_text(response: dict[str, Any]) -> str:
    for item in response.get("output") or []:
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if part.get("type") == "output_text":
                    return part.get("text") or ""
    return ""
