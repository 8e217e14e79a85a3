"""Drag and drop of folders and `.gguf` files onto the window: an event filter any widget can
carry (the table's viewport receives the events over the table, the window elsewhere)."""

from __future__ import annotations

import os

from PySide6.QtCore import QEvent, QObject, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import QWidget


def accepted_path(path: str) -> bool:
    """A folder, or a GGUF file: what can become a model root."""
    return os.path.isdir(path) or (os.path.isfile(path) and path.lower().endswith(".gguf"))


def local_paths(event: QDropEvent | QDragEnterEvent | QDragMoveEvent) -> list[str]:
    mime = event.mimeData()
    if not mime.hasUrls():
        return []
    return [u.toLocalFile() for u in mime.urls() if u.isLocalFile()]


class DropFilter(QObject):
    """Accepts drags that carry local paths; on a drop, `dropped(accepted, refused)`."""

    dropped = Signal(list, list)

    def watch(self, widget: QWidget) -> None:
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove):
            assert isinstance(event, (QDragEnterEvent, QDragMoveEvent))
            if local_paths(event):
                event.acceptProposedAction()
            else:
                event.ignore()
            return True
        if kind == QEvent.Type.Drop:
            assert isinstance(event, QDropEvent)
            paths = local_paths(event)
            if not paths and not event.mimeData().hasUrls():
                event.ignore()
                self.dropped.emit([], ["that (only folders and .gguf files can be added)"])
                return True
            accepted = [p for p in paths if accepted_path(p)]
            refused = [p for p in paths if not accepted_path(p)]
            event.acceptProposedAction()
            self.dropped.emit(accepted, refused)
            return True
        return False
