"""The tray's menu, actions, icon and close/quit policy, against a fake engine list.

Offscreen there is no system tray, so most tests drive the tray-unavailable path or force
availability with `tray_available=True`; one test runs a real tray under Xvfb + trayer and
skips where those are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QCloseEvent
from PySide6.QtWidgets import QApplication, QWidget

from qmgui import autostart
from qmgui.engines.supervisor import State
from qmgui.settings import Settings
from qmgui.ui import icons as icons_mod
from qmgui.ui.tray import (
    EXPLAINED_KEY,
    CloseDecision,
    EngineRow,
    Favourite,
    QuitChoice,
    RunnerEngines,
    Tray,
    app_icon,
    mark_explained,
    was_explained,
)


class FakeEngines(QObject):
    enginesChanged = Signal()

    def __init__(self, rows: Sequence[EngineRow] = ()) -> None:
        super().__init__()
        self.rows = list(rows)
        self.calls: list[tuple[str, str]] = []

    def engines(self) -> Sequence[EngineRow]:
        return list(self.rows)

    def set_state(self, key: str, state: State) -> None:
        self.rows = [
            EngineRow(r.key, r.name, state, r.url) if r.key == key else r for r in self.rows
        ]
        self.enginesChanged.emit()

    def stop_engine(self, key: str) -> None:
        self.calls.append(("stop", key))
        self.set_state(key, State.STOPPED)

    def start_engine(self, key: str) -> None:
        self.calls.append(("start", key))
        self.set_state(key, State.STARTING)


class FakePrompts:
    def __init__(self, quit_choice: QuitChoice = QuitChoice.CANCEL, close: bool = False) -> None:
        self.quit_choice = quit_choice
        self.close = close
        self.asked: list[str] = []
        self.informed: list[str] = []

    def ask_quit(self, running: Sequence[EngineRow]) -> QuitChoice:
        self.asked.append("quit:" + ",".join(r.key for r in running))
        return self.quit_choice

    def ask_close_without_tray(self, running: Sequence[EngineRow]) -> bool:
        self.asked.append("close:" + ",".join(r.key for r in running))
        return self.close

    def inform(self, title: str, text: str) -> None:
        self.informed.append(text)


class PolicyWindow(QWidget):
    """A window whose closeEvent delegates to the tray, as MainWindow's will."""

    def __init__(self) -> None:
        super().__init__()
        self.tray: Tray | None = None
        self.decisions: list[CloseDecision] = []
        self.shut_down = 0

    def closeEvent(self, event: QCloseEvent) -> None:
        assert self.tray is not None
        decision = self.tray.close_policy(event)
        self.decisions.append(decision)
        if decision is CloseDecision.QUIT:
            self.shut_down += 1  # MainWindow: save_state(); shutdown()


LLAMA = EngineRow("e1", "tiny-llama", State.READY, "http://127.0.0.1:8081")
QWEN = EngineRow("e2", "tiny-qwen3", State.LOADING, "http://127.0.0.1:8082")
OLD = EngineRow("e3", "old-model", State.STOPPED, None)


class Harness:
    def __init__(self, qtbot, rows: Sequence[EngineRow], available: bool, **prompts) -> None:  # type: ignore[no-untyped-def]
        self.window = PolicyWindow()
        qtbot.addWidget(self.window)
        self.engines = FakeEngines(rows)
        self.prompts = FakePrompts(**prompts)
        self.settings = Settings()
        self.saved: list[Settings] = []
        self.quits = 0
        self.tray = Tray(
            self.window,
            self.engines,
            load=lambda: self.settings,
            save=self._save,
            prompts=self.prompts,
            quit=self._quit,
            tray_available=available,
        )
        self.window.tray = self.tray
        self.window.show()

    def _save(self, s: Settings) -> None:
        self.settings = s
        self.saved.append(s)

    def _quit(self) -> None:
        self.quits += 1


@pytest.fixture
def make(qtbot) -> Iterator[Callable[..., Harness]]:  # type: ignore[no-untyped-def]
    quit_on_last = QApplication.quitOnLastWindowClosed()
    made: list[Harness] = []

    def build(rows: Sequence[EngineRow] = (), available: bool = False, **prompts) -> Harness:  # type: ignore[no-untyped-def]
        h = Harness(qtbot, rows, available, **prompts)
        made.append(h)
        return h

    yield build
    for h in made:
        h.tray._quitting = True  # let the windows close without questions
        h.tray.icon.hide()
    QApplication.setQuitOnLastWindowClosed(quit_on_last)


