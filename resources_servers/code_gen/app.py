"""code_gen: competitive programming, graded by running the model's program on hidden tests in the sandbox.

## Task fields
- `verifier_metadata.unit_tests`: `{inputs: [str], outputs: [str], fn_name: str | null}` (LiveCodeBench format;
  a JSON string of that object, nesting at most 100 levels, is accepted too). With `fn_name` null each input is the
  program's stdin and each output its expected stdout; with `fn_name` set each input holds the function's arguments
  as JSON, one per line, and each output the expected return value as JSON, at most 100 levels deep (a method of
  `class Solution` when the code defines one). An input or output may also be a list of lines (strings or numbers),
  joined with newlines. A row breaking these rules (unequal counts, a deeper value, invalid JSON or a lone surrogate
  in the string) is a 422 naming `verifier_metadata.unit_tests`.
- `verifier_metadata.difficulty` (optional): echoed as `difficulty`.
- Any other field (`hash_id`, `dataset`, `source`, ...) is echoed untouched.

## Reward
1.0 iff every test passes, else 0.0. The answer is the response's `output_text`; the code is the lines between its
last two fence lines (```); an empty answer or no code scores 0.0 without running. Tests run in order in the
sandbox (`sandbox/`), each in a fresh process with `unit_test_timeout_secs` of CPU time (the sandbox allows
`wall_time_factor` times that, 2 by default, in wall-clock time) and `memory_mb` (per process and for all of a
test's processes together), after a grader header that pre-imports the usual contest modules (`math`,
`collections`, `heapq`, ...; recursion limit 50000); the first failing test decides (the first test runs alone,
the rest only if it passes). Stdin tests run the code as the main program and compare its stdout line by line
after stripping the output and each line, a line matching exactly or token by token as decimals (`1.0` = `1`; a
NaN token, quiet or signaling, matches only as the same text). Call tests import the code as a module (not
`__main__`), call the function (or the `Solution` method) with the JSON arguments and compare its return value:
equal JSON values (tuples as lists, `1` = `1.0`; a string never equals a number, `"6"` is not `6`), or numbers
within 1e-5 relative; a value nesting deeper than 100 levels is a wrong answer; what the code prints is ignored.
Whatever a program prints or returns grades to a reward, never an error. Expected outputs never enter the sandbox
(the cases reach it through `_run_cases`, inputs only). When the first test passes, the rest run with two
grader-owned canaries at random places among them (`gymfleet.grading.canary.CaseCanaries`): a copy of a real test,
which must pass, and a real test's input paired with another test's expected output, which must fail; a canary
that comes out wrong (or a run that stops before the must-pass one) scores `tests_tampered` (0). They catch a
program that answers by its place in the run (a memorised output list, a counter file) or forges the result
channel; one that looks answers up by input in a leaked table would pass them, which is why nothing expected is in
the sandbox.
A `<think>`/`</think>` tag in the answer (or more than one of either in the reasoning summary) scores
`reasoning_format_penalty` without running.
Response fields: `verdict` (`passed`, `empty`, `no_code`, `think_tag_leak`, `wrong_answer`, `timeout`,
`runtime_error`, `memory_limit`, `tests_tampered`), `failed_test` (index) and `metadata` (what failed: expected vs
got, stderr, status, and a wrong answer's or a tampered run's `reason`), `tests_passed`, `tests_total`, plus
NeMo-Gym's `extracted_model_output`, `extracted_model_code`, `result` (per test run: true, -2 wrong answer, -3 time
limit, -4 runtime error), `unit_tests_time_taken`, `reasoning_format_violation_rate`, `difficulty`. A sandbox that
fails (unreachable, 5xx) makes the row a `sandbox_failed` failure, never a 0.

## Config
- `sandbox`: the sandbox instance (`{type: sandbox_servers, name: sandbox}` or its name); `sandbox_url` instead
  names a sandbox outside the fleet.
- `unit_test_timeout_secs` (10), `memory_mb` (4096): limits per test.
- `reasoning_format_penalty` (0.0; NeMo-Gym's super-v3 branch used -0.2).
- `num_processes`: at most this many verifications use the sandbox at once (null: no cap; the sandbox queues).

## Tools
None.

## Version history
- v1: NeMo-Gym/LiveCodeBench row format and grading rules, run in the bubblewrap sandbox.
- v2: call-based results compare by JSON type (NeMo-Gym's `float(pred)` fallback accepted the string `"6"` for `6`;
  the tolerance now applies to numbers only); output no comparison can parse (`sNaN`, values nested thousands deep)
  is a wrong answer, and a row nested too deep a 422, where v1 answered HTTP 500.
- v3: grader-owned canaries in every run whose first test passes (issue 25): a copy of a real test (must pass)
  and a real test's input paired with another test's expected output (must fail; a random token when every
  test expects the same), at random places among the rest; a canary that comes out wrong (or a run that stops
  before the must-pass one) scores `tests_tampered` (0). Departure: NeMo-Gym runs no canaries; a passing
  program costs two more sandbox runs.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gymfleet.errors import SandboxError
from gymfleet.grading import answers
from gymfleet.grading.canary import case_canaries
from gymfleet.grading.sandbox_client import RunResult
from gymfleet.serving.resources import VerifyRequest, VerifyResponse
from gymfleet.serving.sandboxed import SandboxedConfig, SandboxedServer
from gymfleet.wire import Response
from resources_servers.code_gen.checker import (
    MAX_JSON_DEPTH,
    Grade,
    call_program,
    grade,
    json_nests_deeper,
    leaks_think_tags,
    outputs_agree,
    passes,
    prelude_for,
)


class CodeGenConfig(SandboxedConfig):
    """code_gen's fields."""

    unit_test_timeout_secs: float = 10.0
    memory_mb: int = 4096
    reasoning_format_penalty: float = 0.0
    num_processes: int | None = None
    """NeMo-Gym's concurrency knob: verifications using the sandbox at once (null: the sandbox's queue decides)."""


