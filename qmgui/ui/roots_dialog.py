"""The Model folders dialog: the configured roots, with Add (a folder picker), Remove and Undo
of removals (Ctrl+Z). It changes nothing itself: `add` and `save` are the window's, which save
the settings (merged into the file as it is now) and rescan."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from qmgui.roots import covering_root, find_root

PATH_ROLE = Qt.ItemDataRole.UserRole


class RootsDialog(QDialog):
    """`roots()` reads the configured roots; `add(paths)` adds folders (nested ones are the
    window's to refuse); `save(roots)` replaces the list."""

    def __init__(
        self,
        parent: QWidget | None,
        *,
        roots: Callable[[], Sequence[str]],
        add: Callable[[Sequence[str]], None],
        save: Callable[[Sequence[str]], None],
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Model folders")
        self.setObjectName("roots-dialog")
        self.resize(560, 340)
        self._roots, self._add, self._save = roots, add, save
        self._removed: list[tuple[int, str]] = []  # (position, root): what Undo puts back

        intro = QLabel(
            "qmgui scans these folders for models, besides the LM Studio, Ollama and "
            "Hugging Face stores it finds by itself. Removing a folder leaves its files alone.",
            self,
        )
        intro.setWordWrap(True)
        self.list = QListWidget(self)
        self.list.setAccessibleName("Model folders")
        intro.setBuddy(self.list)
        self.status = QLabel("", self)
        self.status.setWordWrap(True)

        self.add_button = QPushButton("&Add folder…", self)
        self.remove_button = QPushButton("&Remove", self)
        self.remove_button.setToolTip("Stop scanning the selected folder (Delete)")
        self.undo_button = QPushButton("&Undo remove", self)
        self.undo_button.setToolTip("Put back the folder removed last (Ctrl+Z)")
        buttons = QVBoxLayout()
        for b in (self.add_button, self.remove_button, self.undo_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.list, 1)
        row.addLayout(buttons)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(row, 1)
        layout.addWidget(self.status)
        layout.addWidget(close)

        self.undo_shortcut = QShortcut(QKeySequence.StandardKey.Undo, self)
        # the dialog has no text field: Delete anywhere in it removes the selected folder
        self.delete_shortcut = QShortcut(QKeySequence.StandardKey.Delete, self)
        self.add_button.clicked.connect(self.choose_folder)
        self.remove_button.clicked.connect(self.remove_selected)
        self.undo_button.clicked.connect(self.undo)
        self.undo_shortcut.activated.connect(self.undo)
        self.delete_shortcut.activated.connect(self.remove_selected)
        self.list.currentRowChanged.connect(lambda _row: self._update_buttons())
        # the same keys when no shortcut fires (an inactive window, or a test's key events)
        self.list.installEventFilter(self)
        self.refresh()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.list and event.type() == QEvent.Type.KeyPress:
            assert isinstance(event, QKeyEvent)
            if event.matches(QKeySequence.StandardKey.Delete):
                self.remove_selected()
                return True
            if event.matches(QKeySequence.StandardKey.Undo):
                self.undo()
                return True
        return super().eventFilter(watched, event)

    # --- showing ----------------------------------------------------------------------------
    def paths(self) -> list[str]:
        """The roots on show, in order."""
        return [str(self.list.item(i).data(PATH_ROLE)) for i in range(self.list.count())]

    def refresh(self, *_args: object) -> None:
        """Show the roots as they are now (after a change here or in another qmgui)."""
        current = self.list.currentItem()
        keep = current.data(PATH_ROLE) if current is not None else None
        self.list.clear()
        for root in self._roots():
            found = os.path.exists(os.path.expanduser(root))
            item = QListWidgetItem(root if found else f"{root}  (not found)", self.list)
            item.setData(PATH_ROLE, root)
            item.setToolTip(root if found else f"{root}: not found (an offline drive?)")
        rows = self.paths()
        if keep in rows:
            self.list.setCurrentRow(rows.index(keep))
        elif rows:
            self.list.setCurrentRow(0)
        self._update_buttons()

    def _update_buttons(self) -> None:
        self.remove_button.setEnabled(self.list.currentItem() is not None)
        self.undo_button.setEnabled(bool(self._removed))

    # --- changing ---------------------------------------------------------------------------
    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder of models")
        if not folder:
            return
        covering = covering_root(list(self._roots()), folder)
        self._add([folder])
        if covering is None:
            self.status.setText(f"Added {folder}.")
        elif covering == folder:
            self.status.setText(f"{folder} is a model folder already.")
        else:
            self.status.setText(f"{folder} is inside {covering}, which is scanned already.")
        self.refresh()

    def remove_selected(self) -> None:
        item = self.list.currentItem()
        if item is None:
            return
        roots = list(self._roots())
        root = find_root(roots, str(item.data(PATH_ROLE)))
        if root is None:  # gone meanwhile (another qmgui removed it)
            self.refresh()
            return
        at = roots.index(root)
        self._removed.append((at, root))
        self._save([r for r in roots if r != root])
        self.status.setText(f"Removed {root}. Undo (Ctrl+Z) puts it back.")
        self.refresh()
        if self.list.count():
            self.list.setCurrentRow(min(at, self.list.count() - 1))
        self.list.setFocus(Qt.FocusReason.OtherFocusReason)

    def undo(self) -> None:
        if not self._removed:
            return
        at, root = self._removed.pop()
        roots = list(self._roots())
        covering = covering_root(roots, root)
        if covering is None:
            roots.insert(min(at, len(roots)), root)
            self._save(roots)
            self.status.setText(f"Put back {root}.")
        else:
            self.status.setText(f"{root} is scanned already, as part of {covering}.")
        self.refresh()
        rows = self.paths()
        if root in rows:
            self.list.setCurrentRow(rows.index(root))
