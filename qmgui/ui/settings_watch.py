"""Notices when another process (the CLI, a script, a second window, an editor) changes the
settings file, and reads it off the GUI thread.

A save is an atomic rename: the file's inode is replaced, and a watch on the file alone is
lost with the old inode. So the folder is watched (a rename into it changes it) and the file
is watched again after every event (an in-place edit changes no folder entry); the folder of
the file a symlink points to is watched too, and while the config folder does not exist yet
its nearest existing parent is watched instead, so the first save anyone makes is seen.

Events come in bursts (a temp file created, written, renamed), so a read waits until they
have been quiet for `DEBOUNCE_MS`. The read (`peek_settings`: it never moves a file aside, a
file half-way through a hand edit is just not read) runs on a worker; `changed` is emitted
with the new `Settings` only when the file's identity (inode, size, mtime) moved since the
last read and it holds usable settings. The receiver compares them with its own copy.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer, Signal

from qmgui.settings import Settings, peek_settings
from qmgui.ui.workers import LatestWins

DEBOUNCE_MS = 150

_Signature = tuple[int, int, int] | None


def _signature(path: Path) -> _Signature:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class SettingsWatch(QObject):
    """Watches the settings file at `path`; `changed(Settings)` when another process changed
    it. Call `stop()` before the owner goes (it joins the reader)."""

    changed = Signal(object)

    def __init__(
        self, path: Path, parent: QObject | None = None, *, debounce_ms: int = DEBOUNCE_MS
    ) -> None:
        super().__init__(parent)
        self.path = path
        self._last: _Signature = None  # the first event always reads
        self._stopped = False
        self._watcher = QFileSystemWatcher(self)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(debounce_ms)
        self._reader = LatestWins("settings-watch", self)
        self._watcher.directoryChanged.connect(self._poke)
        self._watcher.fileChanged.connect(self._poke)
        self._timer.timeout.connect(self._read)
        self._reader.finished.connect(self._on_read)
        self.arm()

    @property
    def busy(self) -> bool:
        """An event is waiting out the debounce, or a read is running."""
        return self._timer.isActive() or self._reader.busy

    def arm(self) -> None:
        """(Re)add the watches: the file, its folder, its real folder, or the nearest existing
        parent of a folder that is not there yet."""
        if self._stopped:
            return
        wanted: list[str] = []
        for folder in (self.path.parent, Path(os.path.realpath(self.path)).parent):
            existing = folder
            while not existing.is_dir() and existing.parent != existing:
                existing = existing.parent
            wanted.append(str(existing))
        if self.path.exists():
            wanted.append(str(self.path))
        watched = set(self._watcher.files()) | set(self._watcher.directories())
        missing = [p for p in dict.fromkeys(wanted) if p not in watched]
        if missing:
            self._watcher.addPaths(missing)

    def wrote(self) -> None:
        """The owner just saved the file itself: a read started before that would bring back
        the state before its save, so drop it; the save's own event reads again."""
        self._reader.cancel()
        self._poke()

    def stop(self) -> None:
        """Stop watching and join a running read (safe to call twice)."""
        self._stopped = True
        self._timer.stop()
        self._reader.cancel()
        self._reader.wait()
        paths = self._watcher.files() + self._watcher.directories()
        if paths:
            self._watcher.removePaths(paths)

    def _poke(self, _path: str = "") -> None:
        if not self._stopped:
            self._timer.start()  # (re)start: read once the burst is over

    def _read(self) -> None:
        self.arm()
        path = self.path

        def read() -> tuple[_Signature, Settings | None]:
            signature = _signature(path)
            return signature, (peek_settings(path) if signature is not None else None)

        self._reader.submit(read)

    def _on_read(self, result: object) -> None:
        if self._stopped:
            return
        assert isinstance(result, tuple)
        signature, settings = result
        self.arm()
        if signature is None or signature == self._last:
            return
        self._last = signature
        if isinstance(settings, Settings):
            self.changed.emit(settings)
