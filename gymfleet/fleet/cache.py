"""Where gymfleet caches what it downloads or builds once (NeMo-Gym's wheel, server folders' own environments)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$GYMFLEET_CACHE_DIR`, else `$XDG_CACHE_HOME/gymfleet`, else `~/.cache/gymfleet`."""
    if os.environ.get("GYMFLEET_CACHE_DIR"):
        return Path(os.environ["GYMFLEET_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gymfleet"
