"""core.gcpause: the cyclic collector is off during sizing calls and back as it was after,
and the sizing leaves no cyclic garbage for it (what makes turning it off safe)."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from qmgui.core.fit import Budget, gpus_from_sizes, max_context, offload_for_context
from qmgui.core.footprint import estimate
from qmgui.core.gcpause import paused
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import meta_from_gguf
from qmgui.core.units import MIB
from tests.core.test_sizing_caches import _forget
from tests.synth.factory import PRESETS, write_gguf


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_paused_nests_and_restores_the_collector() -> None:
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer call still runs
    assert gc.isenabled()
    gc.disable()
    with paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # off before: left off


@pytest.mark.usefixtures("collector_on")
def test_the_collector_returns_when_the_last_of_concurrent_calls_ends() -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(5)
    with paused():
        pass
    assert not gc.isenabled()  # the other thread's call has not ended
    release.set()
    t.join(5)
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_an_exception_inside_restores_the_collector() -> None:
    with pytest.raises(RuntimeError), paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


class _Node:
    def __init__(self) -> None:
        self.other: object = self


@pytest.mark.usefixtures("collector_on")
def test_what_a_call_made_is_moved_up_untraversed_and_still_collected() -> None:
    gc.collect()
    with paused():
        kept = [[i] for i in range(5000)]  # what the caches keep
        cycle = _Node()  # garbage no reference count frees
        gone = weakref.ref(cycle)
        del cycle
        assert gc.get_count()[0] > 5000
    # the young generation starts empty: nothing made inside waits there for a traversal
    assert gc.get_count()[0] < 50
    assert gc.get_freeze_count() == 0  # moved up, not exempted
    assert gone() is not None
    gc.collect()  # a full collection still finds the cycle
    assert gone() is None
    assert len(kept) == 5000


@pytest.mark.usefixtures("collector_on")
def test_objects_frozen_by_someone_else_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with paused():
            made = [[i] for i in range(1000)]
        assert gc.get_freeze_count() >= frozen  # not handed back
        assert made
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("key", ["llama", "qwen3moe", "gemma3", "qwen3next"])
def test_sizing_makes_no_cyclic_garbage(tmp_path: Path, key: str) -> None:
    path = write_gguf(tmp_path / f"{key}.gguf", PRESETS[key])
    meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    budget = Budget(gpus=gpus_from_sizes([24 * MIB]))
    gc.collect()
    for gpus in ((), gpus_from_sizes([64 * MIB])):
        estimate(meta, LaunchSettings(ctx_size=2048), gpus)
    max_context(meta, LaunchSettings(), budget)
    offload_for_context(meta, LaunchSettings(ctx_size=2048), budget)
    _forget()  # every sizing cache: what they kept is freed now, not left for the collector
    assert gc.collect() == 0