class UnitTests(BaseModel):
    """LiveCodeBench tests: inputs and expected outputs, and the function to call (null: stdin/stdout)."""

    model_config = ConfigDict(extra="allow")
    inputs: list[str]
    outputs: list[str]
    fn_name: str | None = None

    @field_validator("inputs", "outputs", mode="before")
    @classmethod
    def _lines(cls, values: Any) -> Any:
        if isinstance(values, list):
            return [_joined_lines(value) if isinstance(value, list) else value for value in values]
        return values

    @model_validator(mode="after")
    def _usable(self) -> UnitTests:
        if len(self.inputs) != len(self.outputs) or not self.inputs:
            raise ValueError(f"need as many outputs as inputs, and some: {len(self.inputs)} vs {len(self.outputs)}")
        if self.fn_name is not None:  # the grader parses these expected values as JSON
            for index, output in enumerate(self.outputs):
                if json_nests_deeper(output):
                    raise ValueError(f"outputs[{index}] nests deeper than {MAX_JSON_DEPTH} levels; "
                                     "expected return values must be JSON no deeper than that")
        return self


def _joined_lines(lines: list[Any]) -> str:
    """A test written as a list of lines: the lines joined (numbers as their text)."""
    if any(isinstance(line, list | dict) for line in lines):
        raise ValueError("each input and output is a string or a list of lines (strings or numbers), not nested lists")
    return "\n".join(map(str, lines))


class VerifierMetadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    unit_tests: UnitTests
    difficulty: Any = None

    @field_validator("unit_tests", mode="before")
    @classmethod
    def _decode(cls, value: Any) -> Any:
        """A JSON string of the tests is parsed as the request body is (orjson: UTF-8 only, no lone surrogates),
        after checking its nesting, so no string can make the parser recurse too deep."""
        if not isinstance(value, str):
            return value
        if json_nests_deeper(value):
            raise ValueError(f"the unit_tests JSON string nests deeper than {MAX_JSON_DEPTH} levels; "
                             "give {inputs: [str], outputs: [str], fn_name} as an object or a JSON string of one")
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"the unit_tests string is not valid JSON: {exc}") from None


class CodeGenRequest(VerifyRequest):
    """A row to grade."""

    verifier_metadata: VerifierMetadata


