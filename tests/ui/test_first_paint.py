"""The window shown first and built after its first paint (issue 13, "the window mapped in
< 0.7 s"): what is read before the paint, the "Starting…" page, the build that follows it, and
a window closed before it is built."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel, QMainWindow, QWidget

from qmgui.settings import load_settings, settings_path, update_settings
from qmgui.ui.first_paint import MAX_BYTES, BuildAfterPaint, FirstPaint, read_first_paint
from qmgui.ui.main_window import ENGINES_DOCK_HEIGHT, MainWindow
from qmgui.ui.model_table import ModelTable


def _write(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_first_paint_reads_the_theme_and_the_geometry(tmp_path: Path) -> None:
    path = _write(tmp_path / "s.json", {"ui": {"theme": "dark", "window_geometry": "AAAA"}})
    assert read_first_paint(path) == FirstPaint("dark", "AAAA")


@pytest.mark.parametrize(
    "content",
    [
        None,  # no file: a first start
        b"{not json",
        b"[1, 2]",
        json.dumps({"ui": "dark"}).encode(),
        json.dumps({"ui": {"theme": "neon", "window_geometry": 42}}).encode(),
        json.dumps({"ui": {"theme": ["dark"]}}).encode(),
        b"[" * 100_000 + b"]" * 100_000,  # deeper than json's recursion
        b" " * (MAX_BYTES + 1) + b'{"ui": {"theme": "dark"}}',  # huge: left to the real load
    ],
)
def test_first_paint_gives_the_defaults_for_anything_else(
    tmp_path: Path, content: bytes | None
) -> None:
    path = tmp_path / "s.json"
    if content is not None:
        path.write_bytes(content)
    assert read_first_paint(path) == FirstPaint()


def test_the_window_paints_starting_then_builds_itself(qtbot) -> None:  # type: ignore[no-untyped-def]
    other = QMainWindow()  # a geometry as saveGeometry() writes it
    qtbot.addWidget(other)
    other.resize(700, 500)  # within the offscreen screen (800x600), so restored as it was
    other.show()
    qtbot.waitExposed(other)
    size = (other.width(), other.height())
    saved = base64.b64encode(bytes(other.saveGeometry().data())).decode()
    other.close()
    update_settings(
        lambda s: s.model_copy(
            update={
                "favourites": ["kept"],
                "ui": s.ui.model_copy(update={"window_geometry": saved}),
            }
        )
    )
    first = read_first_paint()
    assert first == FirstPaint("system", saved)

    w = MainWindow(tray=False, deferred=first)
    qtbot.addWidget(w)
    ran: list[bool] = []
    w.when_built(lambda: ran.append(w.built))
    assert not w.built and ran == []
    page = w.centralWidget()
    assert isinstance(page, QLabel) and page.text() == "Starting qmgui…"
    assert (w.width(), w.height()) == size  # the saved size from the first paint on
    assert w.findChild(ModelTable) is None

    w.show()
    qtbot.waitUntil(lambda: w.built, timeout=20_000)
    assert ran == [True]  # what waited for the build ran once, after it
    assert isinstance(w.table, ModelTable) and w.pages.isVisible()  # the Starting page replaced
    assert w.settings.favourites == ["kept"]  # the settings were loaded by the build
    assert w.height() == size[1]  # the build kept it (the whole window may be wider)
    # the Engines dock a modest strip, as in a window built before it is shown (a dock added
    # to a shown window takes what the central widget leaves)
    qtbot.waitUntil(lambda: w.engines_dock.height() <= ENGINES_DOCK_HEIGHT + 8, timeout=2000)
    w.when_built(lambda: ran.append(True))  # once built: at once
    assert ran == [True, True]
    w.close()
    w.shutdown()


def test_a_window_closed_before_it_is_built_is_never_built(qtbot) -> None:  # type: ignore[no-untyped-def]
    before = settings_path().read_bytes() if settings_path().exists() else None
    w = MainWindow(deferred=FirstPaint())
    qtbot.addWidget(w)
    w.show()
    w.close()  # at once, before the event loop ran the build
    w.save_state()  # the quit path's calls are harmless
    w.shutdown()
    qtbot.wait(300)
    assert not w.built
    assert (settings_path().read_bytes() if settings_path().exists() else None) == before


def test_a_build_that_fails_is_said_not_swallowed(qtbot, capsys) -> None:  # type: ignore[no-untyped-def]
    host = QWidget()
    qtbot.addWidget(host)

    def fail() -> None:
        raise RuntimeError("the build broke")

    ended: list[bool] = []
    later = BuildAfterPaint(host, fail, failed=lambda: ended.append(True))
    host.show()
    qtbot.waitUntil(lambda: not later.pending, timeout=5000)
    assert "RuntimeError: the build broke" in capsys.readouterr().err
    assert ended == [True]  # the program ends (EXIT_BUILD_FAILED), not "Starting…" for ever


def test_the_real_load_still_judges_the_file(qtbot) -> None:  # type: ignore[no-untyped-def]
    """A file the first paint cannot use is left alone by it; the build's load moves it
    aside and says so, as it always did."""
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"ui": {"theme": "dark"}, "schema_version": "x"}', encoding="utf-8")
    first = read_first_paint()
    assert first.theme == "dark"  # the paint's guess
    w = MainWindow(tray=False, deferred=first)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.built, timeout=20_000)
    assert w._loaded.moved_aside is not None
    assert load_settings().settings.ui.theme == "system"
    w.close()
    w.shutdown()