AUTOSTART = ["Start with the session"] if sys.platform.startswith("linux") else []


def texts(h: Harness) -> list[str]:
    return [a.text() for a in h.tray.menu.actions() if not a.isSeparator()]


# --- the menu -----------------------------------------------------------------------------------
def test_menu_lists_engines_favourites_show_and_quit(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, OLD])
    h.tray.set_favourites([Favourite("m/llama", "Llama 8B"), Favourite("m/qwen", "Qwen 3")])
    assert texts(h) == [
        "Engines",
        "tiny-llama — ready",
        "old-model — stopped",
        "Favourite models",
        "Start Llama 8B",
        "Start Qwen 3",
        *AUTOSTART,
        "Show window",
        "Quit",
    ]
    stop = h.tray.find_action("engine:e1", "stop")
    assert stop is not None and stop.isEnabled()
    assert h.tray.find_action("engine:e1", "start") is None
    assert h.tray.find_action("engine:e3", "start") is not None
    assert h.tray.find_action("engine:e3", "stop") is None
    copy = h.tray.find_action("engine:e1", "copy-url")
    assert copy is not None and copy.text() == "Copy http://127.0.0.1:8081"
    assert h.tray.find_action("engine:e3", "copy-url") is None


def test_empty_menu(make) -> None:  # type: ignore[no-untyped-def]
    h = make([])
    assert texts(h) == ["No engines running", *AUTOSTART, "Show window", "Quit"]


def test_stop_and_start_reach_the_source_and_the_menu_follows(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, OLD])
    h.tray.find_action("engine:e1", "stop").trigger()
    assert h.engines.calls == [("stop", "e1")]
    assert "tiny-llama — stopped" in texts(h)
    h.tray.find_action("engine:e3", "start").trigger()
    assert h.engines.calls[-1] == ("start", "e3")
    assert "old-model — starting" in texts(h)
    assert h.tray.find_action("engine:e3", "stop") is not None


def test_stopping_engine_has_stop_disabled(make) -> None:  # type: ignore[no-untyped-def]
    h = make([EngineRow("e1", "x", State.STOPPING)])
    assert not h.tray.find_action("engine:e1", "stop").isEnabled()


def test_favourite_emits_its_model_id(make, qtbot) -> None:  # type: ignore[no-untyped-def]
    h = make([])
    h.tray.set_favourites([Favourite("m/llama", "Llama 8B")])
    with qtbot.waitSignal(h.tray.favouriteRequested) as blocker:
        h.tray.find_action("favourite:m/llama").trigger()
    assert blocker.args == ["m/llama"]


def test_copy_url(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA])
    h.tray.find_action("engine:e1", "copy-url").trigger()
    assert QApplication.clipboard().text() == LLAMA.url


def test_show_window(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA])
    h.window.hide()
    h.tray.find_action("show").trigger()
    assert h.window.isVisible()


class FakeRunner(QObject):
    """The shape of qmgui.ui.engine_runner.EngineRunner the adapter relies on."""

    changed = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.engines = {7: EngineRow("x", "tiny-llama", State.READY, "http://127.0.0.1:9")}
        self.calls: list[tuple[str, int]] = []

    def stop(self, eid: int) -> None:
        self.calls.append(("stop", eid))

    def restart(self, eid: int) -> None:
        self.calls.append(("restart", eid))


def test_runner_adapter(qtbot) -> None:  # type: ignore[no-untyped-def]
    runner = FakeRunner()
    source = RunnerEngines(runner)
    assert source.engines() == [EngineRow("7", "tiny-llama", State.READY, "http://127.0.0.1:9")]
    source.stop_engine("7")
    source.start_engine("7")
    assert runner.calls == [("stop", 7), ("restart", 7)]
    with qtbot.waitSignal(source.enginesChanged):
        runner.changed.emit(7)


# --- the icon -----------------------------------------------------------------------------------
def test_icon_switches_while_any_engine_runs(make, qtbot) -> None:  # type: ignore[no-untyped-def]
    h = make([OLD])
    assert not h.tray.running
    assert h.tray.icon.toolTip() == "qmgui"
    with qtbot.waitSignal(h.tray.runningChanged) as blocker:
        h.engines.start_engine("e3")
    assert blocker.args == [True] and h.tray.running
    assert h.tray.icon.icon().cacheKey() == h.tray._icons[True].cacheKey()
    assert h.tray.icon.toolTip() == "qmgui — 1 engine running"
    with qtbot.waitSignal(h.tray.runningChanged) as blocker:
        h.engines.stop_engine("e3")
    assert blocker.args == [False]
    assert h.tray.icon.icon().cacheKey() == h.tray._icons[False].cacheKey()


