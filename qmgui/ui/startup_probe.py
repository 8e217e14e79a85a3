"""How long the window takes to appear, as a user sees it: from the process's start to the
first paint of the main window. `QMGUI_REPORT_SHOWN=1 qmgui` prints one line,
`qmgui: window shown in N ms`, and quits (bench/window_start.py times the bundle with it)."""

from __future__ import annotations

import os
import sys
import time

import psutil
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QWidget

ENV = "QMGUI_REPORT_SHOWN"


def started_ms_ago() -> float:
    """Milliseconds since this process was created (the kernel's clock, not our import).

    On Linux: the process's start in clock ticks since boot (/proc/self/stat) against
    CLOCK_BOOTTIME, both counted from boot. Not psutil's create_time: that adds the boot time
    from /proc/stat, which is in whole seconds, so it is off by up to a second."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, counting from field 3 after the name
        start_s = ticks / os.sysconf("SC_CLK_TCK")
        return (time.clock_gettime(time.CLOCK_BOOTTIME) - start_s) * 1000
    except (OSError, ValueError, IndexError, AttributeError):
        return (time.time() - psutil.Process().create_time()) * 1000


class _FirstPaint(QObject):
    def __init__(self, window: QWidget, app: QApplication) -> None:
        super().__init__(window)
        self._app = app
        self._done = False

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if not self._done and event.type() == QEvent.Type.Paint:
            self._done = True
            # after this paint has been delivered and flushed to the screen
            QTimer.singleShot(0, self._report)
        return False

    def _report(self) -> None:
        print(f"qmgui: window shown in {started_ms_ago():.0f} ms", file=sys.stdout, flush=True)
        self._app.quit()


def report_when_shown(window: QWidget, app: QApplication) -> bool:
    """With `QMGUI_REPORT_SHOWN` set: report the first paint of `window`, then quit."""
    if not os.environ.get(ENV):
        return False
    window.installEventFilter(_FirstPaint(window, app))
    return True
