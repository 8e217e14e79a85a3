"""How long the window takes to appear, as a user sees it: from the process's start to the
first paint of the main window. `QMGUI_REPORT_SHOWN=1 qmgui` prints
`qmgui: window shown in N ms` at that paint, then `qmgui: window built in N ms` once the window
is whole (its settings loaded, its panels and workers made), and quits before it scans
(bench/window_start.py times the bundle with it)."""

from __future__ import annotations

import os
import sys
import time

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
        import psutil  # noqa: PLC0415 - elsewhere than Linux only

        return (time.time() - psutil.Process().create_time()) * 1000


class _FirstPaint(QObject):
    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self._done = False

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if not self._done and event.type() == QEvent.Type.Paint:
            self._done = True
            # after this paint has been delivered and flushed to the screen
            QTimer.singleShot(0, self._report)
        return False

    def _report(self) -> None:
        print(f"qmgui: window shown in {started_ms_ago():.0f} ms", file=sys.stdout, flush=True)


def report_when_shown(window: QWidget) -> bool:
    """With `QMGUI_REPORT_SHOWN` set: report the first paint of `window`."""
    if not os.environ.get(ENV):
        return False
    window.installEventFilter(_FirstPaint(window))
    return True


def report_built(app: QApplication) -> bool:
    """With `QMGUI_REPORT_SHOWN` set: report that the window is whole now, and quit."""
    if not os.environ.get(ENV):
        return False
    print(f"qmgui: window built in {started_ms_ago():.0f} ms", file=sys.stdout, flush=True)
    QTimer.singleShot(0, app.quit)
    return True
