"""Progress for work that takes more than a few seconds: a tqdm bar on a terminal, periodic plain lines elsewhere.

A bar redrawn with carriage returns turns a log file or a CI console into one unreadable line per refresh, so when
the stream is not a terminal `Progress` prints one line every `every_s` seconds instead, plus a last one when the
work ends:

    Rollouts: 120/500 (24%), 30 s elapsed, mean_reward=0.412

Used by `ng_collect_rollouts` (rollouts), `ng_prepare_data` (reading large datasets) and `ng_run` (servers
starting, model endpoints answering).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import IO, Any

from tqdm import tqdm

__all__ = ["Progress", "is_terminal"]


def is_terminal(stream: IO[str]) -> bool:
    """Whether `stream` is an interactive terminal (False for files, pipes and anything without `isatty`)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or fake streams
        return False


@dataclass(eq=False)
class Progress:
    """Counts `done` out of `total` units of work and shows it (see the module docstring).

    Args:
        total: units of work expected (None: unknown).
        desc: what is being done ("Rollouts").
        unit: what one unit is ("rollout"); `"B"` shows bytes scaled to kB/MB.
        file: where to show it (default stderr).
        every_s: seconds between plain lines when `file` is not a terminal.
        enabled: False shows nothing at all.
        terminal: force the terminal (bar) or plain-line behaviour (default: `file.isatty()`).
    """

    total: float | None
    desc: str
    _: KW_ONLY
    unit: str = "it"
    file: IO[str] | None = None
    every_s: float = 10.0
    enabled: bool = True
    terminal: bool | None = None
    done: float = field(default=0.0, init=False)
    postfix: str = field(default="", init=False)
    started: float = field(default_factory=time.monotonic, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _closed: bool = field(default=False, init=False)
    _bar: tqdm | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.file = self.file or sys.stderr
        self._last_line = self.started
        self.terminal = is_terminal(self.file) if self.terminal is None else self.terminal
        if self.enabled and self.terminal:
            scale = self.unit == "B"
            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, file=self.file, unit_scale=scale,
                             unit_divisor=1024 if scale else 1000, dynamic_ncols=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def update(self, n: float = 1) -> None:
        """Count `n` more units done."""
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
        self.tick()

    def set_postfix(self, **values: Any) -> None:
        """Show `key=value` pairs after the count (e.g. `mean_reward="0.412"`)."""
        text = ", ".join(f"{key}={value}" for key, value in values.items())
        with self._lock:
            self.postfix = text
            if self._bar is not None:
                self._bar.set_postfix_str(text, refresh=False)

    def set_status(self, text: str) -> None:
        """Free text after the count (what is still pending, say)."""
        with self._lock:
            self.postfix = text
            if self._bar is not None:
                self._bar.set_postfix_str(text, refresh=False)

    def set_description(self, desc: str) -> None:
        with self._lock:
            self.desc = desc
            if self._bar is not None:
                self._bar.set_description(desc, refresh=False)

    def tick(self) -> None:
        """Print a plain line if one is due (call it now and then while nothing completes); a bar redraws itself."""
        if not self.enabled or self._bar is not None:
            return
        now = time.monotonic()
        if now - self._last_line >= self.every_s:
            self._last_line = now
            self._print(self.line())

    def write(self, text: str) -> None:
        """Print a line of text without breaking the bar."""
        if self._bar is not None:
            self._bar.write(text, file=self.file)
        else:
            self._print(text)

    def line(self) -> str:
        """The plain progress line: `desc: done/total (pct), N s elapsed, postfix`."""
        with self._lock:
            done, postfix = self.done, self.postfix
        count = f"{_amount(done, self.unit)}"
        if self.total:
            count += f"/{_amount(self.total, self.unit)} ({100 * done / self.total:.0f}%)"
        text = f"{self.desc}: {count}, {self.elapsed_s:.0f} s elapsed"
        return f"{text}, {postfix}" if postfix else text

    def close(self) -> None:
        """End the bar, or print the last plain line. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            self._print(self.line())

    def _print(self, text: str) -> None:
        print(text, file=self.file, flush=True)


def _amount(value: float, unit: str) -> str:
    if unit == "B":
        for scale, name in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "kB")):
            if value >= scale:
                return f"{value / scale:.1f} {name}"
        return f"{value:.0f} B"
    return f"{value:g}"
