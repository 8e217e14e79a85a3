"""The system tray: running engines (Open chat / Stop / Start), favourite models (Start), Show
window, Quit.

The tray knows engines only through `EngineSource`, a tiny protocol the engines panel (or any
fake) implements: a list of `EngineRow`s, `stop_engine` / `start_engine` by key, and a Qt
signal `enginesChanged` emitted when that list or a state in it changes. Favourite models are
a list given to `set_favourites`; choosing one emits `favouriteRequested(model_id)` and the
window decides how to plan and start it.

Closing the window goes through `close_policy(event)`:
- no engine running: the window closes and the application quits (`CloseDecision.QUIT`);
- engines running and a system tray available: the window hides, the engines keep running in
  the tray, and the first time this is explained (a tray balloon, else a message), remembered
  in settings under `ui.tray_close_explained` (`CloseDecision.HIDE`);
- engines running and no system tray (offscreen, bare X servers, some desktops): the user is
  asked "Stop engines and quit" (`QUIT`) or "Cancel" (`CANCEL`).
`request_quit()` (the tray's Quit, the window's Ctrl+Q) asks whether to stop running engines:
Stop them / Leave them running / Cancel.

Questions go through `Prompts` (QMessageBox by default), so tests answer them without dialogs.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from PySide6.QtCore import QObject, Signal, SignalInstance
from PySide6.QtGui import QAction, QCloseEvent
from PySide6.QtWidgets import QApplication, QMenu, QMessageBox, QSystemTrayIcon, QWidget

from qmgui import autostart, notify
from qmgui.core.errors import QmguiError
from qmgui.engines.supervisor import State
from qmgui.settings import Settings
from qmgui.ui import browser
from qmgui.ui.icons import app_icon

__all__ = [
    "EXPLAINED_KEY",
    "CloseDecision",
    "EngineRow",
    "EngineSource",
    "Favourite",
    "MessageBoxPrompts",
    "Prompts",
    "QuitChoice",
    "RunnerEngines",
    "Tray",
    "app_icon",
    "is_running",
    "mark_explained",
    "was_explained",
]

EXPLAINED_KEY = "tray_close_explained"  # an extra key of UiState (settings keep unknown keys)
BALLOON_MS = 8000
_XDG_AUTOSTART = sys.platform.startswith("linux")
_RUNNING = frozenset({State.STARTING, State.LOADING, State.READY, State.STOPPING})


def is_running(state: State) -> bool:
    """An engine holding (or about to hold, or still releasing) a process and memory."""
    return state in _RUNNING


@dataclass(frozen=True)
class EngineRow:
    """One engine as the tray shows it. `key` is stable for the engine's life in the panel."""

    key: str
    name: str
    state: State
    url: str | None = None
    chat_url: str | None = None  # the engine's own chat page (llama-server's web UI); None: none

    @property
    def running(self) -> bool:
        return is_running(self.state)


@dataclass(frozen=True)
class Favourite:
    """A model the user can start from the tray."""

    model_id: str
    name: str


class EngineSource(Protocol):
    """What the tray needs from the engines panel. `stop_engine`/`start_engine` must return at
    once (do the work off the GUI thread) and emit `enginesChanged` as states move."""

    @property
    def enginesChanged(self) -> SignalInstance: ...

    def engines(self) -> Sequence[EngineRow]: ...

    def stop_engine(self, key: str) -> None: ...

    def start_engine(self, key: str) -> None: ...


