"""What a failed proof attempt tells the model for its next try: the compiler's errors shown in the code, and the
correction prompt a multi-turn agent sends (NeMo-Gym's `error_feedback` / `correction_prompt` fields)."""

from __future__ import annotations

import re

MAX_ERRORS = 8
MAX_RAW_OUTPUT = 2000
CONTEXT_LINES = 4
TIMEOUT_FEEDBACK = "Compiling the proof took longer than the time limit. Simplify it or use cheaper tactics."
NO_OUTPUT_FEEDBACK = "The proof did not compile, and the compiler printed nothing about why."

CORRECTION_PROMPT = """The Lean 4 proof attempt below does not compile.

{proof_attempt}

The Lean compiler reported:

{error_message}

Study the errors, then write a corrected proof. Answer with one complete Lean 4 code block (```lean4 ... ```) that \
restates the theorem and proves it, and nothing outside the block."""
"""Our wording of the correction request (`{proof_attempt}`, `{error_message}`); config `correction_prompt_template`
replaces it."""

_ERROR = re.compile(r"^[^\n]*?\.lean:(\d+):(\d+): error:(.*?)(?=^[^\n]*?\.lean:\d+:\d+: |\Z)",
                    re.DOTALL | re.MULTILINE)


def compiler_errors(output: str) -> list[tuple[int, int, str]]:
    """The `(line, column, message)` of each `<file>.lean:L:C: error: ...` in compiler output (1-based line).

    Examples:
        >>> compiler_errors("/p/a.lean:3:4: error: bad\\n  more\\n/p/a.lean:5:0: warning: w\\n")
        [(3, 4, 'bad\\n  more')]
    """
    return [(int(line), int(column), message.strip()) for line, column, message in _ERROR.findall(output)]


def error_feedback(process_status: str, stdout: str, stderr: str, program: str) -> str:
    """The feedback for a failed attempt: a timeout note; else each error (at most `MAX_ERRORS`) shown in the lines
    around it, the erring span marked `<error>...</error>`; else the raw compiler output (cut at `MAX_RAW_OUTPUT`)."""
    if process_status == "timeout":
        return TIMEOUT_FEEDBACK
    errors = compiler_errors(stderr) or compiler_errors(stdout)
    lines = program.split("\n")
    shown = [(line, column, message) for line, column, message in errors if 0 < line <= len(lines)]
    if shown:
        parts = [_show(number, lines, line, column, message) for number, (line, column, message)
                 in enumerate(shown[:MAX_ERRORS], 1)]
        if len(shown) > MAX_ERRORS:
            parts.append(f"\n... [{len(shown) - MAX_ERRORS} more errors not shown] ...\n")
        return "".join(parts)
    raw = (stdout + "\n" + stderr).strip()
    if not raw:
        return NO_OUTPUT_FEEDBACK
    if len(raw) > MAX_RAW_OUTPUT:
        raw = raw[:MAX_RAW_OUTPUT] + "\n... [Truncated]"
    return f"Compiler output:\n{raw}"


def _show(number: int, lines: list[str], line: int, column: int, message: str) -> str:
    index = line - 1
    text = lines[index]
    context = lines[max(0, index - CONTEXT_LINES):index]
    marked = text[:column] + "<error>" + text[column:] + "</error>"
    after = lines[index + 1:index + 2]
    code = "\n".join([*context, marked, *after])
    return f"\nError {number}:\n```lean4\n{code}\n```\nMessage: {message}\n"


def correction_prompt(proof_attempt: str, error_message: str, template: str | None = None) -> str:
    """The request for a corrected proof (`template`: `{proof_attempt}` and `{error_message}` placeholders)."""
    return (template or CORRECTION_PROMPT).format(proof_attempt=proof_attempt, error_message=error_message)