@pytest.mark.parametrize("running", [False, True])
def test_icons_load_from_resources_and_render_small(running: bool, qapp) -> None:  # type: ignore[no-untyped-def]
    assert (icons_mod.ICON_DIR / icons_mod.APP_ICON).is_file()
    assert (icons_mod.ICON_DIR / icons_mod.RUNNING_ICON).is_file()
    for size in (16, 22, 24):
        img = app_icon(running).pixmap(size, size).toImage()
        assert not img.isNull() and img.width() == size
        assert img.pixelColor(size // 2, size // 2).alpha() > 0


def test_icons_differ_and_fallback_draws(monkeypatch, qapp, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    def corner(running: bool) -> tuple[int, int, int]:
        c = app_icon(running).pixmap(24, 24).toImage().pixelColor(18, 18)
        return c.red(), c.green(), c.blue()

    assert corner(True) != corner(False)  # the green dot
    monkeypatch.setattr(icons_mod, "ICON_DIR", tmp_path)  # no resources: drawn in code
    assert corner(True)[1] > corner(True)[0]  # green
    assert corner(True) != corner(False)


# --- settings -----------------------------------------------------------------------------------
def test_explained_is_an_extra_ui_key_that_survives_a_round_trip() -> None:
    s = Settings()
    assert not was_explained(s)
    marked = mark_explained(s)
    assert was_explained(marked)
    again = Settings.model_validate_json(marked.model_dump_json())
    assert was_explained(again)
    assert again.model_dump()["ui"][EXPLAINED_KEY] is True


# --- closing: no tray ---------------------------------------------------------------------------
def test_close_without_engines_quits(make) -> None:  # type: ignore[no-untyped-def]
    h = make([OLD])
    assert h.window.close()
    assert h.window.decisions == [CloseDecision.QUIT]
    assert h.prompts.asked == []


def test_close_without_tray_asks_and_cancel_keeps_everything(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, QWEN, OLD], available=False, close=False)
    assert not h.window.close()
    assert h.window.decisions == [CloseDecision.CANCEL]
    assert h.window.isVisible()
    assert h.prompts.asked == ["close:e1,e2"]
    assert h.engines.calls == []


def test_close_without_tray_can_stop_engines_and_quit(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, QWEN, OLD], available=False, close=True)
    assert h.window.close()
    assert h.window.decisions == [CloseDecision.QUIT]
    assert h.engines.calls == [("stop", "e1"), ("stop", "e2")]
    assert h.window.shut_down == 1


# --- closing: with a tray -----------------------------------------------------------------------
def test_close_with_tray_hides_and_explains_once(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA], available=True)
    assert not h.window.close()
    assert h.window.decisions == [CloseDecision.HIDE]
    assert not h.window.isVisible()
    assert h.engines.calls == [] and h.prompts.asked == []
    assert len(h.prompts.informed) == 1  # offscreen the icon is not shown: a message instead
    assert "tiny-llama" in h.prompts.informed[0]
    assert was_explained(h.settings) and len(h.saved) == 1
    h.tray.show_window()
    h.window.close()
    assert h.window.decisions == [CloseDecision.HIDE, CloseDecision.HIDE]
    assert len(h.prompts.informed) == 1 and len(h.saved) == 1  # once


def test_close_with_tray_when_already_explained_says_nothing(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA], available=True)
    h.settings = mark_explained(h.settings)
    h.window.close()
    assert h.prompts.informed == [] and h.saved == []


# --- quitting -----------------------------------------------------------------------------------
def test_quit_without_engines_does_not_ask(make) -> None:  # type: ignore[no-untyped-def]
    h = make([OLD])
    h.tray.find_action("quit").trigger()
    assert h.prompts.asked == [] and h.quits == 1
    assert h.window.decisions == [CloseDecision.QUIT] and not h.window.isVisible()


def test_quit_cancel(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, OLD], quit_choice=QuitChoice.CANCEL)
    assert not h.tray.request_quit()
    assert h.prompts.asked == ["quit:e1"]
    assert h.quits == 0 and h.window.isVisible() and h.engines.calls == []


