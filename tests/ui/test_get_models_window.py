"""The window opens the Get models dialog (Ctrl+Shift+G); what it downloads shows up in the
table: its folder is added as a model root (once) and scanned."""

from __future__ import annotations

from pathlib import Path

from qmgui.ui.get_models import GetModelsDialog
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle


def names(w) -> set[str]:  # type: ignore[no-untyped-def]
    return {e.name for e in w.table.model.entries}


def test_get_models_opens_once_and_its_downloads_are_scanned(  # type: ignore[no-untyped-def]
    qtbot, make_window, tmp_path: Path
) -> None:
    root = tmp_path / "models"
    root.mkdir()
    write_gguf(root / "already-here.gguf", PRESETS["llama"])
    w = make_window([str(root)])
    settle(qtbot, w)
    assert w.get_models_action.shortcut().toString() == "Ctrl+Shift+G"
    w.get_models_action.trigger()
    dialog = w.open_get_models()
    assert isinstance(dialog, GetModelsDialog) and dialog.isVisible()
    assert dialog is w.open_get_models()  # one dialog: a download goes on behind it
    assert dialog.folder.text() == str(root)
    # a download into the root: rescanned, not added twice
    write_gguf(root / "fetched.gguf", PRESETS["llama"])
    dialog._downloaded([str(root / "fetched.gguf")])  # type: ignore[misc]
    qtbot.waitUntil(lambda: "fetched" in names(w), timeout=10_000)
    assert w.roots().count(str(root)) == 1
    # into another folder: that folder becomes a root
    other = tmp_path / "elsewhere"
    other.mkdir()
    write_gguf(other / "far-away.gguf", PRESETS["llama"])
    dialog._downloaded([str(other / "far-away.gguf")])  # type: ignore[misc]
    qtbot.waitUntil(lambda: "far-away" in names(w), timeout=10_000)
    assert str(other) in w.roots()
    dialog.close()
