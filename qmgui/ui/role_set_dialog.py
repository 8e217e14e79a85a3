"""The "Save role set…" dialog: a name and one `ROLE=MODEL[:KEY=VALUE,...]` line per row
(`core.roles`: chat, embed, rerank, vision), prefilled from the selected models; a line that
cannot be read is said under the rows, naming it and its bad part, and the dialog stays open."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from qmgui.core.discovery import ModelEntry
from qmgui.core.meta import ModelClass
from qmgui.core.roles import RoleError
from qmgui.service.role_sets import check_roles
from qmgui.ui.vram_bar import OVER_COLOUR

# the role a selected model is offered with, by what it is (anything else: chat)
_ROLE_OF = {ModelClass.EMBEDDING: "embed", ModelClass.RERANK: "rerank"}
HINT = (
    "One role per row: ROLE=MODEL[:KEY=VALUE,...]. ROLE: chat, embed, rerank or vision; "
    "MODEL: a model id or a path; keys: replicas, ctx, slots, name, mode, fa, ctk, ctv, ngl "
    "(e.g. chat=MODEL:ctx=16384,slots=2)."
)
Check = Callable[[str, list[str]], str | None]  # the name and lines: why not, None when fine


def suggested_roles(entries: Sequence[ModelEntry]) -> list[str]:
    """A row per selected model: `embed=` for an embedder, `rerank=` for a reranker,
    `chat=` for the others."""
    return [f"{_ROLE_OF.get(e.model_class or ModelClass.LLM, 'chat')}={e.id}" for e in entries]


def check_lines(name: str, lines: list[str]) -> str | None:
    """Why the name and rows cannot be saved (a sentence), None when they can."""
    if not name.strip():
        return "Give the role set a name."
    try:
        check_roles(lines)
    except RoleError as e:
        return str(e)
    return None


class RoleSetDialog(QDialog):
    def __init__(
        self,
        parent: QWidget | None,
        *,
        name: str = "",
        roles: Sequence[str] = (),
        check: Check = check_lines,
    ) -> None:
        super().__init__(parent)
        self.setObjectName("role-set-dialog")
        self.setWindowTitle("Save role set")
        self._check = check
        self.name_edit = QLineEdit(name, self)
        self.name_edit.setObjectName("role-set-name")
        self.roles_edit = QPlainTextEdit("\n".join(roles), self)
        self.roles_edit.setObjectName("role-set-roles")
        self.roles_edit.setPlaceholderText("chat=MODEL\nembed=MODEL")
        hint = QLabel(HINT, self)
        hint.setWordWrap(True)
        self.message = QLabel("", self)
        self.message.setObjectName("role-set-message")
        self.message.setWordWrap(True)
        # an error, in the colour the plan's "does not fit" uses (readable in both themes)
        self.message.setStyleSheet(f"color: {OVER_COLOUR.name()};")
        self.message.hide()
        form = QFormLayout()
        form.addRow("Name:", self.name_edit)
        form.addRow("Roles:", self.roles_edit)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(self.message)
        layout.addWidget(self.buttons)
        self.resize(640, 320)

    @property
    def name(self) -> str:
        return self.name_edit.text().strip()

    @property
    def roles(self) -> list[str]:
        return [x.strip() for x in self.roles_edit.toPlainText().splitlines() if x.strip()]

    def accept(self) -> None:
        """Saved only when the rows read: else the reason, inline, and the dialog stays."""
        why = self._check(self.name, self.roles)
        if why is not None:
            self.message.setText(why)
            self.message.show()
            return
        self.message.hide()
        super().accept()


AskRoles = Callable[[QWidget, str, list[str], Check], tuple[str, list[str]] | None]


def ask_roles(
    parent: QWidget, name: str, roles: list[str], check: Check
) -> tuple[str, list[str]] | None:
    """The name and rows the user saved, None when cancelled."""
    dialog = RoleSetDialog(parent, name=name, roles=roles, check=check)
    try:
        if dialog.exec() != QDialog.DialogCode.Accepted:
            return None
        return dialog.name, dialog.roles
    finally:
        dialog.deleteLater()
