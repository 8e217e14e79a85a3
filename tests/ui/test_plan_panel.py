"""The plan panel's CPU experts (MoE), GPU split and extra arguments, alone and in the window."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox

from qmgui.core.discovery import ModelEntry, scan
from qmgui.core.launch import LaunchSettings
from qmgui.service.launch import Resolver
from qmgui.settings import LoadResult, Settings
from qmgui.ui import hardware, main_window
from qmgui.ui.main_window import MainWindow
from qmgui.ui.plan_panel import ALL_EXPERTS, PlanPanel, parse_split
from qmgui.ui.planning import plan_model
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle


def entry_of(tmp_path: Path, preset: str) -> ModelEntry:
    d = tmp_path / preset
    write_gguf(d / f"tiny-{preset}.gguf", PRESETS[preset])
    (entry,) = scan([str(d)]).models
    assert entry.meta is not None
    return entry


@pytest.fixture
def panel(qtbot) -> PlanPanel:  # type: ignore[no-untyped-def]
    p = PlanPanel()
    qtbot.addWidget(p)
    p.show()
    return p


def test_cpu_experts_only_for_moe_models(qtbot, panel: PlanPanel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dense = entry_of(tmp_path, "llama")
    moe = entry_of(tmp_path, "qwen3moe")
    assert moe.meta is not None and moe.meta.is_moe

    panel.set_entry(dense)
    assert not panel.cpu_moe.isVisible()
    assert not panel.offload_row.isVisible()
    assert panel.settings().n_cpu_moe == 0 and not panel.settings().cpu_moe

    panel.set_entry(moe)
    assert panel.cpu_moe.isVisible() and panel.cpu_moe.isEnabled()
    assert panel.cpu_moe.maximum() == moe.meta.n_layer
    with qtbot.waitSignal(panel.changed):
        panel.cpu_moe.setValue(1)
    s = panel.full_settings()
    assert s.n_cpu_moe == 1 and not s.cpu_moe
    # "all" is --cpu-moe
    with qtbot.waitSignal(panel.changed):
        panel.cpu_moe.setValue(ALL_EXPERTS)
    assert panel.cpu_moe.text() == "all"
    s = panel.full_settings()
    assert s.cpu_moe and s.n_cpu_moe == 0
    # the keyboard reaches it, and apply() shows what the planner suggests
    panel.cpu_moe.setFocus()
    qtbot.keyClick(panel.cpu_moe, Qt.Key.Key_Up)
    assert panel.settings().n_cpu_moe == 0 and not panel.settings().cpu_moe
    panel.apply(LaunchSettings(ctx_size=4096, n_cpu_moe=2))
    assert panel.cpu_moe.value() == 2 and panel.full_settings().n_cpu_moe == 2

    # back to a dense model: hidden, and no MoE flags leak into its settings
    panel.set_entry(dense, panel.full_settings())
    assert not panel.cpu_moe.isVisible()
    assert panel.full_settings().n_cpu_moe == 0 and not panel.full_settings().cpu_moe


def test_parse_split() -> None:
    assert parse_split("", 2) == ()
    assert parse_split(" 3, 1 ", 2) == (3.0, 1.0)
    assert parse_split("0,1.5", 2) == (0.0, 1.5)
    for bad in ("3", "3,1,1", "a,b", "0,0", "-1,2", "nan,1", "3,,1"):
        with pytest.raises(ValueError):
            parse_split(bad, 2)


def test_split_validates_and_maps_with_two_gpus(qtbot, panel: PlanPanel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    panel.set_entry(entry_of(tmp_path, "llama"))
    panel.set_gpus(["GPU0 (RTX 3090)"])
    assert not panel.split.isVisible()
    panel.set_gpus(["GPU0 (RTX 3090)", "GPU1 (RTX 3090)"])
    assert panel.split.isVisible() and panel.offload_row.isVisible()
    assert "GPU1 (RTX 3090)" in panel.split.toolTip()
    assert panel.settings().tensor_split == ()  # empty: by free memory

    panel.split.setFocus()
    with qtbot.waitSignal(panel.changed):
        qtbot.keyClicks(panel.split, "3,1")
    assert panel.full_settings().tensor_split == (3.0, 1.0)
    assert not panel.split.property("invalid")

    # invalid input turns red, says why, and is not applied (no `changed`)
    for bad in ("3,1,1", "0,0", "x,1"):
        with qtbot.assertNotEmitted(panel.changed):
            panel.split.setText(bad)
        assert panel.split.property("invalid")
        assert "Not applied" in panel.split.toolTip()
        assert panel.split.styleSheet()
        assert panel.full_settings().tensor_split == (3.0, 1.0)

    with qtbot.waitSignal(panel.changed):
        panel.split.setText("1,1")
    assert not panel.split.property("invalid") and not panel.split.styleSheet()
    assert panel.full_settings().tensor_split == (1.0, 1.0)
    with qtbot.waitSignal(panel.changed):
        panel.split.clear()
    assert panel.full_settings().tensor_split == ()

    # apply() shows a split, and one GPU drops it
    panel.apply(LaunchSettings(ctx_size=4096, tensor_split=(2.0, 1.0)))
    assert panel.split.text() == "2,1" and panel.settings().tensor_split == (2.0, 1.0)
    panel.set_gpus(["GPU0 (RTX 3090)"])
    assert not panel.split.isVisible() and panel.settings().tensor_split == ()


def test_extra_args_validate(qtbot, panel: PlanPanel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    llama = entry_of(tmp_path, "llama")
    panel.set_entry(llama)
    assert panel.extra_args() == ""
    with qtbot.waitSignal(panel.changed):
        panel.extra_args_edit.setText("--jinja --alias 'my model'")
    assert panel.extra_args() == "--jinja --alias 'my model'"
    with qtbot.assertNotEmitted(panel.changed):
        panel.extra_args_edit.setText("--alias 'open")
    assert panel.extra_args_edit.property("invalid")
    assert "Not applied" in panel.extra_args_edit.toolTip()
    assert panel.extra_args() == "--jinja --alias 'my model'"
    with qtbot.waitSignal(panel.changed):
        panel.extra_args_edit.setText("--jinja")
    assert not panel.extra_args_edit.property("invalid")
    # kept when the same model is shown again, cleared for another
    panel.set_entry(llama, panel.full_settings())
    assert panel.extra_args() == "--jinja"
    panel.set_entry(entry_of(tmp_path, "qwen3"))
    assert panel.extra_args() == "" and panel.extra_args_edit.text() == ""


def test_plan_model_takes_extra_args(tmp_path: Path) -> None:
    """Split when the command is built; one that does not split is shown, not raised."""
    entry = entry_of(tmp_path, "llama")
    hw = hardware.resolve("RTX 4090", host_bytes=64 << 30)
    resolver = Resolver(LoadResult(Settings()), probe=False)
    s = LaunchSettings(ctx_size=4096)
    o = plan_model(entry, s, hw, 1024, resolver, extra_args="--jinja --alias 'a b'")
    assert o.command.runnable
    assert o.command.argv[-3:] == ("--jinja", "--alias", "a b")
    bad = plan_model(entry, s, hw, 1024, resolver, extra_args="--alias 'x")
    assert not bad.command.runnable
    assert any("close the quote" in line for line in bad.command.warnings)


def _forward_panel_extra_args(monkeypatch: pytest.MonkeyPatch, w: MainWindow) -> None:
    """Until MainWindow._plan_now passes `extra_args=self.plan_panel.extra_args()` itself,
    do it for it (a no-op once it does)."""
    real = main_window.plan_model

    def plan(*args, **kw):  # type: ignore[no-untyped-def]
        kw.setdefault("extra_args", w.plan_panel.extra_args())
        return real(*args, **kw)

    monkeypatch.setattr(main_window, "plan_model", plan)


def test_window_preview_shows_panel_settings(  # type: ignore[no-untyped-def]
    qtbot, make_window, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "models"
    write_gguf(d / "tiny-qwen3moe.gguf", PRESETS["qwen3moe"])
    w = make_window([str(d)], hardware_choice="2× RTX 3090")
    _forward_panel_extra_args(monkeypatch, w)
    settle(qtbot, w)
    assert w.table.select_name("tiny-qwen3moe")
    settle(qtbot, w)
    panel = w.plan_panel
    if len(panel.gpus) < 2:  # until MainWindow.set_hardware calls set_gpus itself
        panel.set_gpus([g.name for g in w.hardware.gpus])
    assert panel.cpu_moe.isVisible() and panel.split.isVisible()

    panel.cpu_moe.setValue(1)
    panel.split.setText("3,1")
    panel.extra_args_edit.setText("--jinja --alias 'tiny moe'")
    qtbot.waitUntil(lambda: "--jinja" in w.preview.command_text(), timeout=30_000)
    settle(qtbot, w)
    text = w.preview.command_text()
    assert "--n-cpu-moe 1" in text
    assert "-ts 3,1" in text
    assert "--alias 'tiny moe'" in text
    o = w.outcome
    assert o is not None and o.settings.n_cpu_moe == 1 and o.settings.tensor_split == (3.0, 1.0)
    assert "--jinja" in o.command.argv and "tiny moe" in o.command.argv


def test_gpu_selection_boxes(qtbot, panel: PlanPanel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    panel.set_entry(entry_of(tmp_path, "llama"))
    panel.set_gpus(["GPU0 (RTX 3090)"])
    assert not panel.gpu_row.isVisible() and panel.selected_gpus() == ()
    panel.set_gpus(["GPU0 (RTX 3090)", "GPU1 (RTX 3090)", "GPU2 (RTX 3060)"])
    boxes = panel.gpu_row.findChildren(QCheckBox)
    assert panel.gpu_row.isVisible() and len(boxes) == 3
    assert panel.selected_gpus() == ()  # all of them
    with qtbot.waitSignal(panel.changed):
        boxes[0].setChecked(False)
    assert panel.selected_gpus() == (1, 2)
    # the split counts the chosen GPUs only
    panel.split.setText("3,1,1")
    assert panel.split.property("invalid")
    panel.split.setText("3,1")
    assert panel.full_settings().tensor_split == (3.0, 1.0)
    with qtbot.waitSignal(panel.changed):
        boxes[1].setChecked(False)
    assert panel.selected_gpus() == (2,)
    assert not panel.split.isVisible() and panel.full_settings().tensor_split == ()
    # the last GPU cannot be left out
    with qtbot.assertNotEmitted(panel.changed):
        boxes[2].setChecked(False)
    assert boxes[2].isChecked() and panel.selected_gpus() == (2,)


def test_plan_model_runs_on_the_chosen_gpus(tmp_path: Path) -> None:
    """Only the chosen cards are sized and named (`--device`); the others plan nothing."""
    entry = entry_of(tmp_path, "llama")
    hw = hardware.resolve("2× RTX 3090", host_bytes=64 << 30)
    resolver = Resolver(LoadResult(Settings()), probe=False)
    o = plan_model(entry, LaunchSettings(ctx_size=4096), hw, 512, resolver, gpu_subset=(1,))
    assert o.fit is not None and o.fit.fits
    assert len(o.hardware.gpus) == 2  # the bars still show both cards
    first, second = (g.name for g in hw.gpus)
    names = {d.name for d in o.fit.footprint.devices}
    assert second in names and first not in names
    argv = list(o.command.argv)
    assert argv[argv.index("--device") + 1] == "CUDA1"


def test_context_beyond_trained_is_kept(qtbot, panel: PlanPanel, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    dense = entry_of(tmp_path, "llama")
    assert dense.meta is not None
    trained = dense.meta.context_length
    assert trained == 4096
    panel.set_entry(dense)
    assert panel.ctx_max.text() == "trained context 4,096 tokens"
    panel.ctx_spin.lineEdit().selectAll()
    with qtbot.waitSignal(panel.changed):
        qtbot.keyClicks(panel.ctx_spin, "32768")
        qtbot.keyClick(panel.ctx_spin, Qt.Key.Key_Return)
    assert panel.ctx_spin.value() == 32768  # not 3,328 (the keystrokes cut at the trained max)
    assert panel.settings().ctx_size == 32768
    assert panel.ctx_slider.value() == panel.ctx_slider.maximum()
    note = panel.ctx_max.text()
    assert "32,768 is beyond the trained 4,096" in note and "caps each slot at 4,096" in note
    # back within the trained context: the plain line again
    panel.ctx_slider.setValue(8)
    assert panel.ctx_spin.value() == 2048
    assert panel.ctx_max.text() == "trained context 4,096 tokens"
    # a saved override beyond trained is shown as it is
    panel.apply(LaunchSettings(ctx_size=65536))
    assert panel.ctx_spin.value() == 65536 and "65,536 is beyond" in panel.ctx_max.text()
