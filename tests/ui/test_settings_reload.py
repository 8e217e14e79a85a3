"""The window and the CLI share settings.json: a change the CLI makes while the window is open
is picked up by the window (the file watcher), shown (rescan, Backend column), and kept when
the window saves its own change afterwards, even one made before it noticed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt

from qmgui.settings import Settings, load_settings, save_settings
from qmgui.ui.main_window import MainWindow
from qmgui.ui.model_table import COLUMN_KEYS
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle

WAIT_MS = 10_000


def cli(*argv: str) -> str:
    """`qmgui ARGV` in its own process, as a user in a terminal runs it; its output."""
    done = subprocess.run(
        [sys.executable, "-m", "qmgui", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def exe(tmp_path: Path) -> Path:
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.fixture
def window(qtbot, models: Path) -> Iterator[MainWindow]:  # type: ignore[no-untyped-def]
    """A window on a settings file that already names the models folder."""
    save_settings(Settings(model_roots=[str(models)]))
    w = MainWindow(load_settings(), probe=False, tray=False)
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    w.start()
    settle(qtbot, w)
    yield w
    w.close()
    w.shutdown()


def backend_label(w: MainWindow, name_part: str) -> object:
    m, column = w.table.model, COLUMN_KEYS.index("backend")
    row = next(r for r in range(m.rowCount()) if name_part in m.entry(r).name)
    return m.data(m.index(row, column), Qt.ItemDataRole.DisplayRole)


def test_the_window_follows_a_backend_the_cli_adds_and_keeps_it_when_saving(  # type: ignore[no-untyped-def]
    qtbot, window: MainWindow, exe: Path, tmp_path: Path
) -> None:
    w = window
    assert w.settings.backends == []
    assert "added cli-llama" in cli(
        "backends", "add", "cli-llama", "--kind", "llama", "--exe", str(exe), "--no-probe"
    )
    qtbot.waitUntil(lambda: [b.id for b in w.settings.backends] == ["cli-llama"], timeout=WAIT_MS)
    # shown: the Backend column follows the new registry
    qtbot.waitUntil(lambda: backend_label(w, "qwen2") == "cli-llama", timeout=WAIT_MS)
    # the window's own change afterwards keeps the CLI's
    more = tmp_path / "more"
    write_gguf(more / "extra.gguf", PRESETS["llama"])
    w.add_roots([str(more)])
    w.close()
    on_disk = load_settings().settings
    assert [b.id for b in on_disk.backends] == ["cli-llama"]
    assert str(more) in on_disk.model_roots
    assert on_disk.ui.window_geometry  # the window's state was saved too


def test_a_window_save_before_it_noticed_keeps_the_cli_change(  # type: ignore[no-untyped-def]
    qtbot, window: MainWindow, exe: Path
) -> None:
    """The CLI writes, and the window saves at once, with its stale copy (no event processed
    in between): the save merges into the file instead of writing the old registry back."""
    w = window
    cli("backends", "add", "cli-llama", "--kind", "llama", "--exe", str(exe), "--no-probe")
    assert w.settings.backends == []  # not noticed yet: no event loop ran
    w.fleet.toggle_favourite("some-model")  # a save through the window's own path
    on_disk = load_settings().settings
    assert [b.id for b in on_disk.backends] == ["cli-llama"]
    assert on_disk.favourites == ["some-model"]
    # and the window's copy is the merged one at once
    assert [b.id for b in w.settings.backends] == ["cli-llama"]


def test_a_root_the_cli_adds_is_scanned(qtbot, window: MainWindow, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    w = window
    before = w.table.model.rowCount()
    more = tmp_path / "more"
    write_gguf(more / "extra-llama.gguf", PRESETS["llama"])
    # a script of the user's: load, change, save
    script = (
        "import sys\n"
        "from qmgui.settings import load_settings, save_settings\n"
        "loaded = load_settings()\n"
        "loaded.settings.model_roots.append(sys.argv[1])\n"
        "save_settings(loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(more)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    qtbot.waitUntil(lambda: str(more) in w.settings.model_roots, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: w.table.model.rowCount() == before + 1, timeout=WAIT_MS)
    settle(qtbot, w)
    assert any("extra-llama" in e.name for e in w.table.model.entries)


def test_a_hand_edit_half_way_is_not_moved_aside(qtbot, window: MainWindow) -> None:  # type: ignore[no-untyped-def]
    """The watcher only looks: a file that does not parse (an editor mid-save) stays where it
    is, and the window keeps its settings until the file is whole again."""
    w = window
    path = load_settings().path
    assert path is not None
    path.write_text('{"schema_version": 1, "model_roots": [', encoding="utf-8")
    qtbot.wait(600)
    assert path.read_text("utf-8").endswith("[")
    assert not list(path.parent.glob("settings.json.bad-*"))
    assert w.settings.model_roots != []
    path.write_text('{"schema_version": 1, "favourites": ["by-hand"]}', encoding="utf-8")
    qtbot.waitUntil(lambda: w.settings.favourites == ["by-hand"], timeout=WAIT_MS)


def test_the_backends_dialog_saves_its_edit_into_the_file_as_it_is_now(qtbot, exe: Path) -> None:  # type: ignore[no-untyped-def]
    """The dialog edits a copy; an entry the CLI added while it was open survives its Save,
    and shows in it afterwards."""
    from qmgui.settings import BackendEntry
    from qmgui.ui.backends_dialog import BackendsDialog

    save_settings(Settings(backends=[BackendEntry(id="a", kind="llama", executable=str(exe))]))
    d = BackendsDialog(None, settings_loader=load_settings)
    qtbot.addWidget(d)
    cli("backends", "add", "cli-b", "--kind", "vllm", "--exe", str(exe), "--no-probe")
    assert d.set_star("a", "llm") is None
    assert d.save()
    on_disk = load_settings().settings
    assert [(b.id, b.default_for) for b in on_disk.backends] == [("a", ["llm"]), ("cli-b", [])]
    assert [b.id for b in d.backends] == ["a", "cli-b"]


def test_a_first_run_window_sees_the_file_the_cli_creates(qtbot, exe: Path) -> None:  # type: ignore[no-untyped-def]
    """No config folder yet when the window opens: the first file anyone writes is seen."""
    from qmgui.settings import config_dir

    assert not config_dir().exists()
    w = MainWindow(load_settings(), probe=False, tray=False)
    qtbot.addWidget(w)
    w.start()
    try:
        cli("backends", "add", "first", "--kind", "llama", "--exe", str(exe), "--no-probe")
        qtbot.waitUntil(lambda: [b.id for b in w.settings.backends] == ["first"], timeout=WAIT_MS)
    finally:
        w.close()
        w.shutdown()
    assert [b.id for b in load_settings().settings.backends] == ["first"]
