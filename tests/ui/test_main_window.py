"""The main window with pytest-qt: scanning, selection, re-planning, what-if, drops, keys."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QWidget

from qmgui import notify
from qmgui.settings import load_settings
from qmgui.ui.main_window import PAGE_EMPTY, PAGE_MODELS, MainWindow
from tests.ui.conftest import settle


def drop(target: QWidget, *paths: Path) -> None:
    """Enter, move and drop, as a file manager would, onto `target`."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    actions = Qt.DropAction.CopyAction
    buttons, mods = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    pos = QPointF(10, 10)
    enter = QDragEnterEvent(pos, actions, mime, buttons, mods)
    QApplication.sendEvent(target, enter)
    assert enter.isAccepted()
    QApplication.sendEvent(target, QDragMoveEvent(pos, actions, mime, buttons, mods))
    QApplication.sendEvent(target, QDropEvent(pos, actions, mime, buttons, mods))


def select(qtbot, w: MainWindow, name: str) -> None:  # type: ignore[no-untyped-def]
    assert w.table.select_name(name)
    settle(qtbot, w)
    assert w.outcome is not None


def test_empty_state_then_drop_a_folder(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window()
    settle(qtbot, w)
    assert w.pages.currentIndex() == PAGE_EMPTY
    assert w.empty.button.text() == "Add folder…"
    assert w.plan_panel.entry is None

    drop(w.empty, models)
    settle(qtbot, w)
    assert w.pages.currentIndex() == PAGE_MODELS
    assert w.table.model.rowCount() == 4
    # the root is saved, and the first row is selected and planned
    assert str(models) in load_settings().settings.model_roots
    assert w.outcome is not None


def test_drop_on_the_table_and_refusals(qtbot, make_window, models: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models / "split")])
    settle(qtbot, w)
    assert w.table.model.rowCount() == 1
    drop(w.table.view.viewport(), models / "tiny-llama.gguf")
    settle(qtbot, w)
    assert w.table.model.rowCount() == 2

    notes = tmp_path / "notes.txt"
    notes.write_text("not a model")
    drop(w.table.view.viewport(), notes)
    settle(qtbot, w)
    assert w.table.model.rowCount() == 2
    assert any("notes.txt" in m.text for m in notify.notifier.history)
    qtbot.waitUntil(lambda: "notes.txt" in w.statusBar().currentMessage())


def test_select_shows_bars_and_preview(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)], hardware_choice="RTX 4090")
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    o = w.outcome
    assert o is not None and o.entry.name.startswith("tiny-llama")
    assert o.fit is not None and o.fit.fits
    # one bar per GPU and one for system RAM, showing the plan's numbers
    assert next(b.spec.title for b in w.memory.bars if b.spec).startswith("GPU0 (RTX 4090)")
    assert len(w.memory.bars) == 2
    gpu = w.memory.bars[0].spec
    assert gpu is not None and gpu.used == o.fit.footprint.devices[0].total
    assert "tiny-llama.gguf" in w.preview.text.toPlainText()
    assert "-c 4096" in w.preview.text.toPlainText()  # the trained context (< 8192)
    w.preview.set_shell("powershell")
    assert w.preview.text.toPlainText() == o.powershell
    w.preview.copy()
    assert QApplication.clipboard().text() == o.powershell


def test_context_change_replans_bars_and_preview(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)], hardware_choice="RTX 4090")
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    before = w.outcome
    assert before is not None and before.fit is not None
    kv_before = before.fit.footprint.devices[0].kv
    # several quick changes coalesce into one throttled plan of the last value
    for value in (3000, 2500, 1000):
        w.plan_panel.ctx_spin.setValue(value)
    assert w.plan_panel.ctx_spin.value() == 1024  # snapped to a multiple of 256
    settle(qtbot, w)
    after = w.outcome
    assert after is not None and after.fit is not None
    assert after.settings.ctx_size == 1024
    assert after.fit.footprint.devices[0].kv < kv_before
    assert "-c 1024" in w.preview.text.toPlainText()
    assert w.memory.bars[0].spec is not None
    assert w.memory.bars[0].spec.used == after.fit.footprint.devices[0].total

    w.plan_panel.ctk.setCurrentText("q8_0")
    settle(qtbot, w)
    assert w.outcome is not None and w.outcome.settings.cache_type_k == "q8_0"
    assert "q8_0" in w.preview.text.toPlainText()


