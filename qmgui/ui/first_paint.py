"""What the window needs before its first paint, read without the settings layer.

The window is shown first and built after (`MainWindow(deferred=True)`): pydantic, the settings
models, the engines and the sizing core cost more than half a second to import, which the user
would spend looking at nothing. Before that, only the theme and the saved geometry are read
here, with `json` alone; the full, validated load (`qmgui.settings.load_settings`) follows
right after the first paint and is the one that reports a file it cannot use. Whatever goes
wrong here (no file, not JSON, a value of the wrong type, a huge file) gives the defaults: the
first paint never fails and never decides anything about the file."""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QTimer
from PySide6.QtWidgets import QWidget

from qmgui.config_paths import settings_path

THEMES = ("system", "light", "dark")
MAX_BYTES = 4 * 1024 * 1024  # a settings file is kilobytes; a larger one waits for the real load
EXIT_BUILD_FAILED = 70  # EX_SOFTWARE: the window could not be built (the traceback says why)
UNPAINTED_MS = 2000  # a window not painted by then (hidden, minimized) is built anyway

_deferred: set[str] = set()  # "window" once the window's modules are left to the window


def defer_window_modules() -> None:
    """Before `qmgui.ui.main_window` is imported: leave its modules beyond Qt to the window,
    which imports them after its first paint (`MainWindow(deferred=...)`). Otherwise the
    import brings them, as any import would."""
    _deferred.add("window")


def window_modules_deferred() -> bool:
    return "window" in _deferred


@dataclass(frozen=True)
class FirstPaint:
    theme: str = "system"
    geometry: str | None = None  # base64 of QMainWindow.saveGeometry(), as settings keep it


def read_first_paint(path: Path | None = None) -> FirstPaint:
    """The theme and the window geometry saved in the settings file, or the defaults."""
    target = path or settings_path()
    try:
        with open(target, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_BYTES:
                return FirstPaint()
            data = json.loads(f.read(MAX_BYTES))
    except (OSError, ValueError, RecursionError):
        return FirstPaint()
    ui = data.get("ui") if isinstance(data, dict) else None
    if not isinstance(ui, dict):
        return FirstPaint()
    theme = ui.get("theme")
    geometry = ui.get("window_geometry")
    return FirstPaint(
        theme=theme if theme in THEMES else "system",
        geometry=geometry if isinstance(geometry, str) and len(geometry) < 65536 else None,
    )


def _end_program() -> None:
    QCoreApplication.exit(EXIT_BUILD_FAILED)


class BuildAfterPaint(QObject):
    """Runs `build` once `window` has been painted for the first time (the paint delivered,
    then the event loop's next turn), or after `UNPAINTED_MS` if it never is; not at all if
    the window is closed first (`cancel`). A build that raises is said (its traceback, as a
    constructor's error would be) and `failed` runs: by default the program ends with
    `EXIT_BUILD_FAILED` rather than leave a window that says "Starting…" for ever."""

    def __init__(
        self,
        window: QWidget,
        build: Callable[[], None],
        *,
        failed: Callable[[], None] = _end_program,
    ) -> None:
        super().__init__(window)
        self._window = window
        self._failed = failed
        self._build: Callable[[], None] | None = build
        window.installEventFilter(self)
        QTimer.singleShot(UNPAINTED_MS, self, self._run)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if self._build is not None and event.type() == QEvent.Type.Paint:
            self._window.removeEventFilter(self)
            QTimer.singleShot(0, self, self._run)
        return False

    def cancel(self) -> None:
        self._build = None

    @property
    def pending(self) -> bool:
        return self._build is not None

    def _run(self) -> None:
        build, self._build = self._build, None
        if build is None:
            return
        try:
            build()
        except Exception:  # every error is said, with its traceback
            traceback.print_exc()
            self._failed()