class _RunnerEngine(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def url(self) -> str | None: ...
    @property
    def chat_url(self) -> str | None: ...


class _Runner(Protocol):
    """The part of `qmgui.ui.engine_runner.EngineRunner` the adapter uses."""

    @property
    def changed(self) -> SignalInstance: ...
    @property
    def engines(self) -> Mapping[int, _RunnerEngine]: ...
    def stop(self, eid: int) -> None: ...
    def restart(self, eid: int) -> None: ...


class RunnerEngines(QObject):
    """`EngineSource` over the window's `EngineRunner` (int ids become string keys; Start on
    an ended engine is the runner's restart)."""

    enginesChanged = Signal()

    def __init__(self, runner: _Runner, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        runner.changed.connect(lambda _eid: self.enginesChanged.emit())

    def engines(self) -> Sequence[EngineRow]:
        return [
            EngineRow(str(eid), getattr(e, "label", e.name), e.state, e.url, e.chat_url)
            for eid, e in self.runner.engines.items()
        ]

    def stop_engine(self, key: str) -> None:
        self.runner.stop(int(key))

    def start_engine(self, key: str) -> None:
        self.runner.restart(int(key))


class CloseDecision(enum.Enum):
    QUIT = "quit"  # the event was accepted: save, shut down, let the window close
    HIDE = "hide"  # the event was ignored and the window hidden: engines run on in the tray
    CANCEL = "cancel"  # the event was ignored: the window stays


class QuitChoice(enum.Enum):
    STOP = "stop"
    LEAVE = "leave"
    CANCEL = "cancel"


class Prompts(Protocol):
    """The questions the tray asks; tests answer them with a fake."""

    def ask_quit(self, running: Sequence[EngineRow]) -> QuitChoice: ...

    def ask_close_without_tray(self, running: Sequence[EngineRow]) -> bool: ...

    def inform(self, title: str, text: str) -> None: ...


def _names(running: Sequence[EngineRow]) -> str:
    return ", ".join(r.name for r in running)


def _engines_words(running: Sequence[EngineRow]) -> str:
    n = len(running)
    return f"{n} engine{'s are' if n != 1 else ' is'} running ({_names(running)})."


class MessageBoxPrompts:
    """The default prompts: message boxes over `parent`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        self.parent = parent

    def ask_quit(self, running: Sequence[EngineRow]) -> QuitChoice:
        box = QMessageBox(self.parent)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Quit qmgui")
        box.setText(_engines_words(running))
        box.setInformativeText(
            "Stop them before quitting? Engines left running keep serving; qmgui adopts them "
            "when it starts again (Stop there stops them; so does `qmgui engines stop`)."
        )
        stop = box.addButton("Stop them", QMessageBox.ButtonRole.AcceptRole)
        leave = box.addButton("Leave them running", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(stop)
        box.exec()
        clicked = box.clickedButton()
        if clicked is stop:
            return QuitChoice.STOP
        if clicked is leave:
            return QuitChoice.LEAVE
        return QuitChoice.CANCEL

    def ask_close_without_tray(self, running: Sequence[EngineRow]) -> bool:
        box = QMessageBox(self.parent)
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Close qmgui")
        box.setText(_engines_words(running))
        box.setInformativeText(
            "This desktop has no system tray to keep them in, so closing the window stops them."
        )
        stop = box.addButton("Stop engines and quit", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        return box.clickedButton() is stop

    def inform(self, title: str, text: str) -> None:
        QMessageBox.information(self.parent, title, text)


# --- settings ---------------------------------------------------------------------------------
def was_explained(settings: Settings) -> bool:
    return bool((settings.ui.model_extra or {}).get(EXPLAINED_KEY, False))


def mark_explained(settings: Settings) -> Settings:
    ui = settings.ui.model_copy(update={EXPLAINED_KEY: True})
    return settings.model_copy(update={"ui": ui})


# --- the tray ---------------------------------------------------------------------------------
class Tray(QObject):
    """The tray icon and its menu, and the window's close and quit policy.

    `window` is shown by "Show window" and closed on quit; `load`/`save` read and store the
    settings (for the one-time explanation); `quit` ends the application (tests pass a fake);
    `tray_available` overrides `QSystemTrayIcon.isSystemTrayAvailable()` (tests)."""

    favouriteRequested = Signal(str)  # model id
    runSetRequested = Signal(str, bool)  # run set name, True: start / False: stop
    runningChanged = Signal(bool)  # any engine running

    def __init__(
        self,
        window: QWidget,
        source: EngineSource,
        *,
        load: Callable[[], Settings],
        save: Callable[[Settings], None],
        prompts: Prompts | None = None,
        quit: Callable[[], None] = QApplication.quit,
        tray_available: bool | None = None,
    ) -> None:
        super().__init__(window)
        self.window = window
        self.source = source
        self._load, self._save, self._quit = load, save, quit
        self.prompts: Prompts = prompts or MessageBoxPrompts(window)
        self._available = tray_available
        self._favourites: list[Favourite] = []
        self._run_sets: list[tuple[str, bool]] = []  # (name, any of its models running)
        self._running = False
        self._quitting = False
        # how the last quit ended: LEAVE means the window's shutdown must not stop engines
        self.quit_choice: QuitChoice | None = None
        self._icons = {False: app_icon(False), True: app_icon(True)}
        # Linux: "Start with the session" (None elsewhere: the Windows installer has its own)
        self._autostart: bool | None = autostart.is_enabled() if _XDG_AUTOSTART else None

        self.menu = QMenu(window)
        self.icon = QSystemTrayIcon(self._icons[False], self)
        self.icon.setToolTip("qmgui")
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._on_activated)
        source.enginesChanged.connect(self.refresh)
        self.refresh()

    # --- state --------------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        if self._available is not None:
            return self._available
        return QSystemTrayIcon.isSystemTrayAvailable()

    @property
    def running(self) -> bool:
        """Whether any engine runs (the icon shows the running variant)."""
        return self._running

    def running_engines(self) -> list[EngineRow]:
        return [r for r in self.source.engines() if r.running]

    def install(self) -> bool:
        """Show the icon where a tray exists; then closing the window with engines running
        no longer quits the application. Returns whether the icon is shown."""
        if not self.available:
            return False
        QApplication.setQuitOnLastWindowClosed(False)
        self.icon.show()
        return True

    def set_favourites(self, favourites: Sequence[Favourite]) -> None:
        self.set_offers(favourites, self._run_sets)

    def set_run_sets(self, run_sets: Sequence[tuple[str, bool]]) -> None:
        self.set_offers(self._favourites, run_sets)

    def set_offers(
        self, favourites: Sequence[Favourite], run_sets: Sequence[tuple[str, bool]]
    ) -> None:
        """The favourite models and the run sets (name, whether any of its models runs now)
        the menu offers; the menu is rebuilt once."""
        self._favourites = list(favourites)
        self._run_sets = list(run_sets)
        self.refresh()

    # --- menu ---------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Rebuild the menu and the icon from the source's engines (connected to its signal)."""
        rows = list(self.source.engines())
        running = any(r.running for r in rows)
        if running != self._running:
            self._running = running
            self.icon.setIcon(self._icons[running])
            self.runningChanged.emit(running)
        n = sum(r.running for r in rows)
        self.icon.setToolTip(f"qmgui — {n} engine{'s' if n != 1 else ''} running" if n else "qmgui")
        self._build_menu(rows)

    def _build_menu(self, rows: Sequence[EngineRow]) -> None:
        menu = self.menu
        for action in menu.actions():
            sub = action.menu()
            if isinstance(sub, QMenu):
                sub.deleteLater()
        menu.clear()
        header = menu.addAction("Engines" if rows else "No engines running")
        header.setEnabled(False)
        for row in rows:
            self._engine_menu(row)
        menu.addSeparator()
        if self._favourites:
            fav_header = menu.addAction("Favourite models")
            fav_header.setEnabled(False)
            for fav in self._favourites:
                act = menu.addAction(f"Start {fav.name}")
                act.setObjectName(f"favourite:{fav.model_id}")
                act.triggered.connect(
                    lambda _=False, m=fav.model_id: self.favouriteRequested.emit(m)
                )
            menu.addSeparator()
        if self._run_sets:
            sets = QMenu("Run sets", menu)
            sets.setObjectName("run-sets")
            for name, running in self._run_sets:
                start = sets.addAction(f"Start {name}")
                start.setObjectName(f"run-set-start:{name}")
                start.triggered.connect(lambda _=False, n=name: self.runSetRequested.emit(n, True))
                if running:
                    stop = sets.addAction(f"Stop {name}")
                    stop.setObjectName(f"run-set-stop:{name}")
                    stop.triggered.connect(
                        lambda _=False, n=name: self.runSetRequested.emit(n, False)
                    )
            menu.addMenu(sets)
            menu.addSeparator()
        if self._autostart is not None:
            login = menu.addAction("Start with the session")
            login.setObjectName("autostart")
            login.setCheckable(True)
            login.setChecked(self._autostart)
            login.setToolTip("Start qmgui in the tray when you log in (an XDG autostart entry)")
            login.toggled.connect(self.set_autostart)
        show = menu.addAction("Show window")
        show.setObjectName("show")
        show.triggered.connect(self.show_window)
        quit_action = menu.addAction("Quit")
        quit_action.setObjectName("quit")
        quit_action.triggered.connect(self.request_quit)

    def set_autostart(self, on: bool) -> None:
        """Write or remove the XDG autostart entry (a few hundred bytes in ~/.config)."""
        try:
            if on:
                path = autostart.enable()
                notify.info(f"qmgui will start in the tray when you log in ({path})", source="tray")
            else:
                autostart.disable()
                notify.info("qmgui will no longer start when you log in", source="tray")
            self._autostart = on
        except QmguiError as e:
            notify.error(str(e), source="tray")
            self._autostart = autostart.is_enabled()
        self.refresh()

    def _engine_menu(self, row: EngineRow) -> None:
        sub = QMenu(f"{row.name} — {row.state.value}", self.menu)
        sub.setObjectName(f"engine:{row.key}")
        if row.chat_url and row.state is State.READY:
            chat = sub.addAction("Open chat")
            chat.setObjectName("open-chat")
            chat.setToolTip(f"Open {row.chat_url} in the browser")
            chat.triggered.connect(lambda _=False, u=row.chat_url: browser.open_url(u))
        if row.url:
            url = sub.addAction(f"Copy {row.url}")
            url.setObjectName("copy-url")
            url.triggered.connect(lambda _=False, u=row.url: QApplication.clipboard().setText(u))
        if row.running:
            stop = sub.addAction("Stop")
            stop.setObjectName("stop")
            stop.setEnabled(row.state is not State.STOPPING)
            stop.triggered.connect(lambda _=False, k=row.key: self.source.stop_engine(k))
        else:
            start = sub.addAction("Start")
            start.setObjectName("start")
            start.triggered.connect(lambda _=False, k=row.key: self.source.start_engine(k))
        self.menu.addMenu(sub)

    def find_action(self, *names: str) -> QAction | None:
        """An action by object names: ("quit",), ("engine:KEY", "stop"), ("favourite:ID",)."""
        menu: QMenu = self.menu
        *subs, last = names
        for name in subs:
            found = next(
                (a.menu() for a in menu.actions() if isinstance(a.menu(), QMenu)
                 and a.menu().objectName() == name),
                None,
            )  # fmt: skip
            if not isinstance(found, QMenu):
                return None
            menu = found
        return next((a for a in menu.actions() if a.objectName() == last), None)

    # --- window -------------------------------------------------------------------------------
    def _on_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            if self.window.isVisible() and not self.window.isMinimized():
                self.window.hide()
            else:
                self.show_window()

    def show_window(self) -> None:
        w = self.window
        if w.isMinimized():
            w.showNormal()
        w.show()
        w.raise_()
        w.activateWindow()

    def _stop_all(self, running: Sequence[EngineRow]) -> None:
        for row in running:
            self.source.stop_engine(row.key)

    def request_quit(self) -> bool:
        """Quit, asking first whether to stop running engines. False when cancelled."""
        running = self.running_engines()
        if running:
            choice = self.prompts.ask_quit(running)
            if choice is QuitChoice.CANCEL:
                return False
            self.quit_choice = choice
            if choice is QuitChoice.STOP:
                self._stop_all(running)
        self._quitting = True
        self.window.close()  # its closeEvent asks close_policy, which now says QUIT
        self.icon.hide()
        self._quit()
        return True

    def close_policy(self, event: QCloseEvent) -> CloseDecision:
        """Decide what closing the window means; accepts or ignores `event` to match."""
        if self._quitting:
            event.accept()
            return CloseDecision.QUIT
        running = self.running_engines()
        if not running:
            event.accept()
            self._finish_quit()
            return CloseDecision.QUIT
        if self.available:
            event.ignore()
            self.window.hide()
            self._explain_once(running)
            return CloseDecision.HIDE
        if self.prompts.ask_close_without_tray(running):
            self._stop_all(running)
            event.accept()
            self._finish_quit()
            return CloseDecision.QUIT
        event.ignore()
        return CloseDecision.CANCEL

    def _finish_quit(self) -> None:
        """The window closes for good: end the application even when a shown tray icon set
        quitOnLastWindowClosed off."""
        self._quitting = True
        self.icon.hide()
        if not QApplication.quitOnLastWindowClosed():
            self._quit()

    def _explain_once(self, running: Sequence[EngineRow]) -> None:
        settings = self._load()
        if was_explained(settings):
            return
        title = "qmgui is still running"
        text = (
            f"{_engines_words(running)} They keep running here; choose Quit in this menu to "
            "stop them, or Show window to come back."
        )
        if self.icon.isVisible() and QSystemTrayIcon.supportsMessages():
            self.icon.showMessage(title, text, self._icons[True], BALLOON_MS)
        else:
            self.prompts.inform(title, text)
        self._save(mark_explained(settings))
