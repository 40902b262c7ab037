r"""LaTeX in answers: the content of the last `\boxed{...}` and text with `\text{...}`-style wrappers removed.

Every helper is a pure function of its arguments: no I/O, no state. Extractors return `str | None`, where None means
"nothing found" and is never replaced by `""`. All of them run in time linear in the input (no regex here can
backtrack catastrophically), so a 1 MB completion cannot stall a server.

Contents:
    - `last_boxed`: content of the last `\boxed{...}` / `\fbox{...}`.
    - `unwrap_latex_text`: drop `\text{...}`-style wrappers.
"""

from __future__ import annotations

import re

__all__ = [
    "last_boxed",
    "unwrap_latex_text",
]

# ---------------------------------------------------------------------------------------------- boxes

# Where a box starts: `\boxed{` / `\fbox {` (group 1 is the brace) or `\boxed 5` (group 2 is the bare token).
# Matches "\boxed{B}", "\fbox {B}", "\boxed 5"; does not match "\boxedB" or "\boxed $".
BOX_START = re.compile(r"\\(?:boxed|fbox)(?:\s*(\{)|\s+([^\s{}$\\]+))")
# A brace that counts towards nesting. `\{`, `\}` and `\\` match too, so escaped braces are consumed and skipped.
# Matches "{" and "}"; in "\{1,2\}" it matches "\{" and "\}", which do not count.
BRACE_TOKEN = re.compile(r"\\[\\{}]|[{}]")


def _closing_brace(text: str, open_at: int, end: int) -> int | None:
    depth = 0
    for match in BRACE_TOKEN.finditer(text, open_at, end):
        token = match.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return match.start()
    return None


def last_boxed(text: str) -> str | None:
    r"""Return the content of the last `\boxed{...}` or `\fbox{...}` in `text`.

    Rules:
        - Braces are counted, so nested groups such as `\boxed{\frac{1}{2}}` come back whole; escaped braces
          (`\{`, `\}`) do not count.
        - "Last" means the box that starts last; in `\boxed{\boxed{A}}` that is the inner one.
        - A box that never closes (an output cut off mid-answer) is ignored and the box before it is used.
        - `\boxed 5` (no braces, as TeX allows) yields the token after the space, less trailing sentence
          punctuation (`\boxed 5.` gives `5`).
        - The content is stripped; an empty last box gives None.

    Args:
        text: A model output.

    Returns:
        The stripped content of the last complete box, or None if there is none or it is empty.

    Examples:
        >>> last_boxed(r"First guess \boxed{A}. On reflection the answer is \boxed{C}.")
        'C'
        >>> last_boxed(r"\boxed{\frac{1}{2}}")
        '\\frac{1}{2}'
        >>> last_boxed(r"\boxed{\text{B}}")
        '\\text{B}'
        >>> last_boxed(r"so \boxed 5$")
        '5'
        >>> last_boxed(r"so the answer is \boxed 2.5.")
        '2.5'
        >>> last_boxed(r"\boxed{B} then cut off: \boxed{C") # the unclosed box is ignored
        'B'
        >>> last_boxed("no box here") is None
        True
    """
    # A box whose brace never closes bounds the scan of every earlier box: an earlier box that has not closed by
    # then cannot close later, since everything after the unclosed brace stays nested inside it. This keeps the
    # work linear even for "\boxed{" repeated a million times.
    end = len(text)
    next_boxed, next_fbox = text.rfind("\\boxed"), text.rfind("\\fbox")
    while next_boxed >= 0 or next_fbox >= 0:
        if next_boxed > next_fbox:
            start, next_boxed = next_boxed, text.rfind("\\boxed", 0, next_boxed)
        else:
            start, next_fbox = next_fbox, text.rfind("\\fbox", 0, next_fbox)
        match = BOX_START.match(text, start)
        if match is None:
            continue
        if match.group(2) is not None:
            return match.group(2).rstrip(".,;:!?") or None
        close = _closing_brace(text, match.start(1), end)
        if close is None:
            end = match.start(1)
            continue
        return text[match.end(1) : close].strip() or None
    return None


# ---------------------------------------------------------------------------------------------- text wrappers

# A LaTeX text wrapper whose argument holds no braces; it is replaced by its argument (innermost first).
# Matches "\text{B}", "\textbf{ B) PCR }"; does not match "\texttt{B}" or "\text{a{b}}" as a whole.
LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf)\s*\{([^{}]*)\}")
_MAX_WRAPPER_DEPTH = 8  # deeper nesting is not an answer; the bound keeps unwrapping linear

def unwrap_latex_text(text: str) -> str:
    r"""Replace `\text{...}`, `\textbf{...}`, `\textit{...}`, `\mathrm{...}` and `\mathbf{...}` by their argument.

    Wrappers are removed innermost first, up to 8 levels deep, wherever they appear in `text`.

    Args:
        text: Usually the content of a box.

    Returns:
        The unwrapped text, stripped.

    Examples:
        >>> unwrap_latex_text(r"\text{\textbf{B}}")
        'B'
        >>> unwrap_latex_text(r"\text{B}) PCR")
        'B) PCR'
        >>> unwrap_latex_text(r"\frac{1}{2}")
        '\\frac{1}{2}'
    """
    for _ in range(_MAX_WRAPPER_DEPTH):
        text, count = LATEX_TEXT.subn(lambda match: match.group(1), text)
        if not count:
            break
    return text.strip()
