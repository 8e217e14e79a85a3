"""The host memory bar shows CPU weight repacking (issue 17, item 1) as its own segment:
"Repacked weights" beside the mapped weights, in the legend only when a bar has it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from qmgui.core.discovery import entry_for_path
from qmgui.core.emit import Command
from qmgui.core.fit import Budget, check
from qmgui.core.footprint import EngineRules
from qmgui.core.launch import LaunchSettings
from qmgui.core.repack import CpuTarget
from qmgui.core.units import GIB
from qmgui.ui.hardware import Hardware
from qmgui.ui.planning import PlanOutcome
from qmgui.ui.vram_bar import MemoryPanel, bars_for
from tests.synth.factory import PRESETS, Q, write_gguf

AVX2 = CpuTarget(frozenset({"AVX2", "REPACK"}), source="system_info")


def _outcome(tmp_path: Path, cpu: CpuTarget | None) -> PlanOutcome:
    model = write_gguf(tmp_path / "q4.gguf", replace(PRESETS["llama"], weight_type=Q.Q4_0))
    entry = entry_for_path(str(model))
    assert entry.meta is not None
    hw = Hardware("this machine", (), 16 * GIB)
    s = LaunchSettings(ctx_size=512)
    fit = check(entry.meta, s, Budget(host_bytes=16 * GIB, rules=EngineRules(cpu=cpu)))
    return PlanOutcome(entry, s, hw, fit, None, Command(()), "", "", "llama-server")


def test_the_ram_bar_has_a_repack_segment(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outcome = _outcome(tmp_path, AVX2)
    assert outcome.fit is not None
    host = outcome.fit.footprint.host
    (ram,) = bars_for(outcome, 0)
    segs = dict(ram.segments)
    assert segs["repack"] == host.repack > 0 and segs["weights"] == host.weights
    assert ram.planned == host.total
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.set_bars([ram])
    assert "repack" in panel.legend.keys and "Repacked" in panel.legend.text()
    assert "Repacked weights" in panel.bars[0].toolTip()
    # a CPU that repacks nothing (features not known): no segment, no legend entry
    (plain,) = bars_for(_outcome(tmp_path, None), 0)
    assert dict(plain.segments)["repack"] == 0
    panel.set_bars([plain])
    assert "repack" not in panel.legend.keys
