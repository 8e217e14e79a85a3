"""The sizing's caches change no result: footprint's kept weight placements, the graphs
core.compute and core.sched share (compute.built), and compute.searching. Each figure is
compared with the same call on caches emptied first, and with calls from several threads."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qmgui.core import compute, footprint, sched
from qmgui.core import meta as meta_module
from qmgui.core.fit import Budget, gpus_from_sizes, max_context, offload_for_context
from qmgui.core.footprint import Gpu, estimate
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.graph import dims
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.units import MIB
from tests.synth.factory import PRESETS, write_gguf

MODELS = ("llama", "qwen3moe", "gemma3", "qwen3next")


def _forget() -> None:
    for cache in (
        compute._PROGRAMS,
        compute._BYTES_CACHE,
        compute._BUILT,
        compute._VERIFIED,
        compute._SEEN,
        compute._PEAKS,
        dims._REPLAY_CACHE,
        dims._SIGNATURES,
        dims._NAMED,
        sched._LAYERS,
        sched._PROGRAMS,
        sched._GRAPHS,
        sched._OFFLOAD_GRAPHS,
        sched._SEEN,
        sched._PEAKS,
        sched._CACHE,
        sched._SIZES,
        footprint._TABLES,
        footprint._PLACED,
        meta_module._PLACES,
        meta_module._NAME_PARTS,
    ):
        cache.clear()


@pytest.fixture(scope="module")
def metas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModelMeta]]:
    tmp = tmp_path_factory.mktemp("caches")
    out = {}
    for key in MODELS:
        path = write_gguf(Path(tmp) / f"{key}.gguf", PRESETS[key])
        out[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    yield out
    _forget()


def _calls(metas: dict[str, ModelMeta]) -> list[Callable[[], str]]:
    """Estimates at several placements and contexts, and both searches, as reprs."""
    one = (Gpu(name="GPU0", total_bytes=64 * MIB),)
    vk = (Gpu(name="GPU0", total_bytes=64 * MIB, backend="vulkan"),)
    budget = Budget(gpus=gpus_from_sizes([24 * MIB]))
    calls: list[Callable[[], str]] = []
    for m in metas.values():
        for ctx in (512, 2048):
            for gpus in ((), one, vk):
                for extra in ({}, {"n_gpu_layers": 1}, {"n_cpu_moe": 1}, {"mmap": False}):
                    s = LaunchSettings(ctx_size=ctx, **extra)  # type: ignore[arg-type]
                    calls.append(lambda m=m, s=s, g=gpus: repr(estimate(m, s, g)))
        calls.append(lambda m=m: repr(max_context(m, LaunchSettings(), budget)))
        calls.append(
            lambda m=m: repr(offload_for_context(m, LaunchSettings(ctx_size=2048), budget))
        )
    return calls


def test_each_result_is_the_one_of_a_cold_call(metas: dict[str, ModelMeta]) -> None:
    calls = _calls(metas)
    _forget()
    warm = [call() for call in calls]  # each call finds what the earlier ones kept
    cold = []
    for call in calls:
        _forget()
        cold.append(call())
    assert warm == cold


def test_threads_get_the_results_of_one_thread(metas: dict[str, ModelMeta]) -> None:
    calls = _calls(metas)
    _forget()
    alone = [call() for call in calls]
    _forget()
    n = len(calls)
    order = [(i * 7) % n for i in range(n)] if n % 7 else list(range(n))
    got: list[str | None] = [None] * n
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:

        def work(k: int) -> None:
            for i in range(k, n, 4):
                got[order[i]] = calls[order[i]]()

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert got == alone
