"""A one-line label that elides its text to the width it gets (the whole text in its tooltip),
so a long model name or engine label never holds a narrow window wider than it is."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """Plain text on one line, elided (at `mode`) to the label's width. `full_text()` is the
    whole text; the tooltip shows it while it is cut, unless a tooltip was given
    (`set_tip`)."""

    def __init__(
        self,
        text: str = "",
        parent: QWidget | None = None,
        mode: Qt.TextElideMode = Qt.TextElideMode.ElideMiddle,
    ) -> None:
        super().__init__(parent)
        self._mode = mode
        self._full = ""
        self._tip = ""
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def full_text(self) -> str:
        return self._full

    def setText(self, text: str) -> None:  # the shown text follows the width
        self._full = text
        self._elide()

    def set_tip(self, tip: str) -> None:
        self._tip = tip
        self._elide()

    def is_elided(self) -> bool:
        return self.text() != self._full

    def sizeHint(self) -> QSize:
        width = self.fontMetrics().horizontalAdvance(self._full) + 2 * self.margin() + 4
        return QSize(width, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance("…") * 4, super().sizeHint().height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = self.contentsRect().width() - 2 * self.margin()
        shown = self.fontMetrics().elidedText(self._full, self._mode, max(width, 0))
        if shown != self.text():
            super().setText(shown)
        self.setToolTip(self._tip or (self._full if shown != self._full else ""))