def test_quit_stopping_engines(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA, QWEN, OLD], quit_choice=QuitChoice.STOP)
    assert h.tray.request_quit()
    assert h.engines.calls == [("stop", "e1"), ("stop", "e2")]
    assert h.quits == 1 and h.window.decisions == [CloseDecision.QUIT]
    assert h.window.shut_down == 1


def test_quit_leaving_engines_running(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA], quit_choice=QuitChoice.LEAVE, available=True)
    assert h.tray.request_quit()
    assert h.engines.calls == [] and h.quits == 1
    assert h.window.decisions == [CloseDecision.QUIT]
    assert h.tray.quit_choice is QuitChoice.LEAVE


def test_quit_from_the_tray_while_the_window_is_hidden(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA], quit_choice=QuitChoice.STOP, available=True)
    h.settings = mark_explained(h.settings)
    h.window.close()
    assert not h.window.isVisible()
    h.tray.request_quit()
    assert h.window.decisions == [CloseDecision.HIDE, CloseDecision.QUIT]
    assert h.window.shut_down == 1 and h.quits == 1


def test_install_is_a_no_op_without_a_tray(make) -> None:  # type: ignore[no-untyped-def]
    h = make([LLAMA], available=False)
    before = QApplication.quitOnLastWindowClosed()
    assert not h.tray.install()
    assert QApplication.quitOnLastWindowClosed() == before
    assert not h.tray.icon.isVisible()


# --- a real tray: Xvfb + trayer -----------------------------------------------------------------
_PROBE = r"""
import os, sys, time
from PySide6.QtWidgets import QApplication, QSystemTrayIcon, QWidget
from PySide6.QtCore import QObject, Signal
from qmgui.engines.supervisor import State
from qmgui.settings import Settings
from qmgui.ui.tray import EngineRow, Tray

class Src(QObject):
    enginesChanged = Signal()
    def engines(self): return [EngineRow("e1", "tiny-llama", State.READY, "http://127.0.0.1:8081")]
    def stop_engine(self, key): pass
    def start_engine(self, key): pass

app = QApplication(sys.argv)
deadline = time.monotonic() + 10
while not QSystemTrayIcon.isSystemTrayAvailable() and time.monotonic() < deadline:
    app.processEvents(); time.sleep(0.1)
w = QWidget()
t = Tray(w, Src(), load=Settings, save=lambda s: None, quit=lambda: None)
print("available", t.available, "installed", t.install(), "running", t.running)
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    app.processEvents(); time.sleep(0.05)
g = t.icon.geometry()
print("geometry", g.width(), g.height(), "visible", t.icon.isVisible())
"""


def test_real_tray_under_xvfb_and_trayer(tmp_path: Path) -> None:
    for tool in ("Xvfb", "trayer"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    n = next(n for n in range(87, 200) if not Path(f"/tmp/.X{n}-lock").exists())
    display = f":{n}"
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb"}
    try:
        procs.append(
            subprocess.Popen(
                ["Xvfb", display, "-screen", "0", "800x600x24"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 10
        while not Path(f"/tmp/.X11-unix/X{n}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        procs.append(subprocess.Popen(["trayer", "--edge", "top", "--height", "24"], env=env))
        time.sleep(1.0)
        root = Path(__file__).resolve().parents[2]
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            cwd=root,
            capture_output=True,
            check=False,
            text=True,
            timeout=60,
        )
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(5)
    if out.returncode and "xcb" in out.stderr:  # e.g. libxcb-cursor0 missing
        pytest.skip(f"no xcb platform: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr
    assert "available True installed True running True" in out.stdout
    assert "visible True" in out.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG autostart is Linux's")
def test_start_with_the_session_writes_and_removes_the_entry(make) -> None:  # type: ignore[no-untyped-def]
    h = make([])
    entry = autostart.entry_path()
    action: QAction = next(a for a in h.tray.menu.actions() if a.objectName() == "autostart")
    assert not action.isChecked() and not entry.exists()
    action.trigger()
    assert entry.exists() and autostart.is_enabled()
    assert "--minimized" in entry.read_text()
    action = next(a for a in h.tray.menu.actions() if a.objectName() == "autostart")
    assert action.isChecked()  # the rebuilt menu says so
    action.trigger()
    assert not entry.exists()
