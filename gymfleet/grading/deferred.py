"""Imports put off until first use, for libraries whose own import pulls in heavy modules their grading never runs.

Every server of a fleet is forked from a zygote that imports all the fleet's environments first
(`gymfleet.fleet.zygote_main`), so whatever an environment's libraries import at module level is paid before the
fleet is ready, and held in memory, whether or not a row ever needs it. Two of the Nano 3 environments' libraries
import a large stack they only use for things no grader does:

- reasoning-gym imports `cellpylib` (for generating `game_of_life` boards), and `cellpylib` imports
  `matplotlib.pyplot`: about half of reasoning-gym's import time;
- NLTK's package import reaches `from scipy.stats import fisher_exact` (a collocation measure), and `scipy.stats`
  costs more than the rest of NLTK together; the instruction checkers only tokenize.

`defer_module(name)` makes a whole module lazy (its code runs when one of its names is first read);
`deferred_names(name)` makes the names a block imports from `name` stand-ins that import it when first used. Either
way the deferred code runs unchanged the moment something uses it, so results are the same; only the time and memory
move to the (rare) first use.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import threading
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["defer_module", "deferred_names"]


def defer_module(name: str) -> bool:
    """Put a deferred `name` (a top-level module) in `sys.modules`: `import name` then binds it at no cost, and the
    module's code runs, into that same module object, on the first read of an attribute it does not have yet (its
    `__spec__`, `__path__`, ... are there from the start, so further `import name` statements do not load it, unlike
    `importlib.util.LazyLoader`'s modules on Python 3.11). Returns whether it deferred it: not when `name` is
    imported already, not installed, or not loaded by a loader that can execute a module in place.
    """
    if name in sys.modules or "." in name:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
        return False
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _DeferredModule
    sys.modules[name] = module
    return True


_LOADING = threading.RLock()


class _DeferredModule(types.ModuleType):
    """A module whose code has not run yet (`defer_module`): the first missing attribute runs it."""

    def __getattr__(self, attribute: str) -> Any:
        with _LOADING:  # a second thread waits for the first one's load, then reads the loaded module
            if type(self) is _DeferredModule:
                self.__class__ = types.ModuleType  # from here on a plain module (a circular import sees it partial)
                try:
                    self.__spec__.loader.exec_module(self)
                except BaseException:
                    if sys.modules.get(self.__name__) is self:
                        del sys.modules[self.__name__]  # as a failed import leaves it: the next import tries again
                    raise
        return getattr(self, attribute)


class _StandIn:
    """What `from <module> import <attribute>` bound while `deferred_names` held `<module>`: imports the module on
    first use (a call or an attribute read) and forwards to the real object from then on."""

    __slots__ = ("_module", "_attribute", "_target")

    def __init__(self, module: str, attribute: str):
        self._module, self._attribute, self._target = module, attribute, None

    def _resolve(self) -> Any:
        if self._target is None:
            self._target = getattr(importlib.import_module(self._module), self._attribute)
        return self._target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._resolve()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._resolve(), name)

    def __repr__(self) -> str:
        return f"<{self._module}.{self._attribute}, imported on first use>"


class _Placeholder(types.ModuleType):
    """`sys.modules[name]` while `deferred_names(name)` runs: hands out stand-ins, and is no package (a submodule
    import under it fails as if the module were missing)."""

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _StandIn(self.__name__, attribute)


@contextlib.contextmanager
def deferred_names(name: str) -> Iterator[None]:
    """While the block runs, `from name import x` binds a stand-in for `x` that imports `name` when `x` is first
    called or read; `name` itself is not imported. No-op when `name` is imported already. Only for names used as
    functions or through their attributes (a stand-in is not the object: `isinstance` and identity differ)."""
    if name in sys.modules:
        yield
        return
    placeholder = _Placeholder(name)
    sys.modules[name] = placeholder
    try:
        yield
    finally:
        if sys.modules.get(name) is placeholder:
            del sys.modules[name]
