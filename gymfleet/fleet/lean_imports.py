"""Importing the serving stack for less CPU, in the processes that import it before a fleet is ready: the zygote
(`gymfleet.fleet.zygote_main`, whose imports are the serial part of a fleet's start) and `ng_run` (whose head server
imports FastAPI while the zygote imports: on two cores they share the CPU).

- `gc_paused`: no cyclic garbage collection during the imports (they allocate millions of objects and hardly any
  garbage; the collector's passes over them were a sixth to a quarter of their CPU).
- `import_fastapi`: FastAPI imported with the pydantic models it defines built on first use instead of at import
  (`model_builds_deferred`). Those are its OpenAPI document models (`fastapi.openapi.models`, 36 classes): only
  `/openapi.json` and `/docs` validate with them, and building their schemas was about a tenth of a CPU second of every
  such process's start. Nothing else changes: a deferred model builds itself, as it would have at import, the first
  time it is used.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["gc_paused", "import_fastapi", "model_builds_deferred"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside the block (as it was after it). Imports allocate millions of objects
    and hardly any garbage, and the collector's passes over them were a sixth to a quarter of the shared stack's
    import time (measured: 1.23-1.28 s of CPU with it, 0.92-1.14 s without); the zygote collects once when done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _pydantic_config_defaults() -> dict[str, Any] | None:
    """pydantic's table of model-config defaults (private: `pydantic._internal._config.config_defaults`), or None
    where this pydantic has none with a `defer_build` entry (then nothing is deferred)."""
    try:
        from pydantic._internal import _config
    except ImportError:
        return None
    defaults = getattr(_config, "config_defaults", None)
    return defaults if isinstance(defaults, dict) and defaults.get("defer_build") is False else None


@contextlib.contextmanager
def model_builds_deferred() -> Iterator[None]:
    """Pydantic models whose classes are created inside the block (by any thread, and that do not set `defer_build`
    themselves) build their validators on first use, not at class creation. Meant for imports of modules whose models
    nothing uses on the way to serving; a no-op where pydantic has no such default to set (logged at DEBUG)."""
    defaults = _pydantic_config_defaults()
    if defaults is None:
        log.debug("this pydantic has no defer_build default to set: models are built at import")
        yield
        return
    defaults["defer_build"] = True
    try:
        yield
    finally:
        defaults["defer_build"] = False


def import_fastapi() -> None:
    """Import FastAPI (and so pydantic and Starlette) with its own models' builds deferred and the collector paused;
    nothing when it is imported already."""
    if "fastapi" in sys.modules:
        return
    with gc_paused(), model_builds_deferred():
        importlib.import_module("fastapi")
