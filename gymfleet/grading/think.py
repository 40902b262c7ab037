r"""Reasoning blocks: `strip_think` drops `<think>...</think>` reasoning and returns the visible answer.

A pure function of its argument (no I/O, no state), linear in the input. The tag names are `THINK_OPEN` and
`THINK_CLOSE`; an environment with other tag names (`<thinking>`) reuses the rules with its own tags.
"""

from __future__ import annotations

__all__ = ["THINK_CLOSE", "THINK_OPEN", "strip_think"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def strip_think(text: str) -> str:
    r"""Drop reasoning wrapped in `<think>...</think>` and return the visible answer.

    Rules, applied left to right (tags are matched exactly, lowercase):
        - A complete `<think>...</think>` block is removed.
        - A `</think>` with no opening tag before it (reasoning parsers often leave the opening tag in the prompt)
          means everything before it was reasoning: all text up to and including it is dropped. With several, the
          last one wins.
        - A `<think>` that never closes (output cut off while reasoning) is dropped together with everything after
          it.

    Args:
        text: A model output.

    Returns:
        The remaining text, stripped of surrounding whitespace (possibly empty).

    Examples:
        >>> strip_think("<think>A looks tempting, but...</think>\n\nAnswer: B")
        'Answer: B'
        >>> strip_think("the opening tag was in the prompt...</think> Answer: C")
        'Answer: C'
        >>> strip_think("Answer: D <think>wait, maybe not")
        'Answer: D'
        >>> strip_think("no reasoning tags")
        'no reasoning tags'
    """
    kept: list[str] = []
    pos = 0
    open_at, close_at = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    while True:
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            kept.clear()
            pos = close_at + len(THINK_CLOSE)
            close_at = text.find(THINK_CLOSE, pos)
            continue
        if open_at == -1:
            kept.append(text[pos:])
            break
        kept.append(text[pos:open_at])
        if close_at == -1:
            break
        pos = close_at + len(THINK_CLOSE)
        open_at, close_at = text.find(THINK_OPEN, pos), text.find(THINK_CLOSE, pos)
    return "".join(kept).strip()
