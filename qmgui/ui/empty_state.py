"""What the window shows when there are no models: how to add some."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget


class EmptyState(QWidget):
    """A centred explanation and an "Add folder…" button (`addFolderRequested`)."""

    addFolderRequested = Signal()
    useFoldersRequested = Signal(list)  # the offered folders, accepted

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.heading = QLabel("No models yet", self)
        font = self.heading.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.heading.setFont(font)
        self.heading.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.body = QLabel(self)
        self.body.setWordWrap(True)
        self.body.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.body.setFixedWidth(540)
        self.body.setText(
            "Drop a folder of models (or a single .gguf file) anywhere on this window, or "
            "choose one with <b>Add folder…</b>. qmgui also looks in the LM Studio, Ollama "
            "and Hugging Face stores on this machine.<br><br>It reads only the headers: "
            "nothing is loaded, and no GPU or engine is needed to see what each launch costs."
        )
        self.body.setMinimumHeight(self.body.heightForWidth(self.body.width()))
        self.button = QPushButton("Add folder…", self)
        self.button.setDefault(True)
        self.button.clicked.connect(self.addFolderRequested)
        # first run: folders where models usually are, offered with one button
        self.offer = QLabel("", self)
        self.offer.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.offer.setWordWrap(True)
        self.offer.setFixedWidth(540)
        self.offer_button = QPushButton("Use these folders", self)
        self.offer_button.clicked.connect(lambda: self.useFoldersRequested.emit(self._offered))
        self._offered: list[str] = []
        self.offer.hide()
        self.offer_button.hide()
        self.status = QLabel("", self)
        self.status.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.status.setWordWrap(True)
        self.status.setFixedWidth(540)

        layout = QVBoxLayout(self)
        layout.addStretch(2)
        layout.addWidget(self.heading)
        layout.addSpacing(8)
        layout.addWidget(self.body, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addSpacing(16)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addSpacing(12)
        layout.addWidget(self.offer, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addWidget(self.offer_button, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addSpacing(8)
        layout.addWidget(self.status, 0, Qt.AlignmentFlag.AlignHCenter)
        layout.addStretch(3)

    def set_status(self, text: str) -> None:
        self.status.setText(text)
        self.status.setMinimumHeight(self.status.heightForWidth(self.status.width()))

    def set_offer(self, folders: list[str]) -> None:
        """Offer `folders` (found on this machine, not scanned yet); none hides the offer."""
        self._offered = list(folders)
        self.offer.setText("Found folders that may hold models:<br>" + "<br>".join(folders))
        self.offer.setMinimumHeight(self.offer.heightForWidth(self.offer.width()))
        self.offer.setVisible(bool(folders))
        self.offer_button.setVisible(bool(folders))
