"""math_formal_lean: Lean 4 theorem proving, graded by compiling the model's proof against the row's statement.

## Task fields
- `header`: the file's preamble (`import Mathlib`, `open ...`, `set_option ...`).
- `formal_statement`: the theorem to prove, up to and including its `:=` (NeMo-Gym's rows end in `:= by` and a
  newline). A statement without `:=` is a 422 naming the field.
- `informal_prefix`, `name` (optional): the problem in words and its name; echoed.
- `turn_index` (optional, default 0): which attempt of a multi-turn rollout this is; echoed.
- Any other field (`split`, ...) is echoed untouched.

## Reward
1.0 when the assembled program compiles with no `sorry`, else 0.0. The answer is the response's `output_text`.
Assembly (NeMo-Gym's, `resources_servers/math_formal_lean/proof.py`): the code is the last fenced block of the first
of `lean4`, `lean3`, `lean`, any language that has one (with none: the text, an outer fence removed); the proof is
what follows the `:=` of its first `theorem`/`example` header (a leading `by` dropped; the whole code when it has no
header), so a restated - or altered - statement is never used: the program is the row's `header` +
`formal_statement` + that proof, sent to the Lean checker. Scores 0 without compiling: an empty answer
(`proof_status: empty_generation`), an empty proof (`no_proof`), and a proof using a forbidden construct
(`forbidden`, listed in `forbidden`): `sorry`, `admit`, `sorryAx`, `axiom`, `unsafe`, `implemented_by`, `extern`,
compile-time programs (`run_tac`, `by_elab`, `run_cmd`, `run_elab`, `run_meta`, `#eval`, `elab`, `macro`, their
`_rules`), `mkSorry`, `debug.skipKernelTC`; anywhere outside comments and string literals (the `{...}` of
interpolated strings is code), also written `«sorryAx»`, `_root_.sorryAx`, with full-width or look-alike letters of
other scripts, or with invisible characters inside. From the checker's answer: `completed` with `sorry` anywhere in
its output (any case, as a word) is `has_sorry`, `completed` otherwise 1.0; `failed` (compile errors) and `timeout`
(the compile time limit) score 0. The response adds `proof_status`, `predicted_proof` (the program),
`compiler_output` (`process_status`, `stdout`, `stderr`), `reason` (why it scored 0, in words), `forbidden`, and,
for a multi-turn agent, `needs_correction` (true on every 0), `error_feedback` (the compiler's errors shown in the
code, at most 8, or its raw output) and `correction_prompt` (a request to fix the attempt, quoting it and the
feedback).

A checker that cannot be reached, gives no answer in time (`checker_timeout_s`), answers a non-2xx status once
`checker_max_attempts` are spent, answers something that is not a compile result, or any `process_status` other
than `completed`/`failed`/`timeout` (NeMo-Skills' `error`: the compiler could not run) makes the row a
`sandbox_failed` failure, never a 0.

## Config
- The checker, first that applies: `lean_command` (a bash command line such as `lake env lean`, run as
  `<lean_command> Proof.lean` in gymfleet's sandbox `sandbox` / `sandbox_url`, `memory_mb` per compile; the
  toolchain must be visible inside the sandbox); `checker_url` (`http://host:port` of a NeMo-Skills sandbox);
  `checker` (an instance in the fleet speaking `/execute`: `{type, name}` or its name); else NeMo-Gym's
  `sandbox_host`:`sandbox_port` (null: `$NEMO_SKILLS_SANDBOX_HOST`:`$NEMO_SKILLS_SANDBOX_PORT`, else
  127.0.0.1:6000).
- `compilation_timeout` (30): the compile's time limit. `checker_timeout_s` (null: `compilation_timeout` + 60): the
  HTTP deadline per attempt. `checker_max_attempts` (3): failures to connect, 429/5xx answers and dropped
  connections are retried; a call past its deadline is not.
- `max_output_characters` (1000): compiler output kept. `max_concurrency` (null: no cap): compiles in flight.
- `extract_code_mode` (`last` | `first`), `strip_theorem_from_proof` (true): as NeMo-Gym. `restate_formal_statement`
  may only be true (false would grade whatever theorem the model states).
- `refinement_prompt_template` (null: ours): the correction prompt, with `{proof_attempt}` and `{error_message}`.

## Tools
None. `configs/math_formal_lean.yaml` runs one attempt per rollout (`simple_agent`);
`configs/math_formal_lean_multi_turn.yaml` runs `proof_refinement_agent`, which sends `correction_prompt` as a new
request after a failed attempt (up to 2 corrections) and verifies each attempt with its `turn_index`.

## Departures from NeMo-Gym
- Forbidden constructs score 0 without compiling. NeMo-Gym compiles them and trusts the compiler's `sorry` warning
  alone, which a compile-time program inside the proof (`run_tac` / `by_elab` adding an axiom and closing the goal
  with it) never prints; the `sorry` family is refused before compiling too (the same 0, one compile saved).
- A checker failure is a `sandbox_failed` row; NeMo-Gym scores a checker that is down or slow 0.0 (status `error` or
  `timeout`). An empty proof is `no_proof` without compiling (NeMo-Gym compiles the bare statement: `failed`).
- `error_feedback` reads errors from stdout too (Lean prints them there; NeMo-Gym looks in stderr only and so always
  falls back to the raw output), and the feedback and correction prompt are our wording.

## Version history
- v1: NeMo-Gym's assembly and verdicts, forbidden constructs refused, checker failures typed.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, field_validator

from gymfleet.errors import ConfigError, ServerRefError
from gymfleet.grading.sandbox_client import SandboxClient
from gymfleet.serving.resources import ResourcesServer, ResourcesServerConfig, VerifyRequest, VerifyResponse
from gymfleet.serving.server import ServerRef
from resources_servers.math_formal_lean import feedback, proof
from resources_servers.math_formal_lean.checker import CompilerOutput, ExecuteChecker, SandboxLeanChecker

EMPTY_FEEDBACK = "The answer was empty. Give a complete Lean 4 proof."
NO_PROOF_FEEDBACK = "The answer holds no proof: nothing follows the theorem's `:=`."


class MathFormalLeanConfig(ResourcesServerConfig):
    """math_formal_lean's fields."""

    sandbox_host: str | None = None
    """NeMo-Gym's: host of the NeMo-Skills sandbox, used when no other checker is named (null:
    `$NEMO_SKILLS_SANDBOX_HOST`, else 127.0.0.1)."""
    sandbox_port: int | None = None
    """Its port (null: `$NEMO_SKILLS_SANDBOX_PORT`, else 6000)."""
    checker_url: str | None = None
    """A NeMo-Skills sandbox outside the fleet (`http://host:port`); wins over `checker` and `sandbox_host`."""
    checker: ServerRef | None = None
    """An instance in the fleet speaking `/execute`."""
    lean_command: str | None = None
    """Compile in gymfleet's sandbox with this command (`<lean_command> Proof.lean`); wins over the others."""
    sandbox: ServerRef = "sandbox"
    sandbox_url: str | None = None
    memory_mb: int = Field(default=8192, ge=64)
    compilation_timeout: float = Field(default=30.0, gt=0)
    checker_timeout_s: float | None = Field(default=None, gt=0)
    checker_max_attempts: int = Field(default=3, ge=1, le=10)
    max_output_characters: int = Field(default=1000, ge=100)
    max_concurrency: int | None = Field(default=None, ge=1)
    extract_code_mode: Literal["last", "first"] = "last"
    restate_formal_statement: Literal[True] = True
    """Must be true: the program's statement is always the row's."""
    strip_theorem_from_proof: bool = True
    refinement_prompt_template: str | None = None

    @field_validator("refinement_prompt_template")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                value.format(proof_attempt="", error_message="")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError("the template may hold only the placeholders {proof_attempt} and {error_message} "
                                 f"(write other braces doubled: {{{{ }}}}): {exc!r}") from None
        return value