def test_what_if_replans_selection_and_badges(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    w.hardware_box.setCurrentText("2× RTX 3090")
    settle(qtbot, w)
    assert w.hardware.label == "2× RTX 3090"
    assert w.outcome is not None and len(w.outcome.hardware.gpus) == 2
    assert len(w.memory.bars) == 3
    entry = w.outcome.entry
    badge = w.table.model.badge(entry.id)
    assert badge is not None and "RTX 3090" in badge.detail


def test_does_not_fit_and_nearest_fit(qtbot, make_window, big_model: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(big_model)], hardware_choice="4GiB")
    settle(qtbot, w)
    select(qtbot, w, "llama3")
    o = w.outcome
    assert o is not None and o.fit is not None and not o.fit.fits
    assert w.memory.bars[0].spec is not None and w.memory.bars[0].spec.over
    assert "Does not fit" in w.memory.verdict.text()
    assert not w.memory.nearest.isHidden()
    badge = w.table.model.badge(o.entry.id)
    assert badge is not None and badge.badge.value == "partial offload"

    w.memory.nearest.click()
    settle(qtbot, w)
    fixed = w.outcome
    assert fixed is not None and fixed.fit is not None and fixed.fit.fits
    assert fixed.settings.n_gpu_layers is not None and fixed.settings.n_gpu_layers < 33
    assert w.memory.nearest.isHidden()


def test_fit_context_button(qtbot, make_window, big_model: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(big_model)], hardware_choice="RTX 3060 12 GB")
    settle(qtbot, w)
    select(qtbot, w, "llama3")
    w.plan_panel.fit_button.click()
    settle(qtbot, w)
    assert w.outcome is not None and w.outcome.fit is not None and w.outcome.fit.fits
    assert w.plan_panel.ctx_spin.value() == 8192  # the whole trained context fits 12 GB


def test_filter_and_shortcuts(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)])
    settle(qtbot, w)
    w.activateWindow()
    w.focus_filter()
    assert w.table.filter.hasFocus() or QApplication.focusWidget() is w.table.filter
    qtbot.keyClicks(w.table.filter, "qwen2")
    assert w.table.proxy.rowCount() == 1
    w.table.filter.clear()
    assert w.table.proxy.rowCount() == 4
    assert w.add_action.shortcut().toString() == "Ctrl+O"
    assert w.rescan_action.shortcut().toString() == "F5"
    assert w.quit_action.shortcut().toString() == "Ctrl+Q"
    w.rescan_action.trigger()
    settle(qtbot, w)
    assert w.table.model.rowCount() == 4


def test_ui_state_saved_on_close(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "qwen3")
    w.table.view.sortByColumn(4, Qt.SortOrder.DescendingOrder)
    w.close()
    ui = load_settings().settings.ui
    assert ui.window_geometry
    assert ui.sort_column == "size" and ui.sort_order == "descending"
    assert set(ui.splitter_sizes) == {"main", "detail"}
    assert "fit" in ui.column_widths
    assert ui.last_model_id is not None and "qwen3" in ui.last_model_id

    again = MainWindow(load_settings(), probe=False)
    qtbot.addWidget(again)
    again.start()
    settle(qtbot, again)
    current = again.table.current_entry()
    assert current is not None and current.id == ui.last_model_id
    again.close()


def test_tray_and_backends_are_wired(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    """With the tray on (offscreen there is no system tray): closing with no engine running
    quits as before; the Backends action opens the registry dialog over the window's models."""
    from qmgui.ui.backends_dialog import BackendsDialog

    w = make_window([str(models)], tray=True)
    settle(qtbot, w)
    assert w.tray is not None
    assert w.backends_action.shortcut().toString() == "Ctrl+B"
    w.backends_action.trigger()
    dialogs = list(w.findChildren(BackendsDialog))
    assert len(dialogs) == 1
    dialogs[0].close()
    assert w.close()


def test_backend_column_follows_the_registry(qtbot, tmp_path: Path, models: Path) -> None:  # type: ignore[no-untyped-def]
    """The table says which backend would serve each model, and why, from the registry."""
    from qmgui.settings import BackendEntry, LoadResult, Settings
    from qmgui.ui.model_table import COLUMN_KEYS

    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n", encoding="utf-8")
    exe.chmod(0o755)
    settings = Settings(
        model_roots=[str(models)],
        backends=[BackendEntry(id="cuda", kind="llama", executable=str(exe), default_for=["llm"])],
    )
    w = MainWindow(LoadResult(settings), probe=False, tray=False)
    qtbot.addWidget(w)
    w.start()
    settle(qtbot, w)
    column = COLUMN_KEYS.index("backend")
    m = w.table.model
    labels = {m.entry(r).name: m.data(m.index(r, column)) for r in range(m.rowCount())}
    tips = {
        m.entry(r).name: m.data(m.index(r, column), Qt.ItemDataRole.ToolTipRole)
        for r in range(m.rowCount())
    }
    llm = next(n for n in labels if "qwen2" in n)
    assert labels[llm] == "cuda"
    assert "★ default for llm" in tips[llm]
    w.close()


def test_first_run_offers_the_usual_folders(qtbot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """No models and no roots: ~/models (and the like) is offered, one click adds and scans it."""
    import os

    from tests.synth.factory import PRESETS, write_gguf

    home = Path(os.environ["HOME"])
    write_gguf(home / "models" / "tiny.gguf", PRESETS["llama"])
    w = make_window([])
    settle(qtbot, w)
    assert w.table.model.rowCount() == 0
    qtbot.waitUntil(w.empty.offer_button.isVisible, timeout=10_000)
    assert str(home / "models") in w.empty.offer.text()
    w.empty.offer_button.click()
    settle(qtbot, w)
    assert w.table.model.rowCount() == 1
    assert str(home / "models") in w.settings.model_roots


def test_the_preview_shows_secrets_redacted_and_copies_them(
    qtbot, make_window, models: Path
) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)], hardware_choice="RTX 4090")
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    w.plan_panel.extra_args_edit.setText("--api-key s3cret-key")
    w.plan_panel.extra_args_edit.editingFinished.emit()
    qtbot.waitUntil(lambda: w.outcome is not None and "s3cret-key" in w.outcome.bash)
    qtbot.waitUntil(lambda: "<redacted>" in w.preview.text.toPlainText())
    assert "s3cret-key" not in w.preview.text.toPlainText()
    w.preview.copy()
    assert "s3cret-key" in QApplication.clipboard().text()  # what runs, for the user's own use


