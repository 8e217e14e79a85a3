"""Starting one more engine: whom the budget stops first (least recently used, never a pinned
one), sized by the real planner on full-size model headers and a card of a chosen size."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.footprint import Footprint, Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import GIB
from qmgui.service.launch import Resolver
from qmgui.settings import LoadResult, Settings
from qmgui.ui.budgeting import start_decision
from qmgui.ui.hardware import Hardware
from qmgui.ui.occupancy import EngineLoad
from qmgui.ui.planning import PlanOutcome, plan_model
from tests.synth.factory import FULL_SIZE_PRESETS, write_gguf

CTX = LaunchSettings(ctx_size=4096)


@pytest.fixture(scope="module")
def entries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelEntry]:
    d = tmp_path_factory.mktemp("budget")
    out = {}
    for name in ("qwen3-4b", "llama3-8b"):
        p = write_gguf(d / f"{name}.gguf", FULL_SIZE_PRESETS[name], sparse=True)
        out[name] = entry_for_path(p)
    return out


def card(gib: float, *, what_if: bool = False) -> Hardware:
    gpu = Gpu("GPU0 (test card)", int(gib * GIB))
    return Hardware("test", (gpu,), 64 * GIB, what_if=what_if)


def plan(entry: ModelEntry, hw: Hardware) -> PlanOutcome:
    return plan_model(entry, CTX, hw, 512, Resolver(LoadResult(Settings()), probe=False))


def running(key: int, outcome: PlanOutcome, last_used: float) -> EngineLoad:
    assert outcome.fit is not None
    fp: Footprint = outcome.fit.footprint
    return EngineLoad(key, f"{outcome.entry.name}-{key}", f"id-{key}", fp, {}, last_used=last_used)


def test_nothing_to_stop_when_it_fits(entries: dict[str, ModelEntry]) -> None:
    hw = card(24)
    a = running(1, plan(entries["qwen3-4b"], hw), 1.0)
    d = start_decision(plan(entries["llama3-8b"], hw), [a], pinned=(), live=None, reserve_mib=512)
    assert d.fits and d.stop == () and d.message is None


def test_the_least_recently_used_is_stopped(entries: dict[str, ModelEntry]) -> None:
    # two Qwen3-4B engines (~2.7 GiB each) and a Llama-3-8B (~5 GiB) do not share 10 GiB;
    # stopping one 4B is enough, and it is the one idle longest
    hw = card(10)
    q = plan(entries["qwen3-4b"], hw)
    old, recent = running(1, q, last_used=5.0), running(2, q, last_used=9.0)
    d = start_decision(
        plan(entries["llama3-8b"], hw), [recent, old], pinned=(), live=None, reserve_mib=512
    )
    assert d.fits
    assert d.stop == (1,)
    assert d.message is not None
    assert "qwen3-4b-1" in d.message and "least recently used" in d.message


def test_a_pinned_engine_is_never_stopped(entries: dict[str, ModelEntry]) -> None:
    hw = card(10)
    q = plan(entries["qwen3-4b"], hw)
    old, recent = running(1, q, last_used=5.0), running(2, q, last_used=9.0)
    d = start_decision(
        plan(entries["llama3-8b"], hw), [old, recent], pinned={"id-1"}, live=None, reserve_mib=512
    )
    assert d.stop == (2,)


def test_nothing_is_stopped_when_even_that_would_not_do(entries: dict[str, ModelEntry]) -> None:
    hw = card(10)
    q = plan(entries["qwen3-4b"], hw)
    loads = [running(1, q, 5.0), running(2, q, 9.0)]
    d = start_decision(
        plan(entries["llama3-8b"], hw), loads, pinned={"id-1", "id-2"}, live=None, reserve_mib=512
    )
    assert not d.fits and d.stop == ()
    assert d.message is not None and "Nothing was stopped" in d.message


def test_what_if_hardware_is_not_this_machine(entries: dict[str, ModelEntry]) -> None:
    hw = card(10, what_if=True)
    q = plan(entries["qwen3-4b"], hw)
    loads = [running(1, q, 5.0), running(2, q, 9.0)]
    d = start_decision(plan(entries["llama3-8b"], hw), loads, pinned=(), live=None, reserve_mib=512)
    assert d.fits and d.stop == ()


def test_the_budget_counts_the_new_models_projector(tmp_path: Path) -> None:
    """The projector its plan charged (`--mmproj`) is part of what the new engine needs next to
    the running ones: on a card with room for the model alone, starting it stops an engine."""
    from dataclasses import replace

    from qmgui.core.units import MIB
    from tests.synth._mmproj import write_mmproj
    from tests.synth.factory import PRESETS

    write_gguf(tmp_path / "qwen3.gguf", PRESETS["qwen3"])
    write_mmproj(tmp_path / "mmproj-qwen3.gguf", n_embd=256, n_ff=1024, n_layer=4)
    write_gguf(tmp_path / "other" / "llama.gguf", PRESETS["llama"])
    model = entry_for_path(tmp_path / "qwen3.gguf")
    assert model.mmproj is not None
    wide = card(64)
    with_proj, alone = plan(model, wide), plan(replace(model, mmproj=None), wide)
    assert with_proj.mmproj is not None and alone.mmproj is None
    other = plan(entry_for_path(tmp_path / "other" / "llama.gguf"), wide)
    gpu = "GPU0 (test card)"

    def need(o: PlanOutcome) -> int:
        assert o.fit is not None
        return o.fit.footprint.device(gpu).total

    # room for the running engine, the reserve and the new model alone, not its projector too
    room = need(other) + 512 * MIB + (need(alone) + need(with_proj)) // 2
    hw = Hardware("test", (Gpu(gpu, room),), 64 * GIB)
    running_one = running(1, replace(other, hardware=hw), 1.0)
    fits_alone = start_decision(
        replace(alone, hardware=hw), [running_one], pinned=(), live=None, reserve_mib=512
    )
    assert fits_alone.fits and fits_alone.stop == ()
    with_it = start_decision(
        replace(with_proj, hardware=hw), [running_one], pinned=(), live=None, reserve_mib=512
    )
    assert with_it.stop == (1,)  # the projector does not fit beside it: the engine makes room
