"""Background work for the window: one task at a time per runner, the latest request wins.

Workers run plain functions on a Python thread and hand back plain values; they never touch a
widget. Results cross to the GUI thread through a queued signal, and a result that is stale by
the time it arrives (a newer request came in) is dropped, as Orange3's `concurrent.py` does.
`wait()` joins the running thread: the window calls it on close and tests call it before they
end.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from qmgui.core.discovery import ScanResult, scan

_log = logging.getLogger(__name__)

Task = Callable[[], Any]


class State(enum.Enum):
    IDLE = "idle"
    RUNNING = "running"


class LatestWins(QObject):
    """Runs submitted tasks one at a time; a task submitted while one runs replaces any task
    still waiting, and only the result of the latest submission is delivered (`finished`).
    A task that raises delivers `failed` with the error's text instead."""

    finished = Signal(object)
    failed = Signal(str)
    busyChanged = Signal(bool)
    _done = Signal(int, object, str)  # generation, result, error text ("" when none)

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._name = name
        self._generation = 0
        self._pending: tuple[int, Task] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done.connect(self._on_done, Qt.ConnectionType.QueuedConnection)

    @property
    def state(self) -> State:
        return State.RUNNING if self.busy else State.IDLE

    @property
    def busy(self) -> bool:
        return self._thread is not None or self._pending is not None

    def submit(self, task: Task) -> None:
        """Run `task` after the running one; forget any task that was waiting."""
        was_busy = self.busy
        self._generation += 1
        self._pending = (self._generation, task)
        if self._thread is None:
            self._start_pending()
        if not was_busy:
            self.busyChanged.emit(True)

    def cancel(self) -> None:
        """Forget the waiting task and drop the running one's result when it comes."""
        self._generation += 1
        self._pending = None

    def wait(self, timeout: float | None = 30.0) -> None:
        """Join the running thread (results still arrive through the event loop)."""
        self._pending = None
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _start_pending(self) -> None:
        assert self._pending is not None
        generation, task = self._pending
        self._pending = None
        thread = threading.Thread(
            target=self._run, args=(generation, task), name=f"qmgui-{self._name}", daemon=True
        )
        self._thread = thread
        thread.start()

    def _run(self, generation: int, task: Task) -> None:
        try:
            result, error = task(), ""
        except Exception as e:  # a worker reports, it never takes the window down
            _log.debug("%s task failed:\n%s", self._name, traceback.format_exc())
            result, error = None, f"{type(e).__name__}: {e}" if not str(e) else str(e)
        with contextlib.suppress(RuntimeError):  # the window is gone (closed while this ran)
            self._done.emit(generation, result, error)

    def _on_done(self, generation: int, result: object, error: str) -> None:
        if self._thread is not None:
            self._thread.join()
        self._thread = None
        if self._pending is not None:
            self._start_pending()
        if generation == self._generation:
            if error:
                self.failed.emit(error)
            else:
                self.finished.emit(result)
        if not self.busy:
            self.busyChanged.emit(False)


class InOrder(QObject):
    """Runs every submitted task, one at a time, in the order submitted, and delivers every
    result (`finished`) or error (`failed`) in that order: for requests that must all happen,
    such as starting engines, where the latest-wins rule would drop one."""

    finished = Signal(object)
    failed = Signal(str)
    busyChanged = Signal(bool)

    def __init__(self, name: str, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runner = LatestWins(name, self)
        self._queue: list[Task] = []
        self._runner.finished.connect(self._on_finished)
        self._runner.failed.connect(self._on_failed)

    @property
    def busy(self) -> bool:
        return self._runner.busy or bool(self._queue)

    def submit(self, task: Task) -> None:
        was_busy = self.busy
        if self._runner.busy:
            self._queue.append(task)
        else:
            self._runner.submit(task)
        if not was_busy:
            self.busyChanged.emit(True)

    def wait(self, timeout: float | None = 30.0) -> None:
        self._queue.clear()
        self._runner.wait(timeout)

    def _next(self) -> None:
        if self._queue:
            self._runner.submit(self._queue.pop(0))
        elif not self._runner.busy:
            self.busyChanged.emit(False)

    def _on_finished(self, result: object) -> None:
        self.finished.emit(result)
        self._next()

    def _on_failed(self, error: str) -> None:
        self.failed.emit(error)
        self._next()


PROGRESS_INTERVAL_S = 0.05


class Breather:
    """Call it often from a worker loop: after every `work_s` of work it sleeps `pause_s`.

    A worker running Python keeps the GIL for a whole switch interval at a time, and the GUI
    thread needs it for every call Qt makes into Python (each cell a table paints), so a busy
    worker turns one paint into hundreds of waits (bench/gui_stall.py measured 350 ms).
    A short sleep now and then hands the GUI thread a window to finish its work in one go."""

    def __init__(self, work_s: float = 0.004, pause_s: float = 0.002) -> None:
        self.work_s = work_s
        self.pause_s = pause_s
        self._since = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self._since >= self.work_s:
            time.sleep(self.pause_s)
            self._since = time.monotonic()


class ScanRunner(QObject):
    """Scans model roots on a worker thread with progress, cancellable; results replace the
    list (`finished(ScanResult)`)."""

    progress = Signal(int, int, str)  # done, total, current path
    finished = Signal(object)
    failed = Signal(str)
    busyChanged = Signal(bool)

    def __init__(self, parent: QObject | None = None, *, use_cache: bool = True) -> None:
        super().__init__(parent)
        self._stop = threading.Event()
        self._use_cache = use_cache
        self._runner = LatestWins("scan", self)
        self._runner.finished.connect(self.finished)
        self._runner.failed.connect(self.failed)
        self._runner.busyChanged.connect(self.busyChanged)

    @property
    def busy(self) -> bool:
        return self._runner.busy

    def start(self, roots: list[str]) -> None:
        """Scan `roots`, cancelling a scan already running."""
        self._stop.set()
        stop = threading.Event()
        self._stop = stop
        self._runner.submit(lambda: self._scan(list(roots), stop))

    def cancel(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        self._runner.wait(timeout)

    def _scan(self, roots: list[str], stop: threading.Event) -> ScanResult:
        breathe = Breather()
        last = [0.0]

        def progress(done: int, total: int, path: str) -> None:
            breathe()
            now = time.monotonic()
            if done < total and now - last[0] < PROGRESS_INTERVAL_S:
                return  # a progress bar needs ~20 updates a second, not one per file
            last[0] = now
            try:
                self.progress.emit(done, total, path)
            except RuntimeError:
                stop.set()

        if not self._use_cache:
            return scan(roots, progress=progress, should_stop=stop.is_set)
        from qmgui.cache import SqliteHeaderCache  # noqa: PLC0415 - sqlite3 at the first scan

        with SqliteHeaderCache() as cache:
            return scan(roots, cache=cache, progress=progress, should_stop=stop.is_set)
