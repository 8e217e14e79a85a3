"""The launch preview: the exact command for bash or PowerShell, a Copy button, the warnings."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QButtonGroup,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from qmgui.ui.elided import ElidedLabel

BASH = "bash"
POWERSHELL = "powershell"


class PreviewPane(QWidget):
    """Shows the command lines it is given; `copied(text)` after Copy."""

    copied = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lines = {BASH: "", POWERSHELL: ""}
        self._shown = dict(self._lines)
        title = QLabel("<b>Launch command</b>", self)
        self.engine = ElidedLabel("", self, Qt.TextElideMode.ElideRight)
        self.engine.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.bash = QRadioButton("bash", self)
        self.powershell = QRadioButton("PowerShell", self)
        self.bash.setChecked(True)
        self._shells = QButtonGroup(self)
        self._shells.addButton(self.bash)
        self._shells.addButton(self.powershell)
        self.copy_button = QPushButton("Copy", self)
        self.copy_button.setToolTip("Copy the command (Ctrl+C in the command box)")
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.text.setPlaceholderText("Select a model to see the command that launches it.")
        self.text.setMinimumHeight(self.text.fontMetrics().height() * 3 + 12)
        self.warnings = QLabel("", self)
        self.warnings.setWordWrap(True)
        self.warnings.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warnings.hide()

        top = QHBoxLayout()
        top.addWidget(title)
        top.addSpacing(12)
        top.addWidget(self.engine, 1)
        top.addWidget(self.bash)
        top.addWidget(self.powershell)
        top.addWidget(self.copy_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(6)
        layout.addLayout(top)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.warnings)

        self.bash.toggled.connect(self._show)
        self.copy_button.clicked.connect(self.copy)
        # Ctrl+C in the box copies the whole command when nothing is selected
        shortcut = QShortcut(QKeySequence.StandardKey.Copy, self.text)
        shortcut.setContext(Qt.ShortcutContext.WidgetShortcut)
        shortcut.activated.connect(self._copy_shortcut)

    @property
    def shell(self) -> str:
        return BASH if self.bash.isChecked() else POWERSHELL

    def set_shell(self, shell: str) -> None:
        (self.bash if shell == BASH else self.powershell).setChecked(True)

    def set_command(
        self,
        bash: str,
        powershell: str,
        warnings: tuple[str, ...] = (),
        engine: str = "",
        *,
        shown: tuple[str, str] | None = None,
    ) -> None:
        """`bash`/`powershell` are what Copy takes; `shown` (the same with secrets redacted)
        is what the pane displays, when given."""
        self._lines = {BASH: bash, POWERSHELL: powershell}
        self._shown = {BASH: shown[0], POWERSHELL: shown[1]} if shown else dict(self._lines)
        self.engine.setText(engine.split(":", 1)[0])
        self.engine.set_tip(engine)
        self._show()
        self.copy_button.setEnabled(bool(bash))
        if warnings:
            self.warnings.setText("\n".join(f"⚠ {w}" for w in warnings))
            self.warnings.show()
        else:
            self.warnings.clear()
            self.warnings.hide()

    def clear(self) -> None:
        self.set_command("", "")

    def command_text(self) -> str:
        return self._lines[self.shell]

    def copy(self) -> None:
        text = self.command_text()
        if text:
            QGuiApplication.clipboard().setText(text)
            self.copied.emit(text)

    def _copy_shortcut(self) -> None:
        cursor = self.text.textCursor()
        if cursor.hasSelection():
            QGuiApplication.clipboard().setText(cursor.selectedText())
        else:
            self.copy()

    def _show(self) -> None:
        self.text.setPlainText(self._shown[self.shell])
