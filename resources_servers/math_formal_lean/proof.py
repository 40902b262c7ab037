"""Proof assembly for math_formal_lean: the model's answer -> the Lean program the checker compiles, and the verdict.

    code = extract_code(text)                          # the last ```lean4 / ```lean3 / ```lean / ``` block
    body = proof_body(code)                            # what follows the first theorem/example header's `:=`
    program = header + formal_statement + body         # the row's header and statement, never the model's
    forbidden_constructs(body)                         # sorry/admit/axiom/... outside comments and strings
    proof_status(answer)                               # "completed" | "has_sorry" | "failed" | "timeout"

Extraction and assembly follow NeMo-Gym 0.7.0's `math_formal_lean` (and NeMo-Skills' proof utilities): the same
program text for the same answer. `forbidden_constructs` is ours: NeMo-Gym trusts the compiler's `sorry` warning
alone, which a compile-time program inside the proof (`run_tac`, `by_elab`: add an axiom, close the goal with it)
never prints.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

LANGUAGES = ("lean4", "lean3", "lean", "")
"""Fence languages tried in order; the first that has a block wins ("" is any fence)."""
_OUTER_FENCES = re.compile(r"^\s*```(?:lean4|lean3|lean)?\s*|\s*```\s*$")
_HEADER_START = re.compile(r"^\s*(theorem|example)\b")
_SORRY_OUTPUT = re.compile(r"\bsorry\b")

FORBIDDEN_NAMES = frozenset({
    "sorry", "admit",            # tactics that close any goal (Lean warns; the warning is checked too)
    "sorryAx",                   # their axiom, by name
    "mkSorry", "mkLabeledSorry",  # building it from meta code
    "axiom",                     # a new axiom proves anything and compiles cleanly
    "unsafe", "implemented_by", "extern",  # code the kernel does not check (`native_decide` trusts it)
    "run_tac", "by_elab", "run_cmd", "run_elab", "run_meta",  # compile-time programs: can add an axiom, no warning
    "elab", "elab_rules", "macro", "macro_rules",  # new syntax whose meaning is a program
    "skipKernelTC",              # `set_option debug.skipKernelTC true`: no kernel check at all
})  # fmt: skip
"""Names (as a whole identifier or one dotted part of one) a proof may not use outside comments and strings."""
FORBIDDEN_COMMANDS = frozenset({"#eval", "#exec"})
"""Commands that run code while the file compiles (in the checker's process)."""

_INVISIBLE = dict.fromkeys(map(ord, "\u00ad\u200b\u200c\u200d\u2060\ufeff"))
_CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "ѕ": "s", "у": "y", "х": "x", "і": "i", "ј": "j",
    "ԁ": "d", "ɑ": "a", "ο": "o", "ν": "v", "τ": "t", "ι": "i", "κ": "k", "ѵ": "v", "ԛ": "q", "һ": "h",
    "ʀ": "r", "ꭇ": "r", "ᴦ": "r", "ⅿ": "m", "ı": "i",
})  # fmt: skip
"""Letters from other scripts drawn like Latin ones (Cyrillic, Greek, IPA): `ѕorry` reads as `sorry`."""
_IDENT_PART = re.compile(r"«[^»]*»|[^\W\d][\w'!?]*")
_COMMAND = re.compile(r"#[A-Za-z_]\w*")
_CHAR_LITERAL = re.compile(r"'(?:[^\\'\n]|\\[\\\"'nrt]|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4})'")
"""A Lean char literal (`'a'`, `'\\n'`, `'\\x41'`, `'\\u03bb'`); any other quote is code."""


def extract_code(text: str, mode: str = "last") -> str:
    """The Lean code in a model's answer: the `mode` ("last" or "first") fenced block of the first language in
    `LANGUAGES` that has one, stripped; with no fenced block, the text with a leading/trailing fence removed.

    Examples:
        >>> extract_code("plan\\n```lean4\\ntheorem t : 1 = 1 := by rfl\\n```")
        'theorem t : 1 = 1 := by rfl'
        >>> extract_code("  norm_num")
        'norm_num'
    """
    for language in LANGUAGES:
        blocks = re.findall(rf"```{language}\s*\n?(.*?)\n?```", text, re.DOTALL)
        if blocks:
            return (blocks[0] if mode == "first" else blocks[-1]).strip()
    return _OUTER_FENCES.sub("", text).strip()


def proof_body(code: str) -> str:
    """The proof of the first `theorem`/`example` in `code`: the text after the `:=` of its header (which may span
    lines), a leading `by` removed; `code` itself (stripped) when it has no such header.

    Examples:
        >>> proof_body("theorem t (n : Nat) :\\n    n = n := by\\n  rfl")
        '  rfl'
        >>> proof_body("theorem t : True := by trivial")
        'trivial'
        >>> proof_body("  simp")
        'simp'
    """
    lines = code.strip().splitlines()
    start = next((index for index, line in enumerate(lines) if _HEADER_START.match(line)), None)
    if start is None:
        return code.strip()
    end = next((index for index in range(start, len(lines)) if ":=" in lines[index]), None)
    if end is None:
        return code.strip()
    rest = lines[end].split(":=", 1)[1].strip()
    proof = ([rest] if rest else []) + lines[end + 1:]
    if proof:
        first = proof[0].lstrip()
        if first == "by":
            proof = proof[1:]
        elif first.startswith("by "):
            proof[0] = first[3:]
    return "\n".join(proof).rstrip()


