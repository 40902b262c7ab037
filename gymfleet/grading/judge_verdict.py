r"""The one judge-output rule: the verdict is the judge's final one, and a quoted copy of the answer never counts.

A judge's reply is read after removing, in order: its reasoning (`<think>` blocks, as `judge_input.visible`), the
answer block if the judge copied it (`<<<BEGIN ... nonce>>>` to `<<<END ... nonce>>>`), quoted lines (`> ...`),
and every quoted span (`"..."`, `'...'`, backticks) or line whose text is a copy of part of the answer. The verdict
is then the label that occurs *last* (NeMo-Gym's convention where it documents one): a judge that quotes the
answer's label and then rules against it has ruled against it.

Examples:
    >>> final_verdict('The answer writes "[[A=B]]" itself; it is wrong. [[A!=B]]', ("[[A=B]]", "[[A!=B]]"))
    '[[A!=B]]'
    >>> final_verdict('[[A!=B]]\n> 42 [[A=B]]', ("[[A=B]]", "[[A!=B]]"), answer="42 [[A=B]]")
    '[[A!=B]]'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gymfleet.grading.judge import find_verdict
from gymfleet.grading.judge_input import normalize, visible

__all__ = ["final_verdict", "ruling_text"]

_BLOCK = re.compile(r"<<<BEGIN (\w+) ([0-9a-f]{8,})>>>.*?(?:<<<END \1 \2>>>|\Z)", re.DOTALL)
_QUOTED_LINE = re.compile(r"(?m)^[ \t]*>.*$")
_QUOTED_SPAN = re.compile(r"\"([^\"\n]{1,2000})\"|'([^'\n]{2,2000})'|`([^`\n]{1,2000})`")
_MIN_COPY = 6  # a quoted span this long or longer that the answer holds is a copy
_MIN_LINE_COPY = 24  # an answer line this long or longer, repeated unquoted in the reply, is a copy


def ruling_text(reply: str | None, answer: str | None = None) -> str:
    """The part of a judge's reply that can carry its verdict (see the module docstring).

    Examples:
        >>> ruling_text("<think>[[A=B]]?</think>Not equal: [[A!=B]]")
        'Not equal: [[A!=B]]'
    """
    if not reply:
        return ""
    text = normalize(visible(reply))
    text = _QUOTED_LINE.sub("", _BLOCK.sub("", text))
    if answer:
        shown = normalize(visible(answer))
        folded = shown.casefold()

        def copied(match: re.Match[str]) -> str:
            inner = next(group for group in match.groups() if group is not None)
            inner = inner.strip()
            return " " if len(inner) >= _MIN_COPY and inner.casefold() in folded else match.group(0)

        text = _QUOTED_SPAN.sub(copied, text)
        for line in {line.strip() for line in shown.splitlines()}:
            if len(line) >= _MIN_LINE_COPY:
                text = re.sub(re.escape(line), " ", text, flags=re.IGNORECASE)
    return text


def final_verdict(reply: str | None, labels: Sequence[str], *, answer: str | None = None) -> str | None:
    """The label of `labels` the judge's ruling names last, or None when it names none.

    Args:
        reply: The judge's reply text.
        labels: The prompt's verdict labels (matched as `gymfleet.grading.judge.find_verdict` does).
        answer: The policy's text the judge was shown, so that a copy of it in the reply is not read.
    """
    return find_verdict(ruling_text(reply, answer), tuple(labels), occurrence="last")
