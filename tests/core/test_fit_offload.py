"""The --n-cpu-moe search sizes few candidates in full (each a new offload, whose compute
buffers cost a compile of the scheduler's walk at first) and answers what a bisection over
full checks answers, on a full-size MoE header and a tiny one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from qmgui.core import fit
from qmgui.core.fit import Budget, _fits, _nearest_offload, gpus_from_sizes, largest
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.units import GIB, MIB
from tests.synth.factory import FULL_SIZE_PRESETS, PRESETS, write_gguf, write_sparse_gguf


def _bisected(meta: ModelMeta, settings: LaunchSettings, budget: Budget) -> int | None:
    """The fewest --n-cpu-moe layers that fit, by bisection over full checks (the search
    before the cheap first step)."""

    def ok(n: int) -> bool:
        cand = replace(settings, n_gpu_layers=meta.n_layer + 1, n_cpu_moe=meta.n_layer - n)
        return _fits(meta, cand, budget)

    kept = largest(0, meta.n_layer, ok)
    return None if kept is None else meta.n_layer - kept


@pytest.fixture(scope="module")
def moe_30b(tmp_path_factory: pytest.TempPathFactory) -> ModelMeta:
    path = write_sparse_gguf(
        tmp_path_factory.mktemp("moe") / "m.gguf", FULL_SIZE_PRESETS["qwen3-30b-a3b"]
    )
    return meta_from_gguf(read_gguf_header(path), file_name=path.name)


@pytest.mark.parametrize("gib", [6, 9, 12, 15, 17])
def test_the_full_size_moe_search_answers_the_bisection(moe_30b: ModelMeta, gib: int) -> None:
    settings = LaunchSettings(ctx_size=32768)
    budget = Budget(gpus=gpus_from_sizes([gib * GIB]))
    got = _nearest_offload(moe_30b, settings, budget)
    want = _bisected(moe_30b, settings, budget)
    if want is None:  # not even every expert on the CPU: the -ngl search answers
        assert got is None or got.n_cpu_moe == 0
    else:
        assert got is not None and got.n_cpu_moe == want
        assert got.n_gpu_layers == moe_30b.n_layer + 1


def test_a_tiny_moe_search_answers_the_bisection_at_every_budget(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", replace(PRESETS["qwen3moe"], n_layer=8))
    meta = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    settings = LaunchSettings(ctx_size=4096, parallel=1)
    answers = set()
    # every expert on the GPU takes ~542.1 MiB of the card, none ~541.35: 0.094 MiB a layer
    for size in range(541 * MIB, 543 * MIB, 24_000):
        budget = Budget(gpus=gpus_from_sizes([size]), gpu_reserve=0)
        got = _nearest_offload(meta, settings, budget)
        want = _bisected(meta, settings, budget)
        if want is not None:
            assert got is not None and got.n_cpu_moe == want, size
            answers.add(want)
    assert len(answers) >= 8  # the budgets span every answer but one or so


def test_few_candidates_are_sized_in_full(
    moe_30b: ModelMeta, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bisection sizes about log2(48) candidates in full; the search sizes the guess, its
    neighbour and the top it measures the compute buffers at."""
    asked: set[int] = set()
    real = fit.check

    def counting(meta: ModelMeta, s: LaunchSettings, *a: object, **k: object) -> object:
        asked.add(s.n_cpu_moe)
        return real(meta, s, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(fit, "check", counting)
    settings = LaunchSettings(ctx_size=32768)
    got = _nearest_offload(moe_30b, settings, Budget(gpus=gpus_from_sizes([12 * GIB])))
    assert got is not None and 0 < got.n_cpu_moe < moe_30b.n_layer
    searched = len(asked)
    asked.clear()
    assert _bisected(moe_30b, settings, Budget(gpus=gpus_from_sizes([12 * GIB]))) == got.n_cpu_moe
    assert searched <= 3 < len(asked), (searched, len(asked))