def assemble(header: str, formal_statement: str, body: str) -> str:
    """The program the checker compiles: the row's header and statement, then the model's proof body."""
    return header + formal_statement + body


def forbidden_constructs(code: str) -> list[str]:
    """The forbidden names and commands `code` uses, in order of first use, each once.

    Comments (`--`, nested `/- -/`) and string/char literals are skipped, as Lean skips them, except the `{...}`
    parts of strings, which Lean's interpolated strings (`s!"..."`, `m!"..."`, `throwError "..."`) evaluate as code.
    Each identifier is compared part by part (`_root_.sorryAx`, `«sorryAx»`) after removing invisible characters,
    NFKC folding (full-width letters) and mapping look-alike letters of other scripts: Lean would read most such
    spellings as unknown names, but no proof needs them, so they are refused rather than compiled.

    Examples:
        >>> forbidden_constructs("-- sorry, no sorry here\\nsimp [foo] -- \\"sorry\\"")
        []
        >>> forbidden_constructs("exact «sorryAx» _ true")
        ['sorryAx']
        >>> forbidden_constructs('exact (s!"{sorry}")')
        ['sorry']
    """
    found: dict[str, None] = {}
    for token in _tokens(code):
        if token.startswith("#"):
            if token in FORBIDDEN_COMMANDS:
                found[token] = None
            continue
        for part in _IDENT_PART.findall(_skeleton(token)):
            name = part.strip("«»")
            if name in FORBIDDEN_NAMES:
                found[name] = None
    return list(found)


def _skeleton(name: str) -> str:
    return unicodedata.normalize("NFKC", name.translate(_INVISIBLE)).translate(_CONFUSABLES)


def _tokens(code: str) -> Iterator[str]:
    """Identifier-like runs (dotted names, `«...»` parts) and `#commands` of `code` outside comments and literals.

    Iterative, with an explicit stack of string / interpolation levels: no nesting depth can exhaust recursion."""
    braces: list[int] = []  # one entry per open interpolation `{` of a string: its inner brace depth
    in_string = False
    index, size = 0, len(code)
    while index < size:
        char = code[index]
        if in_string:
            if char == "\\":
                index += 2
                continue
            if char == "{":
                braces.append(0)
                in_string = False
            elif char == '"':  # back to code: the top level's, or the open interpolation's
                in_string = False
            index += 1
            continue
        if code.startswith("--", index):
            newline = code.find("\n", index)
            index = size if newline < 0 else newline
        elif code.startswith("/-", index):
            index = _skip_block_comment(code, index)
        elif char == '"':
            in_string = True
            index += 1
        elif char == "r" and _raw_string_start(code, index):
            index = _skip_raw_string(code, index)
        elif char == "'":  # not after an identifier: its loop below takes trailing primes (`h'`)
            match = _CHAR_LITERAL.match(code, index)
            index = match.end() if match else index + 1
        elif char == "#" and (match := _COMMAND.match(code, index)):
            yield match.group()
            index = match.end()
        elif char == "«" or _ident_char(char):
            start = index
            while index < size and (code[index] in ".«" or _ident_char(code[index])):
                if code[index] == "«":
                    close = code.find("»", index)
                    index = size if close < 0 else close + 1
                else:
                    index += 1
            yield code[start:index]
        elif braces and char == "{":
            braces[-1] += 1
            index += 1
        elif braces and char == "}":
            if braces[-1] == 0:  # the interpolation closed: back inside its string
                braces.pop()
                in_string = True
            else:
                braces[-1] -= 1
            index += 1
        else:
            index += 1


def _ident_char(char: str) -> bool:
    return char.isalnum() or char in "_'!?" or unicodedata.category(char) in ("Cf", "Pc")  # Pc: `＿`, Cf: U+200B


def _skip_block_comment(code: str, index: int) -> int:
    depth, index = 1, index + 2
    while index < len(code) and depth:
        if code.startswith("/-", index):
            depth, index = depth + 1, index + 2
        elif code.startswith("-/", index):
            depth, index = depth - 1, index + 2
        else:
            index += 1
    return index


def _raw_string_start(code: str, index: int) -> bool:
    return re.match(r'r#*"', code[index:index + 300]) is not None


def _skip_raw_string(code: str, index: int) -> int:
    hashes = len(re.match(r"r(#*)", code[index:]).group(1))
    closing = '"' + "#" * hashes
    end = code.find(closing, index + 2 + hashes)
    return len(code) if end < 0 else end + len(closing)


def proof_status(process_status: str, stdout: str, stderr: str) -> str:
    """NeMo-Gym's verdict on a checker answer: `timeout`, `failed` (or whatever non-`completed` status it gave),
    `has_sorry` (a completed compile whose output mentions `sorry`, any case, as a word), else `completed`."""
    if process_status != "completed":
        return process_status
    if _SORRY_OUTPUT.search((stdout + "\n" + stderr).lower()):
        return "has_sorry"
    return "completed"
