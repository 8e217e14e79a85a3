"""Sizing without the cyclic garbage collector's pauses.

A first estimate builds and walks graphs of thousands of small objects (core.ggml tensors) and
keeps some of them (the compiled structures' graphs). Every 700 new objects CPython's cyclic
collector runs, and as the kept ones pile up a full collection traverses every object of the
process: on a first fit search of a full-size hybrid model that was 5-20% of the time, once 20
ms in one pause. The sizing makes no reference cycles (tests/core/test_gcpause.py: a first
estimate and both searches on each kind of model leave no cyclic garbage), so nothing it frees
waits for the collector: reference counting frees it as before. `paused()` turns the
collector off for the duration of a sizing call and back on when the last concurrent one
ends (only if it was on when the first began).

Turned back on, the collector would run at the next allocation over every object made
meanwhile (its youngest generation counts them: ~31,000 kept by a hybrid model's first fit
search, 2.5-5 ms, ~10% of the call), only to move the ones that live (the kept graphs) one
generation up, and again from there. So the last call out moves everything tracked to the
oldest generation (gc.freeze then gc.unfreeze: two list splices, no traversal), where the
next full collection sees it as it sees everything else: nothing is exempt from collection,
garbage that was young waits for a full collection instead of a young one. Left alone where
something else froze objects (gc.get_freeze_count): unfreezing would hand its objects back.
"""

from __future__ import annotations

import functools
import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

__all__ = ["paused", "while_paused"]

_LOCK = threading.Lock()
_depth = 0  # sizing calls running now, in any thread
_was_enabled = False  # the collector's state when the first of them began

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def paused() -> Iterator[None]:
    """Within: the cyclic collector is off (nested and concurrent uses count)."""
    global _depth, _was_enabled  # noqa: PLW0603 - one process-wide switch
    with _LOCK:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                if not gc.get_freeze_count():
                    gc.freeze()  # every generation to the permanent one, the count reset
                    gc.unfreeze()  # and back, as the oldest
                gc.enable()


def while_paused(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run within paused()."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused():
            return fn(*args, **kwargs)

    return wrapper
