"""The window's planner sizes the cards by the rules of the engine build that will run on them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.fit import check
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import GIB, MIB
from qmgui.service.launch import Resolver
from qmgui.settings import BackendEntry, LoadResult, Settings
from qmgui.ui.hardware import Hardware
from qmgui.ui.planning import (
    Badge,
    badge_context,
    budget_for,
    fit_badge,
    fit_context,
    for_variant,
    plan_model,
)
from tests.synth._mmproj import write_mmproj
from tests.synth.factory import PRESETS, write_gguf

CARD = Hardware("test", (Gpu("GPU0 (test)", 24 * GIB),), 64 * GIB)


def test_for_variant_maps_builds_to_allocation_rules() -> None:
    assert for_variant(CARD, "vulkan").gpus[0].backend == "vulkan"
    assert for_variant(CARD, "ROCm").gpus[0].backend == "cuda"
    assert for_variant(CARD, None) is CARD
    assert for_variant(CARD, "cuda,vulkan") is CARD  # a build with both: the cards' own rules
    assert for_variant(CARD, "sycl") is CARD


def test_a_vulkan_build_is_planned_with_vulkans_context(tmp_path: Path) -> None:
    model = entry_for_path(write_gguf(tmp_path / "tiny-llama.gguf", PRESETS["llama"]))
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)

    def plan(variant: str | None) -> int:
        backend = BackendEntry(
            id="b", kind="llama", executable=str(exe), default_for=["llm"], variant=variant
        )
        resolver = Resolver(LoadResult(Settings(backends=[backend])), probe=False)
        outcome = plan_model(model, LaunchSettings(ctx_size=1024), CARD, 512, resolver)
        assert outcome.fit is not None and outcome.command.runnable
        return outcome.fit.footprint.device("GPU0 (test)").other

    vulkan, cuda = plan("vulkan"), plan("cuda")
    assert vulkan < 100 * MIB < 500 * MIB < cuda  # measured: 57 MiB and 528 MiB (docs/sizing.md)
    assert plan(None) == cuda  # NVIDIA cards are planned as CUDA without a known variant


def test_the_windows_plan_badge_and_fit_context_carry_the_paired_projector(
    tmp_path: Path,
) -> None:
    """llama-server loads the projector beside the model (--mmproj): the window's plan, its fit
    badge and "Fit context" charge its weights and its compute bound, as `qmgui plan` does."""
    write_gguf(tmp_path / "tiny-qwen3.gguf", PRESETS["qwen3"])
    write_mmproj(tmp_path / "mmproj-tiny-qwen3.gguf")
    model = entry_for_path(tmp_path / "tiny-qwen3.gguf")
    assert model.mmproj is not None
    alone = replace(model, mmproj=None)
    proj = entry_for_path(model.mmproj).meta
    assert proj is not None
    resolver = Resolver(LoadResult(Settings()), probe=False)
    settings = LaunchSettings(ctx_size=1024)

    def gpu(entry: ModelEntry) -> tuple[int, list[str]]:
        outcome = plan_model(entry, settings, CARD, 512, resolver)
        assert outcome.fit is not None
        d = outcome.fit.footprint.device("GPU0 (test)")
        return d.weights, [b.part for b in outcome.fit.footprint.bounds]

    (with_weights, bounds), (weights, no_bounds) = gpu(model), gpu(alone)
    assert with_weights - weights == proj.weight_bytes
    assert "projector compute" in bounds and "projector compute" not in no_bounds

    # a card between what the model needs with its projector and without: the badge and Fit
    # context see the difference
    def need(mmproj: object) -> int:
        at = LaunchSettings(ctx_size=badge_context(model))
        assert model.meta is not None
        fit = check(model.meta, at, budget_for(CARD, 0), mmproj=mmproj)  # type: ignore[arg-type]
        return fit.footprint.device("GPU0 (test)").total

    between = (need(proj) + need(None)) // 2
    assert need(None) < between < need(proj)
    tight = Hardware("tight", (Gpu("GPU0 (test)", between),), 64 * GIB)
    assert fit_badge(model, tight, 0).badge is not Badge.FITS
    assert fit_badge(alone, tight, 0).badge is Badge.FITS
    small = fit_context(model, settings, tight, 0)
    big = fit_context(alone, settings, tight, 0)
    assert small is not None and big is not None
    assert small.footprint.settings.n_ctx < big.footprint.settings.n_ctx
