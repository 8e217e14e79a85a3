"""The Model folders dialog and drops of nested folders, with pytest-qt: Remove rescans without
the removed folder's models, Undo (Ctrl+Z) puts it back, Add refuses a folder inside a root,
and a dropped subfolder of a root adds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from qmgui import notify
from qmgui.settings import Settings, load_settings, save_settings, update_settings
from qmgui.ui.main_window import MainWindow
from qmgui.ui.roots_dialog import RootsDialog
from tests.ui.conftest import settle
from tests.ui.test_main_window import drop


def names(w: MainWindow) -> list[str]:
    m = w.table.model
    return sorted(m.entry(r).name for r in range(m.rowCount()))


def open_dialog(qtbot, w: MainWindow) -> RootsDialog:  # type: ignore[no-untyped-def]
    w.roots_action.trigger()
    dialog = w.findChild(RootsDialog)
    assert isinstance(dialog, RootsDialog)
    qtbot.waitExposed(dialog)
    dialog.activateWindow()
    return dialog


def test_remove_rescans_without_its_models_and_undo_puts_it_back(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path
) -> None:
    split, vision = str(models / "split"), str(models / "vision")
    w = make_window([split, vision])
    settle(qtbot, w)
    assert any("qwen3" in n for n in names(w)) and len(names(w)) == 2
    dialog = open_dialog(qtbot, w)
    assert dialog.paths() == [split, vision]

    dialog.list.setCurrentRow(1)
    qtbot.mouseClick(dialog.remove_button, Qt.MouseButton.LeftButton)
    assert dialog.paths() == [split]
    assert load_settings().settings.model_roots == [split]
    settle(qtbot, w)
    assert len(names(w)) == 1 and not any("qwen3" in n for n in names(w))
    assert "Undo" in dialog.status.text() and dialog.undo_button.isEnabled()

    dialog.list.setFocus()
    qtbot.keyClick(dialog.list, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: dialog.paths() == [split, vision])
    assert load_settings().settings.model_roots == [split, vision]  # in its place again
    settle(qtbot, w)
    assert len(names(w)) == 2 and any("qwen3" in n for n in names(w))
    assert not dialog.undo_button.isEnabled()


def test_delete_key_removes_and_the_undo_button_restores(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)])
    settle(qtbot, w)
    dialog = open_dialog(qtbot, w)
    dialog.list.setFocus()
    qtbot.keyClick(dialog.list, Qt.Key.Key_Delete)
    qtbot.waitUntil(lambda: dialog.paths() == [])
    settle(qtbot, w)
    assert w.table.model.rowCount() == 0
    assert not dialog.remove_button.isEnabled()
    qtbot.mouseClick(dialog.undo_button, Qt.MouseButton.LeftButton)
    assert dialog.paths() == [str(models)]
    settle(qtbot, w)
    assert w.table.model.rowCount() == 4


def test_add_in_the_dialog_refuses_a_folder_inside_a_root(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = make_window([str(models)])
    settle(qtbot, w)
    dialog = open_dialog(qtbot, w)
    picked = [str(models / "vision")]
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: picked[0])
    qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    assert dialog.paths() == [str(models)]
    assert any("inside the model folder" in m.text for m in notify.notifier.history)
    assert dialog.status.text().startswith(f"{models / 'vision'} is inside {models}")
    other = tmp_path / "other"
    other.mkdir()
    picked[0] = str(other)
    qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    assert dialog.paths() == [str(models), str(other)]
    assert load_settings().settings.model_roots == [str(models), str(other)]


def test_a_dropped_subfolder_of_a_root_adds_nothing(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models)])
    settle(qtbot, w)
    drop(w.table.view.viewport(), models / "vision")
    drop(w.table.view.viewport(), models / "tiny-llama.gguf")
    settle(qtbot, w)
    assert w.settings.model_roots == [str(models)]
    assert w.table.model.rowCount() == 4
    texts = [m.text for m in notify.notifier.history]
    assert any("vision is inside the model folder" in t for t in texts)
    assert not any(t.startswith("added") for t in texts)


def test_a_dropped_parent_replaces_the_roots_inside_it(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    w = make_window([str(models / "split"), str(models / "vision")])
    settle(qtbot, w)
    drop(w.empty if w.pages.currentIndex() == 0 else w.table.view.viewport(), models)
    settle(qtbot, w)
    assert w.settings.model_roots == [str(models)]
    assert load_settings().settings.model_roots == [str(models)]
    assert w.table.model.rowCount() == 4


def test_the_dialog_follows_a_root_another_qmgui_adds(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path, tmp_path: Path
) -> None:
    save_settings(Settings(model_roots=[str(models / "split")]))
    w = make_window([str(models / "split")])
    settle(qtbot, w)
    dialog = open_dialog(qtbot, w)
    other = tmp_path / "other"
    other.mkdir()
    # what `qmgui roots add` does, from outside the window
    update_settings(lambda s: s.model_copy(update={"model_roots": [*s.model_roots, str(other)]}))
    qtbot.waitUntil(lambda: dialog.paths() == [str(models / "split"), str(other)], timeout=10_000)
