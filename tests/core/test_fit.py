"""Fit searches over the footprint: results fit their budget, and 'does not fit' says why."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from qmgui.core.fit import (
    Budget,
    check,
    gpus_from_sizes,
    kv_type_tradeoff,
    max_context,
    max_slots,
    offload_for_context,
)
from qmgui.core.footprint import CONTEXT_BYTES, CPU
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import MIB
from tests.core.test_footprint import make_meta, tensors

BIG_CTX = 131072
# what-if GPUs plan for CUDA, whose context every card pays first: budgets below are that plus
# what the test is about
CTX = CONTEXT_BYTES["cuda"]


def meta():  # type: ignore[no-untyped-def]
    return make_meta(context_length=BIG_CTX)


def test_max_context_is_the_largest_that_fits() -> None:
    m = meta()
    budget = Budget(gpus=gpus_from_sizes([CTX + 40 * MIB]), gpu_reserve=0)
    r = max_context(m, LaunchSettings(parallel=1), budget)
    assert r.fits
    n = r.footprint.settings.n_ctx
    assert 256 <= n < BIG_CTX
    assert not check(m, LaunchSettings(parallel=1, ctx_size=n + 256), budget).fits
    gpu = r.footprint.device("GPU0")
    assert gpu.total <= CTX + 40 * MIB


def test_reserve_is_left_free() -> None:
    m = meta()
    no_reserve = max_context(
        m, LaunchSettings(parallel=1), Budget(gpus=gpus_from_sizes([CTX + 40 * MIB]), gpu_reserve=0)
    )
    reserve = max_context(
        m,
        LaunchSettings(parallel=1),
        Budget(gpus=gpus_from_sizes([CTX + 40 * MIB]), gpu_reserve=10 * MIB),
    )
    assert reserve.footprint.settings.n_ctx < no_reserve.footprint.settings.n_ctx
    assert reserve.footprint.device("GPU0").total <= CTX + 30 * MIB


def test_does_not_fit_is_a_result_with_reason_and_nearest() -> None:
    m = meta()
    budget = Budget(gpus=gpus_from_sizes([CTX + 300_000]), gpu_reserve=0)
    r = max_context(m, LaunchSettings(parallel=1), budget)
    assert not r.fits
    assert r.reason is not None
    assert "GPU0" in r.reason
    assert r.nearest is not None
    assert r.nearest.n_gpu_layers is not None
    assert r.nearest.n_gpu_layers < m.n_layer + 1
    assert check(m, r.nearest, budget).fits


def test_offload_for_context_moves_experts_first_for_moe() -> None:
    m = make_meta(tensors=tensors(moe=True), n_expert=8, n_expert_used=2, context_length=4096)
    full = check(
        m, LaunchSettings(ctx_size=4096, parallel=1), Budget(gpus=gpus_from_sizes([1 << 40]))
    )
    need = full.footprint.device("GPU0").total
    budget = Budget(gpus=gpus_from_sizes([need - 20_000]), gpu_reserve=0)
    r = offload_for_context(m, LaunchSettings(ctx_size=4096, parallel=1), budget)
    assert r.fits
    assert r.nearest is not None
    assert r.nearest.n_cpu_moe > 0
    assert r.nearest.n_gpu_layers == m.n_layer + 1


def test_host_budget_is_checked() -> None:
    m = meta()
    r = check(m, LaunchSettings(ctx_size=BIG_CTX, parallel=1), Budget(host_bytes=1 * MIB))
    assert not r.fits
    assert r.reason is not None
    assert "host memory" in r.reason
    assert r.footprint.host.name == CPU


def test_slots_and_kv_types() -> None:
    m = meta()
    budget = Budget(gpus=gpus_from_sizes([CTX + 40 * MIB]), gpu_reserve=0)
    slots = max_slots(m, LaunchSettings(), budget, ctx_per_slot=4096)
    assert slots.fits
    assert slots.footprint.settings.n_seq >= 2
    refused = kv_type_tradeoff(m, LaunchSettings(parallel=1), budget)
    assert refused[0].refused is None
    assert refused[1].refused is not None  # heads of 16 values: q8_0 blocks of 32 do not fit
    assert "do not divide" in refused[1].refused
    wide = make_meta(context_length=BIG_CTX, head_dim_k=32, head_dim_v=32)
    options = kv_type_tradeoff(wide, LaunchSettings(parallel=1), budget)
    ctxs = [o.max_context or 0 for o in options]
    assert ctxs == sorted(ctxs)  # smaller cache types reach at least as far
    assert ctxs[1] > ctxs[0]


@settings(max_examples=40, deadline=None)
@given(mib=st.integers(2, 200), reserve=st.integers(0, 8))
def test_a_plan_that_fits_never_exceeds_its_budget(mib: int, reserve: int) -> None:
    m = meta()
    budget = Budget(gpus=gpus_from_sizes([CTX + mib * MIB]), gpu_reserve=reserve * MIB)
    r = max_context(m, LaunchSettings(parallel=1), budget)
    chosen = r.nearest if not r.fits and r.nearest else r.settings
    final = check(m, replace(chosen), budget)
    if r.fits or r.nearest:
        assert final.fits
        for d in final.footprint.devices:
            limit = budget.limit(d.name)
            assert limit is None or d.total <= limit


def test_max_context_matches_a_scan_of_every_context() -> None:
    """The two-step search (cheap bisection, then full estimates) finds what trying every
    context in order would."""
    from tests.core.test_footprint import make_meta as mk

    m = mk(context_length=16384)
    for mib in (3, 5, 9):
        budget = Budget(gpus=gpus_from_sizes([CTX + mib * MIB]), gpu_reserve=0)
        found = max_context(m, LaunchSettings(parallel=1), budget)
        fitting = [
            k
            for k in range(1, 16384 // 256 + 1)
            if check(m, LaunchSettings(parallel=1, ctx_size=k * 256), budget).fits
        ]
        if fitting:
            assert found.fits
            assert found.footprint.settings.n_ctx == max(fitting) * 256
        else:
            assert not found.fits


def test_a_split_over_cards_nvlink_does_not_join_is_a_warning() -> None:
    """Readings say which cards NVLink joins: a split across two that it does not is a
    warning with the bytes per token; joined cards, or what-if cards (unknown), say nothing."""
    from qmgui.core.fit import Budget, check
    from qmgui.core.footprint import Gpu
    from qmgui.core.launch import LaunchSettings
    from tests.core.test_footprint import make_meta

    meta = make_meta()
    settings = LaunchSettings(ctx_size=1024, tensor_split=(1.0, 1.0))

    def warnings(a: frozenset[str] | None, b: frozenset[str] | None) -> tuple[str, ...]:
        gpus = (Gpu("GPU0", 24 << 30, nvlink=a), Gpu("GPU1", 24 << 30, nvlink=b))
        return check(meta, settings, Budget(gpus=gpus)).warnings

    (said,) = warnings(frozenset(), frozenset())
    assert said.startswith("split over GPU0 and GPU1, which NVLink does not join")
    assert f"({meta.n_embd * 4} B a token, 128.0 KiB for a 512-token batch)" in said
    assert warnings(frozenset({"GPU1"}), frozenset({"GPU0"})) == ()
    assert warnings(None, None) == ()