# --- Start, and messages that end with their work ---------------------------------------


def test_added_scanning_message_ends_with_the_scan(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window()
    settle(qtbot, w)
    w.add_roots([str(models)])
    assert w.statusBar().currentMessage() == "Added models; scanning…"
    settle(qtbot, w)
    assert w.table.model.rowCount() > 0
    assert "scanning" not in w.statusBar().currentMessage()


def test_start_under_a_what_if_profile_asks_then_plans_here(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path, monkeypatch
) -> None:
    from PySide6.QtWidgets import QMessageBox

    from qmgui.ui import hardware

    w = make_window([str(models)], hardware_choice="2× RTX 3090")
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    started: list[object] = []
    monkeypatch.setattr(w.fleet, "start", lambda o: started.append(o) or 7)
    assert "asks to plan for this machine" in w.start_button.toolTip()
    # Start asks; Cancel leaves everything as it was
    assert w.start_engine() is None
    box = w.what_if_box
    assert box is not None and box.isVisible() and "2× RTX 3090" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: w.what_if_box is None)
    assert not started and w.hardware.what_if
    # "Plan for this machine and start": the plan switches, then the engine starts with it
    w.start_button.click()
    box = w.what_if_box
    assert box is not None
    (switch,) = [b for b in box.buttons() if "this machine" in b.text()]
    switch.click()
    qtbot.waitUntil(lambda: bool(started), timeout=30_000)
    settle(qtbot, w)
    assert w.hardware.label == hardware.THIS_MACHINE and not w.hardware.what_if
    (outcome,) = started
    assert outcome is w.outcome and not outcome.hardware.what_if  # type: ignore[attr-defined]
    assert "asks" not in w.start_button.toolTip()


def test_start_on_a_running_model_selects_its_engine(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path, monkeypatch
) -> None:
    from qmgui.ui.engine_runner import Engine

    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    entry = w.plan_panel.entry
    assert entry is not None
    started: list[object] = []
    monkeypatch.setattr(w.fleet, "start", lambda o: started.append(o) or 99)
    # an engine of another model and one of this model, both starting (not ended)
    runner = w.engine_runner
    runner.engines[41] = Engine(41, "other", None, None, model_id="/other.gguf")
    runner.engines[42] = Engine(42, entry.name, None, None, model_id=entry.id)
    runner.added.emit(41)
    runner.added.emit(42)
    runner.changed.emit(42)
    w.engines_panel.select(41)
    w.engines_dock.hide()
    try:
        assert w.start_button.text() == "Show engine" and w.start_button.isEnabled()
        w.start_button.click()
        assert w.engines_panel.selected_id() == 42
        w.engines_panel.select(41)
        assert w.start_engine() == 42
        assert not started  # no second copy
        assert w.engines_dock.isVisible()
        assert w.engines_panel.selected_id() == 42
        assert "running already" in w.statusBar().currentMessage()
    finally:
        runner.engines.clear()


def test_the_window_plans_for_a_card_that_appears(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    """Seeds row 99: a live reading with GPUs this machine did not have at start (a driver
    that came up late) makes the window plan for them: toolbar, plan and badges."""
    from qmgui.hw.nvml import read_nvml
    from qmgui.ui.occupancy import LiveReading
    from tests.hw.fake_nvml import FakeNvml

    w = make_window([str(models)])
    settle(qtbot, w)
    assert w.hardware.gpus == ()  # this machine: no GPU
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
    reading = read_nvml(nvml=FakeNvml(str(fixture / "two-gpus-with-processes.json")))
    w.fleet.live = LiveReading(reading, None, None, ())
    w.fleet.liveChanged.emit()
    assert len(w.hardware.gpus) == 2 and not w.hardware.what_if
    assert w.hardware_label.text().startswith("2 GPUs")
    settle(qtbot, w)
    assert w.outcome is not None and w.outcome.hardware.gpus == w.hardware.gpus
