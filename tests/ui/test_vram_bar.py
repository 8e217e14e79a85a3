"""The memory bars mark what the plan charges as an upper bound (issue 17, item 4: never a
silent "fits"): the bound's part of its segment is hatched, the bar's total reads "≤ …", the
tooltip and the legend say what it is, and a "Fits" verdict resting on one reads
"Fits (bound)"."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QPoint
from PySide6.QtGui import QColor, QImage

from qmgui.core.discovery import entry_for_path
from qmgui.core.emit import Command
from qmgui.core.fit import Budget, check
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.units import GIB
from qmgui.ui.hardware import Hardware
from qmgui.ui.planning import PlanOutcome
from qmgui.ui.vram_bar import SEGMENTS, BarSpec, MemoryPanel, VramBar, bars_for
from tests.synth._mmproj import write_mmproj
from tests.synth.factory import PRESETS, write_gguf


def _outcome(tmp_path: Path, *, projector: bool) -> PlanOutcome:
    model = write_gguf(tmp_path / "tiny-gemma3.gguf", PRESETS["gemma3"])
    proj = write_mmproj(
        tmp_path / "mmproj-tiny-gemma3.gguf", image_size=448, patch_size=14, n_embd=128,
        n_ff=512,
    )  # fmt: skip
    entry = entry_for_path(str(model))
    pmeta = entry_for_path(str(proj)).meta if projector else None
    assert entry.meta is not None
    hw = Hardware("what-if", (Gpu("GPU0", GIB // 4),), 16 * GIB, what_if=True)
    s = LaunchSettings(ctx_size=4096)
    fit = check(entry.meta, s, Budget(gpus=hw.gpus, gpu_reserve=0), mmproj=pmeta)
    return PlanOutcome(entry, s, hw, fit, None, Command(()), "", "", "llama-server")


def test_bars_carry_the_plans_bounds_to_their_device(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, projector=True)
    assert outcome.fit is not None
    (bound,) = outcome.fit.footprint.bounds
    gpu, ram = bars_for(outcome, 0)
    assert gpu.bounds == (bound,) and ram.bounds == ()
    assert gpu.bounded == gpu.bounded_in("compute") == bound.bytes > 0
    assert gpu.bounded_in("weights") == 0
    assert _outcome(tmp_path, projector=False).fit is not None
    plain_gpu, _ = bars_for(_outcome(tmp_path, projector=False), 0)
    assert plain_gpu.bounds == () and plain_gpu.bounded == 0


def test_the_panel_marks_a_bound(qtbot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    outcome = _outcome(tmp_path, projector=True)
    panel = MemoryPanel()
    qtbot.addWidget(panel)
    panel.resize(700, 300)
    panel.show()
    specs = bars_for(outcome, 0)
    panel.set_bars(specs)
    panel.set_verdict("Fits this what-if card: 4,096 tokens.", ok=True, nearest=False)
    assert panel.verdict.text() == "Fits (bound) this what-if card: 4,096 tokens."
    assert "GPU0 projector compute: ≤ " in panel.verdict.toolTip()
    assert "upper bound" in panel.verdict.toolTip()
    assert "bound" in panel.legend.keys and "▨" in panel.legend.text()
    tip = panel.bars[0].toolTip()
    assert "GPU0: ≤ " in tip and "Upper bound, projector compute: ≤ " in tip
    assert "of it an upper bound" in tip
    assert "≤" not in panel.bars[1].toolTip()
    # a plan without bounds: the verdict as given, no bound in the legend
    plain = bars_for(_outcome(tmp_path, projector=False), 0)
    panel.set_bars(plain)
    panel.set_verdict("Fits this what-if card.", ok=True, nearest=False)
    assert panel.verdict.text() == "Fits this what-if card." and panel.verdict.toolTip() == ""
    assert "bound" not in panel.legend.keys


def _grab(bar: VramBar) -> QImage:
    bar.resize(600, bar.sizeHint().height())
    return bar.grab().toImage()


def test_the_bounded_part_of_a_segment_is_hatched(qtbot) -> None:  # type: ignore[no-untyped-def]
    from qmgui.core.bounds import Bound

    def spec(bounded: int) -> BarSpec:
        bounds = (Bound("projector compute", "GPU0", bounded, "why"),) if bounded else ()
        return BarSpec("GPU0", 1000, (("compute", 1000),), bounds=bounds)

    plain, hatched = VramBar(spec(0)), VramBar(spec(500))
    qtbot.addWidget(plain)
    qtbot.addWidget(hatched)
    a, b = _grab(plain), _grab(hatched)
    y = b.height() - 8  # inside the bar
    compute = SEGMENTS["compute"][1]

    def differs(img: QImage, x0: int, x1: int) -> int:
        return sum(
            1 for x in range(x0, x1) if QColor(img.pixel(QPoint(x, y))).rgb() != compute.rgb()
        )

    # the left half (estimate) is plain compute in both; the right half is hatched only where
    # it is a bound
    assert differs(a, 20, 280) == 0 and differs(b, 20, 280) == 0
    assert differs(a, 320, 580) == 0
    assert differs(b, 320, 580) > 20