class MathFormalLeanRequest(VerifyRequest):
    """A row to grade."""

    header: str
    formal_statement: str
    informal_prefix: str | None = None
    name: str | None = None
    turn_index: int = 0

    @field_validator("formal_statement")
    @classmethod
    def _statement(cls, value: str) -> str:
        if ":=" not in value:
            raise ValueError("the statement must run up to its `:=` (e.g. `theorem t (n : ℕ) : n + 0 = n := by`); "
                             "the model's proof is appended to it")
        return value


class MathFormalLeanResponse(VerifyResponse):
    """The graded row."""

    proof_status: str
    predicted_proof: str
    compiler_output: dict[str, str] | None = None
    reason: str | None = None
    forbidden: list[str] = Field(default_factory=list)
    turn_index: int = 0
    needs_correction: bool = False
    error_feedback: str | None = None
    correction_prompt: str | None = None


class MathFormalLeanServer(ResourcesServer):
    """Grades Lean 4 proofs with a Lean checker."""

    config: MathFormalLeanConfig
    reverify_mode = "stateless"
    reward_libraries = ()

    def __init__(self, config, global_config=None):
        super().__init__(config, global_config)
        cfg = self.config
        if cfg.lean_command:
            self.checker: ExecuteChecker | SandboxLeanChecker = SandboxLeanChecker(
                SandboxClient(cfg.sandbox, url=cfg.sandbox_url, config=self.client), lean_command=cfg.lean_command,
                compile_timeout_s=cfg.compilation_timeout, memory_mb=cfg.memory_mb,
                max_output_characters=cfg.max_output_characters, max_concurrency=cfg.max_concurrency)
        else:
            url = cfg.checker_url
            if url is None and cfg.checker is None:
                host = cfg.sandbox_host or os.environ.get("NEMO_SKILLS_SANDBOX_HOST") or "127.0.0.1"
                port = cfg.sandbox_port or _env_port()
                url = f"http://{host}:{port}"
            self.checker = ExecuteChecker(
                cfg.checker, url=url, client=self.client, compile_timeout_s=cfg.compilation_timeout,
                deadline_s=cfg.checker_timeout_s or cfg.compilation_timeout + 60,
                max_attempts=cfg.checker_max_attempts, max_output_characters=cfg.max_output_characters,
                max_concurrency=cfg.max_concurrency)

    async def startup(self) -> None:
        if not self.global_config:
            return
        cfg = self.config
        name, field = ((cfg.sandbox, "sandbox") if cfg.lean_command and cfg.sandbox_url is None
                       else (cfg.checker, "checker") if not cfg.lean_command and cfg.checker_url is None
                       else (None, ""))
        if name is not None:  # in a fleet: a checker instance that is not there fails now, not at the first verify
            try:
                self.client.url_of(name)
            except ServerRefError as exc:
                raise ConfigError(f"math_formal_lean's {field} is not an instance of this fleet: {exc}",
                                  hint="Name an instance of the config, or set checker_url / sandbox_url.") from exc

    async def verify(self, body: MathFormalLeanRequest) -> MathFormalLeanResponse:
        text = body.response.output_text
        if not text.strip():
            return self._retry(body, text, reward_fields(proof_status="empty_generation", predicted_proof="",
                                                         reason="empty answer"), EMPTY_FEEDBACK)
        code = proof.extract_code(text, self.config.extract_code_mode)
        proof_part = proof.proof_body(code) if self.config.strip_theorem_from_proof else code
        program = proof.assemble(body.header, body.formal_statement, proof_part)
        if not proof_part.strip():
            return self._retry(body, text, reward_fields(proof_status="no_proof", predicted_proof=program,
                                                         reason="no proof after the statement"), NO_PROOF_FEEDBACK)
        forbidden = proof.forbidden_constructs(proof_part)
        if forbidden:
            names = ", ".join(forbidden)
            fields = reward_fields(proof_status="forbidden", predicted_proof=program, forbidden=forbidden,
                                   reason=f"the proof uses {names}")
            return self._retry(body, text, fields, f"The proof uses {names}, which a proof may not use. "
                                                   "Prove the theorem with ordinary tactics.")
        output = await self.checker.compile(program)
        status = proof.proof_status(output.process_status, output.stdout, output.stderr)
        fields = reward_fields(proof_status=status, predicted_proof=program, compiler_output=output.as_dict())
        if status == "completed":
            return MathFormalLeanResponse.echo(body, reward=1.0, **fields)
        fields["reason"] = _REASONS.get(status, status)
        return self._retry(body, text, fields, _feedback(output, program))

    def _retry(self, body: MathFormalLeanRequest, attempt: str, fields: dict[str, Any],
               message: str) -> MathFormalLeanResponse:
        """A 0.0 row with what a multi-turn agent needs to ask for a corrected proof."""
        prompt = feedback.correction_prompt(attempt or "(empty)", message, self.config.refinement_prompt_template)
        return MathFormalLeanResponse.echo(body, reward=0.0, needs_correction=True, error_feedback=message,
                                           correction_prompt=prompt, **fields)


_REASONS = {"has_sorry": "the compiler reports a sorry", "failed": "the proof does not compile",
            "timeout": "compiling took longer than the time limit"}


def reward_fields(**fields: Any) -> dict[str, Any]:
    return {"compiler_output": None, "reason": None, "forbidden": [], **fields}


def _env_port() -> int:
    value = os.environ.get("NEMO_SKILLS_SANDBOX_PORT") or "6000"
    try:
        return int(value)
    except ValueError:
        hint = "Set it to the NeMo-Skills sandbox's port (6000 by default), or set sandbox_port."
        raise ConfigError(f"NEMO_SKILLS_SANDBOX_PORT={value!r} is not a port number", hint=hint) from None


def _feedback(output: CompilerOutput, program: str) -> str:
    return feedback.error_feedback(output.process_status, output.stdout, output.stderr, program)
