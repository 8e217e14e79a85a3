"""The window's planner sizes the cards by the rules of the engine build that will run on them."""

from __future__ import annotations

from pathlib import Path

from qmgui.core.discovery import entry_for_path
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import GIB, MIB
from qmgui.service.launch import Resolver
from qmgui.settings import BackendEntry, LoadResult, Settings
from qmgui.ui.hardware import Hardware
from qmgui.ui.planning import for_variant, plan_model
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