class CodeGenResponse(VerifyResponse):
    """The graded row."""

    verdict: str
    failed_test: int | None = None
    tests_passed: int = 0
    tests_total: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    extracted_model_output: str = ""
    extracted_model_code: str | None = None
    result: list[bool | int] = Field(default_factory=list)
    unit_tests_time_taken: float = 0.0
    reasoning_format_violation_rate: float = 0.0
    difficulty: Any = None


class CodeGenServer(SandboxedServer):
    """Grades programs by running them in the sandbox."""

    config: CodeGenConfig
    ray_resources_default = {"num_cpus": 2}  # Ray placement: grading fans out many sandbox calls per rollout
    reverify_mode = "stateless"
    reward_libraries = ()
    env_name = "code_gen"

    async def verify(self, body: CodeGenRequest) -> CodeGenResponse:
        text = body.response.output_text
        tests = body.verifier_metadata.unit_tests
        fields: dict[str, Any] = {"extracted_model_output": text, "tests_total": len(tests.inputs),
                                  "difficulty": body.verifier_metadata.difficulty}
        code = answers.last_fenced_block(text) if text.strip() else None
        if leaks_think_tags(text, _reasoning_text(body.response)):
            penalty = self.config.reasoning_format_penalty
            return CodeGenResponse.echo(body, reward=penalty, verdict="think_tag_leak", extracted_model_code=code,
                                        reasoning_format_violation_rate=1.0, **fields)
        if code is None or not code.strip():
            verdict = "empty" if not text.strip() else "no_code"
            return CodeGenResponse.echo(body, reward=0.0, verdict=verdict, extracted_model_code=code, **fields)
        graded = await self._run_tests(code, tests)
        return CodeGenResponse.echo(
            body, reward=graded.reward, verdict=graded.verdict, failed_test=graded.failed_test,
            tests_passed=sum(result is True for result in graded.results), metadata=graded.detail,
            extracted_model_code=code, result=graded.results, unit_tests_time_taken=graded.time_s, **fields,
        )  # fmt: skip

    async def _run_tests(self, code: str, tests: UnitTests) -> Grade:
        call_based = tests.fn_name is not None
        program = call_program(code, tests.fn_name) if call_based else code
        cases = list(zip(tests.inputs, tests.outputs, strict=True))
        longest = max(len(output.encode()) for output in tests.outputs)
        options = {"prelude": prelude_for(code), "stop_on_failure": True, "memory_mb": self.config.memory_mb,
                   "timeout_s": self.config.unit_test_timeout_secs,
                   "max_output_bytes": max(1 << 16, 2 * longest + 4096)}
        async with self.slots:
            # The first test alone first: most wrong programs fail it, and then the rest need not run at all.
            results = await self._run_cases(program, cases[:1], options)
            if grade(results, tests.outputs[:1], call_based, 1).reward != 1.0:
                return grade(results, tests.outputs, call_based, len(cases))
            # The rest, with the grader's canaries among them (a program that passes needs them; see the docstring).
            canaries = case_canaries(cases, len(cases) - 1, lambda printed, expected: outputs_agree(
                printed, expected, call_based), json.dumps if call_based else str)
            rest = await self._run_cases(program, canaries.insert(cases[1:], make=lambda case: case), options)
        real, _, _ = canaries.split(rest)
        graded = grade(results + real, tests.outputs, call_based, len(cases))
        forged = canaries.tampered(rest, lambda result, expected: passes(result, expected, call_based))
        if graded.reward == 1.0 and forged:
            return Grade(0.0, "tests_tampered", graded.results, None, {"reason": forged}, graded.time_s)
        return graded

    async def _run_cases(self, program: str, cases: list[tuple[str, str]], options: dict[str, Any]) -> list[RunResult]:
        """Run `program` on `(input, expected)` cases: the one place cases become a sandbox request, and only
        their inputs do (expected outputs never enter the sandbox; `grade()` compares outside it)."""
        results = await self.sandbox.run_batch(program, [{"stdin": stdin} for stdin, _ in cases], "python", **options)
        if results and results[0].message and results[0].message.startswith("could not set up"):
            raise SandboxError(f"the sandbox could not set the tests up: {results[0].message}")
        return results


def _reasoning_text(response: Response) -> str:
    return "".join(
        getattr(part, "text", "") or ""
        for item in response.output
        if item.type == "reasoning"
        for part in (getattr(item, "summary", None) or [])
    )
