"""The Backends dialog with pytest-qt: add (probed on a worker), edit, remove + undo, ★ per
class, what each entry serves, and a settings file that must not be overwritten."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QDialogButtonBox, QMessageBox

from qmgui.core.backends import Backend
from qmgui.core.discovery import ModelEntry
from qmgui.core.meta import ModelClass, ModelMeta
from qmgui.engines.llama_run import find_llama_server
from qmgui.settings import (
    BackendEntry,
    LoadResult,
    ModelOverride,
    Settings,
    load_settings,
    save_settings,
)
from qmgui.ui.backends_dialog import NO_BACKEND, NO_DEFAULT, BackendEditor, BackendsDialog

PROBE_MS = 60_000

FAKE_SERVER = """#!/bin/sh
case "$1" in
  --version) echo "version: 4500 (adc5dd92)"; echo "built with cc for x86_64-linux-gnu" ;;
  --help)
    echo "----- common params -----"
    echo "-h,    --help                           print usage and exit"
    echo "-c,    --ctx-size N                     size of the prompt context"
    ;;
  --list-devices)
    echo "Available devices:"
    echo "  Vulkan0: Fake GPU 9000 (8192 MiB, 8000 MiB free)"
    ;;
esac
exit 0
"""


def fake_server(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "llama-server"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(FAKE_SERVER)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def make_meta(model_class: str) -> ModelMeta:
    return ModelMeta(
        format="gguf",
        architecture="llama",
        name="t",
        model_class=ModelClass(model_class),
        quant="F16",
        param_count=1,
        weight_bytes=1,
        context_length=8192,
        n_layer=1,
        n_embd=64,
        n_head=(4,),
        n_head_kv=(2,),
        head_dim_k=16,
        head_dim_v=16,
    )


def model(model_class: str) -> ModelEntry:
    path = f"/m/{model_class}.gguf"
    return ModelEntry(
        id=path,
        path=path,
        name=f"{model_class} model",
        format="gguf",
        source="folder",
        size_bytes=1,
        meta=make_meta(model_class),
    )


def entry(backend_id: str, kind: str, *, star: tuple[str, ...] = ()) -> BackendEntry:
    return BackendEntry.from_core(
        Backend(id=backend_id, kind=kind, executable=f"/opt/{backend_id}", default_for=star)
    )


@pytest.fixture
def settings_file(tmp_path: Path) -> Path:
    return tmp_path / "config" / "settings.json"


@pytest.fixture
def make_dialog(qtbot, settings_file: Path) -> Iterator[Callable[..., BackendsDialog]]:  # type: ignore[no-untyped-def]
    """Dialogs on `settings_file` (or a given loader); every probe thread is joined at the end."""
    made: list[BackendsDialog] = []

    def make(
        *backends: BackendEntry,
        loader: Callable[[], LoadResult] | None = None,
        **kw: object,
    ) -> BackendsDialog:
        if backends:
            save_settings(Settings(backends=list(backends)), settings_file)
        d = BackendsDialog(
            None,
            settings_loader=loader or (lambda: load_settings(settings_file)),
            **kw,  # type: ignore[arg-type]
        )
        qtbot.addWidget(d)
        d.show()
        made.append(d)
        return d

    yield make
    for d in made:
        if d.editor is not None:
            d.editor.wait()
        d.close()


def wait_probe(qtbot, editor: BackendEditor) -> None:  # type: ignore[no-untyped-def]
    qtbot.waitUntil(lambda: not editor.probing and editor.last_probe is not None, timeout=PROBE_MS)


def column(d: BackendsDialog, name: str) -> list[str]:
    from qmgui.ui.backends_dialog import COLUMNS

    col = COLUMNS.index(name)
    return [d.table.item(r, col).text() for r in range(d.table.rowCount())]  # type: ignore[union-attr]


def serves(d: BackendsDialog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in range(d.serves.topLevelItemCount()):
        top = d.serves.topLevelItem(i)
        assert top is not None
        key = top.data(0, Qt.ItemDataRole.UserRole) or NO_BACKEND
        out[key] = [top.child(j).text(0) for j in range(top.childCount())]  # type: ignore[union-attr]
    return out


def save_button(d: BackendsDialog):  # type: ignore[no-untyped-def]
    return d.buttons.button(QDialogButtonBox.StandardButton.Save)


# --- add ------------------------------------------------------------------------------------


def test_add_a_fake_executable_probes_it_and_saves(
    qtbot,  # type: ignore[no-untyped-def]
    make_dialog,
    settings_file: Path,
    tmp_path: Path,
) -> None:
    exe = fake_server(tmp_path)
    d = make_dialog()
    assert d.table.rowCount() == 0
    assert not save_button(d).isEnabled()
    editor = d.add_backend()
    assert d.editor is editor
    ok = editor.buttons.button(QDialogButtonBox.StandardButton.Ok)
    assert not ok.isEnabled()  # no id, no executable yet
    editor.id_edit.setText("fake")
    editor.kind_combo.setCurrentText("llama")
    editor.exe_edit.setText(str(exe))
    editor.probe()
    wait_probe(qtbot, editor)
    report = editor.report.toPlainText()
    assert "Version: b4500" in report
    assert "Vulkan0: Fake GPU 9000" in report
    assert ok.isEnabled()
    ok.click()
    assert d.editor is None

    assert column(d, "ID") == ["fake"]
    assert column(d, "Version") == ["b4500"]
    assert column(d, "Variant") == ["vulkan"]
    assert column(d, "Serves") == ["llm, embedding, rerank"]
    assert column(d, "Executable") == [str(exe)]
    assert "Added fake" in d.status.text()
    assert save_button(d).isEnabled()
    assert d.save()
    stored = load_settings(settings_file).settings.backends
    assert [(b.id, b.kind, b.version, b.variant) for b in stored] == [
        ("fake", "llama", "b4500", "vulkan")
    ]
    assert "--ctx-size" in stored[0].capabilities["flags"]
    assert not save_button(d).isEnabled()  # nothing left to save


def test_add_refuses_a_duplicate_id_and_reports_a_failed_probe(
    qtbot,  # type: ignore[no-untyped-def]
    make_dialog,
    tmp_path: Path,
) -> None:
    d = make_dialog(entry("a", "llama"))
    editor = d.add_backend()
    ok = editor.buttons.button(QDialogButtonBox.StandardButton.Ok)
    editor.id_edit.setText("a")
    editor.exe_edit.setText(str(tmp_path / "missing-server"))
    assert not ok.isEnabled()
    assert "already exists" in editor.problem_label.text()
    editor.probe()
    wait_probe(qtbot, editor)
    assert "Probe failed" in editor.report.toPlainText()
    editor.id_edit.setText("b")
    assert ok.isEnabled()  # a missing binary is a warning: it may be installed later
    editor.accept()
    assert column(d, "ID") == ["a", "b"]
    assert column(d, "Version") == ["-", "-"]


@pytest.mark.skipif(find_llama_server() is None, reason="no llama-server found")
def test_add_the_real_llama_server_shows_its_version(qtbot, make_dialog) -> None:  # type: ignore[no-untyped-def]
    exe = find_llama_server()
    assert exe is not None
    d = make_dialog()
    editor = d.add_backend()
    editor.id_edit.setText("real")
    editor.exe_edit.setText(exe)
    editor.probe()
    wait_probe(qtbot, editor)
    result = editor.last_probe
    assert result is not None and result.ok, editor.report.toPlainText()
    assert result.version
    assert result.label in editor.report.toPlainText()
    editor.accept()
    assert column(d, "Version") == [result.version]


# --- edit, remove, undo ---------------------------------------------------------------------


def test_edit_keeps_the_id_and_drops_a_star_the_new_kind_cannot_hold(make_dialog) -> None:  # type: ignore[no-untyped-def]
    d = make_dialog(entry("a", "llama", star=("llm",)))
    assert d.select_id("a")
    editor = d.edit_selected()
    assert editor is not None and editor.id_edit.isReadOnly()
    editor.kind_combo.setCurrentText("whisper")
    editor.variant_edit.setText("cpu")
    editor.family_edit.setText("whisper")
    editor.accept()
    (b,) = d.backends
    assert (b.id, b.kind, b.variant, b.family) == ("a", "whisper", "cpu", "whisper")
    assert b.default_for == frozenset()
    assert "no longer ★ for llm" in d.status.text()


def test_remove_and_undo_with_buttons_and_keys(qtbot, make_dialog) -> None:  # type: ignore[no-untyped-def]
    d = make_dialog(entry("a", "llama", star=("llm",)), entry("b", "llama"), entry("w", "whisper"))
    d.activateWindow()
    assert not d.undo_button.isEnabled()
    assert d.select_id("a")
    d.remove_button.click()
    assert column(d, "ID") == ["b", "w"]
    assert "llm has no ★ now ('b' serves it)" in d.status.text()
    assert d.undo_button.isEnabled()
    d.undo_button.click()
    assert column(d, "ID") == ["a", "b", "w"]
    assert column(d, "★ Default for")[0] == "★ llm"
    assert not d.undo_button.isEnabled()

    # the keyboard: Delete on the table removes, Ctrl+Z undoes, Enter edits
    assert d.remove_action.shortcut().toString() == "Del"
    assert d.undo_action.shortcut() == QKeySequence(QKeySequence.StandardKey.Undo)
    assert d.select_id("w")
    d.table.setFocus()
    qtbot.keyClick(d.table, Qt.Key.Key_Delete)
    assert column(d, "ID") == ["a", "b"]
    qtbot.keyClick(d.table, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert column(d, "ID") == ["a", "b", "w"]
    assert d.selected_id() == "w"
    qtbot.keyClick(d.table, Qt.Key.Key_Return)
    assert d.editor is not None and d.editor.id_edit.text() == "w"
    d.editor.reject()


def test_undo_keeps_a_star_taken_since(make_dialog) -> None:  # type: ignore[no-untyped-def]
    d = make_dialog(entry("a", "llama", star=("llm",)), entry("b", "llama"))
    d.select_id("a")
    d.remove_selected()
    assert d.set_star("b", "llm") is None
    restored = d.undo_remove()
    assert restored is not None and restored.default_for == frozenset()
    assert "stays where it is now" in d.status.text()
    assert column(d, "★ Default for") == ["", "★ llm"]


# --- ★ defaults -----------------------------------------------------------------------------


def test_star_per_class_moves_and_says_from_where(make_dialog, settings_file: Path) -> None:  # type: ignore[no-untyped-def]
    d = make_dialog(entry("a", "llama", star=("llm",)), entry("b", "llama"), entry("w", "whisper"))
    combo = d.default_combos["llm"]
    assert combo.currentData() == "a"
    assert [combo.itemText(i) for i in range(combo.count())] == [NO_DEFAULT, "★ a", "★ b"]
    assert not d.default_combos["image"].isEnabled()  # nothing serves image

    combo.setCurrentIndex(combo.findData("b"))
    combo.activated.emit(combo.currentIndex())
    assert "★ b is now the default for llm (was a)" in d.status.text()
    assert column(d, "★ Default for") == ["", "★ llm", ""]

    problem = d.set_star("w", "llm")
    assert problem is not None and "does not serve llm" in problem
    assert d.set_star("w", "asr") is None
    assert d.default_combos["asr"].currentData() == "w"
    assert d.set_star(None, "llm") is None
    assert "llm has no ★ now (was b)" in d.status.text()
    assert d.default_combos["llm"].currentText() == NO_DEFAULT

    assert d.save()
    stored = {b.id: b.default_for for b in load_settings(settings_file).settings.backends}
    assert stored == {"a": [], "b": [], "w": ["asr"]}


# --- serves ---------------------------------------------------------------------------------


def test_serves_view_follows_the_registry(make_dialog, settings_file: Path) -> None:  # type: ignore[no-untyped-def]
    models = [model("llm"), model("embedding"), model("asr"), model("image")]
    d = make_dialog(
        entry("a", "llama", star=("llm",)),
        entry("b", "llama"),
        entry("w", "whisper"),
        models=models,
    )
    assert serves(d) == {
        "a": ["llm model", "embedding model"],
        "b": [],
        "w": ["asr model"],
        NO_BACKEND: ["image model"],
    }
    assert d.set_star("b", "embedding") is None
    assert serves(d)["b"] == ["embedding model"]
    d.select_id("w")
    d.remove_selected()
    assert serves(d)[NO_BACKEND] == ["asr model", "image model"]


def test_serves_view_honours_pins(make_dialog, settings_file: Path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(
        backends=[entry("a", "llama", star=("llm",)), entry("b", "llama")],
        model_overrides={"/m/llm.gguf": ModelOverride(backend_id="b")},
    )
    save_settings(settings, settings_file)
    d = make_dialog(models=[model("llm")])
    assert serves(d) == {"a": [], "b": ["llm model"]}


def test_registry_problems_are_shown(make_dialog) -> None:  # type: ignore[no-untyped-def]
    d = make_dialog(entry("w", "whisper"))
    bad = Backend(id="w2", kind="whisper", executable="/opt/w2", default_for={"llm"})
    d._change((*d.backends, bad), "test")
    assert d.problems.isVisible()
    assert "'w2' is ★ for llm" in d.problems.text()


# --- a settings file that could not be loaded -----------------------------------------------


def test_read_only_settings_are_never_overwritten(make_dialog, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "settings.json"
    path.write_text("{ not json")
    before = path.read_bytes()
    loaded = LoadResult(
        Settings(backends=[entry("a", "llama")]),
        messages=("Settings file is not valid JSON",),
        read_only=True,
        path=path,
    )
    d = make_dialog(loader=lambda: loaded)
    assert d.read_only
    assert d.banner.isVisible()
    assert "could not be loaded" in d.banner.text()
    assert "not valid JSON" in d.banner.text()
    d.select_id("a")
    d.remove_selected()
    assert d.dirty
    assert not save_button(d).isEnabled()
    assert not d.save()
    assert "cannot be saved" in d.status.text()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path).count("settings.json") == 1


# --- closing with unsaved changes -----------------------------------------------------------


def _answer(d: BackendsDialog, button: QMessageBox.StandardButton) -> None:
    box = d.unsaved_box
    assert box is not None and box.isVisible()
    assert box.button(button) is not None
    box.button(button).click()


def test_close_with_unsaved_changes_asks_save_discard_or_cancel(
    qtbot,
    make_dialog,
    settings_file: Path,  # type: ignore[no-untyped-def]
) -> None:
    b = QMessageBox.StandardButton
    d = make_dialog(entry("a", "llama", star=("llm",)), entry("b", "llama"))
    assert d.select_id("b")
    d.remove_selected()
    assert d.dirty

    # Cancel: still open, the change still there, nothing written
    d.buttons.button(QDialogButtonBox.StandardButton.Close).click()
    assert d.isVisible()
    _answer(d, b.Cancel)
    qtbot.waitUntil(lambda: d.unsaved_box is None)
    assert d.isVisible() and d.dirty and column(d, "ID") == ["a"]
    assert [e.id for e in load_settings(settings_file).settings.backends] == ["a", "b"]

    # Esc asks too; Save writes the change and closes
    qtbot.keyClick(d, Qt.Key.Key_Escape)
    assert d.isVisible()
    _answer(d, b.Save)
    qtbot.waitUntil(lambda: not d.isVisible())
    assert [e.id for e in load_settings(settings_file).settings.backends] == ["a"]


def test_close_discard_throws_the_changes_away_and_a_clean_dialog_just_closes(
    qtbot,
    make_dialog,
    settings_file: Path,  # type: ignore[no-untyped-def]
) -> None:
    b = QMessageBox.StandardButton
    d = make_dialog(entry("a", "llama", star=("llm",)))
    d.close()  # nothing changed: no question
    assert not d.isVisible() and d.unsaved_box is None

    d2 = make_dialog()
    d2.set_star(None, "llm")
    assert d2.dirty
    d2.close()  # the title bar's ×
    assert d2.isVisible()
    _answer(d2, b.Discard)
    qtbot.waitUntil(lambda: not d2.isVisible())
    assert load_settings(settings_file).settings.backends[0].to_core().default_for == {"llm"}
