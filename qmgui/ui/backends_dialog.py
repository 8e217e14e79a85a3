"""The Backends dialog: the backend registry as a table, edited on a copy and saved on Save.

The dialog works on a copy of the registry (`Backend` values from `qmgui.core.backends`):
Add, Edit, Remove (with Undo until the dialog closes) and ★ per class change the copy, and
Save writes what changed with `save_changes`: merged, under the settings lock, into the file as
it is at that moment, so an entry the CLI added while the dialog was open is kept. Close (Esc,
the title bar's ×) with unsaved changes asks first: Save, Discard or Cancel. A settings
file that could not be loaded (a `LoadResult` that is `read_only`) is never written over: the
dialog says so and Save stays off.

Probing runs the engine binary (`qmgui.engines.probe.probe`), so it runs on a worker thread
(`LatestWins`); the editor shows what it found (version, devices, problems) before the entry is
taken. The "serves" view resolves the models given to the dialog against the edited registry
(`resolve_backend`, with the models' pins from the settings), so a ★ moved here shows at once
which models follow it.

Open it from the main window with::

    dialog = BackendsDialog(
        self, settings_loader=lambda: self._loaded, models=self.table.model.entries
    )
    dialog.saved.connect(self._on_backends_saved)  # gets the LoadResult that was written
    dialog.open()

The window must adopt the saved `LoadResult` (the settings as they are in the file after the
save, other processes' changes included).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from PySide6.QtCore import QEvent, QObject, QPoint, Qt, Signal
from PySide6.QtGui import QAction, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qmgui import notify
from qmgui.core.backends import (
    CLASSES,
    CUSTOM,
    KINDS,
    Backend,
    clear_default,
    default_for_class,
    default_problem,
    find_backend,
    kind_classes,
    registry_problems,
    resolve_backend,
    set_default,
    sort_classes,
)
from qmgui.core.discovery import ModelEntry
from qmgui.core.errors import SettingsError
from qmgui.core.probe import ProbeResult
from qmgui.service.backends import (
    PROBE_TIMEOUT_S,
    executable_warning,
    new_backend_problem,
    stored_executable,
    with_probe,
)
from qmgui.settings import BackendEntry, LoadResult, load_settings, save_changes
from qmgui.ui.workers import LatestWins

__all__ = ["COLUMNS", "NO_DEFAULT", "BackendEditor", "BackendsDialog", "Prober", "with_probe"]

SOURCE = "backends"
COLUMNS = ("ID", "Kind", "Serves", "★ Default for", "Version", "Variant", "Executable")
NO_DEFAULT = "(no ★: first entry that serves it)"
NO_BACKEND = "(no backend)"
PROBE_WAIT_S = 4 * PROBE_TIMEOUT_S  # three bounded runs, and some slack

Prober = Callable[[str, str], ProbeResult]
"""Probes one executable of a kind: ``prober(executable, kind)``. Runs on a worker thread."""


def _default_prober(executable: str, kind: str) -> ProbeResult:
    from qmgui.engines.probe import probe  # noqa: PLC0415 - runs the binary: only when asked

    result = probe(executable, kind=kind, timeout_s=PROBE_TIMEOUT_S)
    if kind == "llama":  # what plan and place keep of its --list-devices is this now
        from qmgui.service.devices import remember  # noqa: PLC0415 - after a probe only

        remember(executable, result)
    return result


def probe_report(result: ProbeResult) -> str:
    """What the editor shows for a probe: version, devices and every problem, one a line."""
    if not result.ok:
        lines = [f"Probe failed: {result.summary()}"]
    else:
        lines = [f"Version: {result.label}"]
        if result.variant:
            lines.append(f"Variant: {result.variant}")
        if result.devices_listed:
            lines += [
                f"Device: {d.name}: {d.description} ({d.total_mib} MiB, {d.free_mib} MiB free)"
                for d in result.devices
            ] or ["Devices: none (no GPU device listed)"]
        options = len([g for g in result.flag_groups if not g.removed])
        lines.append(f"Options: {options}" if options else "Options: none listed by --help")
    lines += [f"Problem: {p}" for p in result.problems]
    return "\n".join(lines)


# --- the editor -----------------------------------------------------------------------------


class BackendEditor(QDialog):
    """Add one entry (`original` None) or edit one (its id stays fixed).

    The executable is probed on a worker (`probe()`; also when a file is picked or the path
    is edited); `backend()` is the entry as the form stands, with the last probe's findings
    when that probe was of the executable and kind now in the form.
    """

    probed = Signal(object)  # the ProbeResult, on the GUI thread

    def __init__(
        self,
        parent: QWidget | None,
        *,
        others: Sequence[Backend],
        original: Backend | None = None,
        prober: Prober = _default_prober,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Edit backend" if original else "Add backend")
        self._others = tuple(others)
        self._original = original
        self._prober = prober
        self._probe: tuple[str, str, ProbeResult] | None = None  # exe, kind, result
        self._runner = LatestWins("probe", self)
        self._runner.finished.connect(self._on_probed)
        self._runner.failed.connect(self._on_probe_error)
        self._runner.busyChanged.connect(lambda _busy: self._refresh())

        self.id_edit = QLineEdit(self)
        self.kind_combo = QComboBox(self)
        self.kind_combo.addItems(list(KINDS))
        self.exe_edit = QLineEdit(self)
        self.browse_button = QPushButton("Browse…", self)
        self.probe_button = QPushButton("Probe", self)
        self.variant_edit = QLineEdit(self)
        self.variant_edit.setPlaceholderText("cuda, rocm, vulkan, sycl, cpu… (probing fills it)")
        self.family_edit = QLineEdit(self)
        self.family_edit.setPlaceholderText("model families, comma-separated (optional)")
        self.class_boxes = {c: QCheckBox(c, self) for c in CLASSES}
        self.report = QPlainTextEdit(self)
        self.report.setReadOnly(True)
        self.report.setPlaceholderText("Probe the executable to see its version and devices.")
        self.problem_label = QLabel(self)
        self.problem_label.setWordWrap(True)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        self._lay_out()
        if original is not None:
            self._fill(original)
        self._connect()
        self._kind_changed()
        self.resize(640, 420)

    def _lay_out(self) -> None:
        exe_row = QHBoxLayout()
        exe_row.addWidget(self.exe_edit, 1)
        exe_row.addWidget(self.browse_button)
        exe_row.addWidget(self.probe_button)
        classes_row = QHBoxLayout()
        for box in self.class_boxes.values():
            classes_row.addWidget(box)
        form = QFormLayout()
        form.addRow("&ID:", self.id_edit)
        form.addRow("&Kind:", self.kind_combo)
        form.addRow("&Executable:", exe_row)
        form.addRow("Serves:", classes_row)
        form.addRow("&Variant:", self.variant_edit)
        form.addRow("&Family:", self.family_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.report, 1)
        layout.addWidget(self.problem_label)
        layout.addWidget(self.buttons)

    def _fill(self, original: Backend) -> None:
        self.id_edit.setText(original.id)
        self.id_edit.setReadOnly(True)
        self.kind_combo.setCurrentText(original.kind)
        self.exe_edit.setText(original.executable)
        self.variant_edit.setText(original.variant or "")
        self.family_edit.setText(original.family or "")
        for c in original.classes:
            self.class_boxes[c].setChecked(True)

    def _connect(self) -> None:
        self.id_edit.textChanged.connect(self._refresh)
        self.kind_combo.currentTextChanged.connect(self._kind_changed)
        self.exe_edit.textChanged.connect(self._refresh)
        self.exe_edit.editingFinished.connect(self._exe_edited)
        for box in self.class_boxes.values():
            box.toggled.connect(self._refresh)
        self.browse_button.clicked.connect(self.browse)
        self.probe_button.clicked.connect(self.probe)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)

    # -- reading the form --

    @property
    def probing(self) -> bool:
        return self._runner.busy

    @property
    def last_probe(self) -> ProbeResult | None:
        return self._probe[2] if self._probe else None

    def _exe(self) -> str:
        text = self.exe_edit.text().strip()
        return stored_executable(text) if text else ""

    def _classes(self) -> list[str]:
        if self.kind_combo.currentText() != CUSTOM:
            return []
        return [c for c, box in self.class_boxes.items() if box.isChecked()]

    def problem(self) -> str | None:
        """Why the form cannot be taken as it stands, or None."""
        return new_backend_problem(
            self._others,
            backend_id=self.id_edit.text(),
            kind=self.kind_combo.currentText(),
            exe=self.exe_edit.text(),
            classes=self._classes(),
        )

    def backend(self) -> Backend:
        """The entry as the form stands (check `problem()` first)."""
        kind = self.kind_combo.currentText()
        exe = self._exe()
        base = self._original or Backend(id=self.id_edit.text().strip(), kind=kind, executable="")
        if base.executable != exe or base.kind != kind:
            # another binary: what was probed of the old one no longer holds
            base = replace(base, version=None, build=None, capabilities={})
        b = replace(
            base,
            kind=kind,
            executable=exe,
            classes=frozenset(self._classes()),
            variant=self.variant_edit.text().strip() or None,
            family=self.family_edit.text().strip() or None,
        )
        b = replace(b, default_for=b.default_for & b.served_classes)
        if self._probe is not None and self._probe[:2] == (exe, kind):
            b = with_probe(b, self._probe[2])
        return b

    # -- actions --

    def browse(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(self, "Engine executable", self._exe())
        if path:
            self.exe_edit.setText(path)
            self.probe()

    def probe(self) -> None:
        """Probe the executable in the form on the worker; `probed` says when it is done."""
        exe, kind = self._exe(), self.kind_combo.currentText()
        if not exe:
            return
        warning = executable_warning(exe)
        self.report.setPlainText(f"Probing {exe}…" + (f"\nWarning: {warning}" if warning else ""))
        prober = self._prober
        self._runner.submit(lambda: (exe, kind, prober(exe, kind)))

    def wait(self, timeout: float | None = PROBE_WAIT_S) -> None:
        """Join the probe thread (the dialog calls it on close; tests call it too)."""
        self._runner.cancel()
        self._runner.wait(timeout)

    def done(self, result: int) -> None:
        if result == QDialog.DialogCode.Accepted and self.problem() is not None:
            self._refresh()
            return
        self.wait()
        super().done(result)

    # -- slots --

    def _exe_edited(self) -> None:
        exe = self._exe()
        if exe and (self._probe is None or self._probe[0] != exe) and not self.probing:
            self.probe()

    def _kind_changed(self) -> None:
        custom = self.kind_combo.currentText() == CUSTOM
        served = kind_classes(self.kind_combo.currentText())
        for c, box in self.class_boxes.items():
            box.setEnabled(custom)
            if not custom:
                box.blockSignals(True)
                box.setChecked(c in served)
                box.blockSignals(False)
        self._refresh()

    def _on_probed(self, value: object) -> None:
        if not isinstance(value, tuple):
            return
        exe, kind, result = value
        self._probe = (exe, kind, result)
        text = probe_report(result)
        warning = executable_warning(exe)
        if warning and not result.ok:
            text += f"\nWarning: {warning}"
        self.report.setPlainText(text)
        if result.ok and result.variant and not self.variant_edit.text().strip():
            self.variant_edit.setPlaceholderText(f"{result.variant} (probed)")
        self._refresh()
        self.probed.emit(result)

    def _on_probe_error(self, error: str) -> None:
        self.report.setPlainText(f"Probe failed: {error}")
        self._refresh()

    def _refresh(self) -> None:
        problem = self.problem()
        self.problem_label.setText(f"⚠ {problem}" if problem else "")
        self.buttons.button(QDialogButtonBox.StandardButton.Ok).setEnabled(problem is None)
        self.probe_button.setEnabled(bool(self.exe_edit.text().strip()) and not self.probing)


# --- the dialog -----------------------------------------------------------------------------


class BackendsDialog(QDialog):
    """The backend registry: table, ★ per class, what each entry serves, problems, Save.

    `settings_loader` gives the settings to edit (default `load_settings`); `models` are the
    models the "serves" view resolves (their pins come from the settings' model overrides).
    `prober` probes an executable (tests pass a fake); it runs on a worker thread.
    `saved` is emitted with the new `LoadResult` after Save wrote the file.
    """

    saved = Signal(object)

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        settings_loader: Callable[[], LoadResult] = load_settings,
        models: Sequence[ModelEntry] = (),
        prober: Prober = _default_prober,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Backends")
        self._loaded = settings_loader()
        self._backends: tuple[Backend, ...] = tuple(
            e.to_core() for e in self._loaded.settings.backends
        )
        self._models = tuple(models)
        self._prober = prober
        self._removed: list[tuple[int, Backend]] = []  # the undo stack
        self._dirty = False
        self._closing = False  # Save/Discard answered: the next reject closes for real
        self.editor: BackendEditor | None = None
        self.unsaved_box: QMessageBox | None = None  # "Save the changes?" while it is open

        self._build()
        self._actions()
        self._connect()
        self._show_banner()
        self._refresh()
        if self._backends:
            self.table.selectRow(0)
        self.resize(1000, 640)

    def _build(self) -> None:
        self.banner = QLabel(self)
        self.banner.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)

        self.add_button = QPushButton("&Add…", self)
        self.edit_button = QPushButton("&Edit…", self)
        self.remove_button = QPushButton("&Remove", self)
        self.undo_button = QPushButton("&Undo remove", self)
        for b in (self.add_button, self.edit_button, self.remove_button, self.undo_button):
            b.setAutoDefault(False)
        row_buttons = QHBoxLayout()
        for b in (self.add_button, self.edit_button, self.remove_button, self.undo_button):
            row_buttons.addWidget(b)
        row_buttons.addStretch(1)

        self.default_combos: dict[str, QComboBox] = {}
        defaults_box = QGroupBox("★ Default per class", self)
        defaults_form = QFormLayout(defaults_box)
        for c in CLASSES:
            combo = QComboBox(defaults_box)
            combo.activated.connect(lambda _i, c=c: self._default_chosen(c))
            self.default_combos[c] = combo
            defaults_form.addRow(f"{c}:", combo)

        self.serves = QTreeWidget(self)
        self.serves.setHeaderLabels(["Backend / model", "Why"])
        self.serves.header().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.problems = QLabel(self)
        self.problems.setWordWrap(True)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Close, self
        )
        for button in self.buttons.buttons():
            if isinstance(button, QPushButton):
                button.setAutoDefault(False)
                button.setDefault(False)
        self._lay_out(row_buttons, defaults_box)

    def _lay_out(self, row_buttons: QHBoxLayout, defaults_box: QGroupBox) -> None:
        lower = QWidget(self)
        lower_layout = QHBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addWidget(defaults_box)
        lower_layout.addWidget(self.serves, 1)
        top = QWidget(self)
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        top_layout.addWidget(self.table, 1)
        top_layout.addLayout(row_buttons)
        splitter = QSplitter(Qt.Orientation.Vertical, self)
        splitter.addWidget(top)
        splitter.addWidget(lower)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.problems)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)

    def _connect(self) -> None:
        self.add_button.clicked.connect(self.add_backend)
        self.edit_button.clicked.connect(self.edit_selected)
        self.remove_button.clicked.connect(self.remove_selected)
        self.undo_button.clicked.connect(self.undo_remove)
        self.table.itemSelectionChanged.connect(self._refresh_buttons)
        self.table.doubleClicked.connect(lambda _index: self.edit_selected())
        self.table.customContextMenuRequested.connect(self._context_menu)
        self.buttons.button(QDialogButtonBox.StandardButton.Save).clicked.connect(self.save)
        self.buttons.rejected.connect(self.reject)

    def _actions(self) -> None:
        def action(text: str, keys: Sequence[QKeySequence], slot: Callable[[], object]) -> QAction:
            a = QAction(text, self.table)
            a.setShortcuts(list(keys))
            a.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            a.triggered.connect(slot)
            self.table.addAction(a)
            return a

        self.remove_action = action(
            "Remove", [QKeySequence(Qt.Key.Key_Delete)], self.remove_selected
        )
        self.edit_action = action(
            "Edit…",
            [QKeySequence(Qt.Key.Key_Return), QKeySequence(Qt.Key.Key_Enter)],
            self.edit_selected,
        )
        # Ctrl+Z anywhere in the dialog (a focused line edit keeps its own undo)
        self.undo_action = QAction("Undo remove", self)
        self.undo_action.setShortcut(QKeySequence.StandardKey.Undo)
        self.undo_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.undo_action.triggered.connect(self.undo_remove)
        self.addAction(self.undo_action)
        # the same keys when no shortcut fires (an inactive window, or a test's key events)
        self.table.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.table and event.type() == QEvent.Type.KeyPress:
            assert isinstance(event, QKeyEvent)
            key, mods = event.key(), event.modifiers()
            if key == Qt.Key.Key_Delete and mods == Qt.KeyboardModifier.NoModifier:
                self.remove_selected()
                return True
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                mods & ~Qt.KeyboardModifier.KeypadModifier
            ):
                self.edit_selected()
                return True
            if event.matches(QKeySequence.StandardKey.Undo):
                self.undo_remove()
                return True
        return super().eventFilter(watched, event)

    # -- state --

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The registry as edited so far (saved or not)."""
        return self._backends

    @property
    def read_only(self) -> bool:
        return self._loaded.read_only

    @property
    def dirty(self) -> bool:
        return self._dirty

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return item.text() if item is not None else None

    def select_id(self, backend_id: str) -> bool:
        for row, b in enumerate(self._backends):
            if b.id == backend_id:
                self.table.selectRow(row)
                return True
        return False

    def _change(
        self, backends: Sequence[Backend], message: str, *, select: str | None = None
    ) -> None:
        self._backends = tuple(backends)
        self._dirty = True
        self.status.setText(message)
        self._refresh()
        if select is not None:
            self.select_id(select)

    # -- add, edit, remove, undo --

    def add_backend(self) -> BackendEditor:
        """Open the editor for a new entry (non-blocking; `editor` holds it)."""
        return self._open_editor(None)

    def edit_selected(self) -> BackendEditor | None:
        backend_id = self.selected_id()
        original = find_backend(self._backends, backend_id) if backend_id else None
        if original is None:
            return None
        return self._open_editor(original)

    def _open_editor(self, original: Backend | None) -> BackendEditor:
        if self.editor is not None:
            self.editor.reject()
        others = [b for b in self._backends if original is None or b.id != original.id]
        editor = BackendEditor(self, others=others, original=original, prober=self._prober)
        editor.accepted.connect(lambda: self._editor_accepted(editor, original))
        editor.finished.connect(lambda _r: self._editor_finished(editor))
        self.editor = editor
        editor.open()
        return editor

    def _editor_finished(self, editor: BackendEditor) -> None:
        if self.editor is editor:
            self.editor = None
        editor.deleteLater()

    def _editor_accepted(self, editor: BackendEditor, original: Backend | None) -> None:
        new = editor.backend()
        if original is None:
            self._change((*self._backends, new), f"Added {new.id} ({new.kind}).", select=new.id)
            return
        lost = sort_classes(original.default_for - new.default_for)
        note = (
            f" It is no longer ★ for {', '.join(lost)}: a {new.kind} backend does not serve it."
            if lost
            else ""
        )
        updated = tuple(new if b.id == original.id else b for b in self._backends)
        self._change(updated, f"Edited {new.id}.{note}", select=new.id)

    def remove_selected(self) -> Backend | None:
        backend_id = self.selected_id()
        if backend_id is None:
            return None
        row = next(i for i, b in enumerate(self._backends) if b.id == backend_id)
        gone = self._backends[row]
        kept = self._backends[:row] + self._backends[row + 1 :]
        self._removed.append((row, gone))
        notes = []
        for c in sort_classes(gone.default_for):
            heir = next((b for b in kept if b.serves(c)), None)
            notes.append(
                f"{c} has no ★ now ({heir.id!r} serves it)" if heir else f"nothing serves {c} now"
            )
        detail = f" ({'; '.join(notes)})" if notes else ""
        self._change(kept, f"Removed {gone.id}{detail}. Ctrl+Z undoes it.")
        if kept:
            self.table.selectRow(min(row, len(kept) - 1))
        return gone

    def undo_remove(self) -> Backend | None:
        """Put the last removed entry back where it was (its ★ where no other entry took it)."""
        if not self._removed:
            return None
        row, gone = self._removed.pop()
        if find_backend(self._backends, gone.id) is not None:
            self.status.setText(f"{gone.id} was not restored: another entry now has that id.")
            self._refresh_buttons()
            return None
        taken = {c for c in gone.default_for if default_for_class(self._backends, c) is not None}
        restored = replace(gone, default_for=gone.default_for - taken)
        backends = list(self._backends)
        backends.insert(min(row, len(backends)), restored)
        note = f" (★ for {', '.join(sort_classes(taken))} stays where it is now)" if taken else ""
        self._change(backends, f"Restored {gone.id}{note}.", select=gone.id)
        return restored

    # -- ★ defaults --

    def set_star(self, backend_id: str | None, model_class: str) -> str | None:
        """Make `backend_id` the ★ of `model_class` (None: no ★); returns the problem, or
        None when done. The status line says which entry had the ★ before."""
        before = default_for_class(self._backends, model_class)
        if backend_id is None:
            if before is None:
                return None
            self._change(
                clear_default(self._backends, model_class),
                f"{model_class} has no ★ now (was {before.id}).",
            )
            return None
        problem = default_problem(self._backends, backend_id, model_class)
        if problem is not None:
            self.status.setText(problem)
            return problem
        if before is not None and before.id == backend_id:
            return None
        was = f" (was {before.id})" if before is not None else ""
        self._change(
            set_default(self._backends, backend_id, model_class),
            f"★ {backend_id} is now the default for {model_class}{was}.",
            select=self.selected_id(),
        )
        return None

    def _default_chosen(self, model_class: str) -> None:
        value = self.default_combos[model_class].currentData()
        self.set_star(value if isinstance(value, str) else None, model_class)

    def _context_menu(self, pos: QPoint) -> None:
        item = self.table.itemAt(pos)
        if item is None:
            return
        self.table.selectRow(item.row())
        backend = self._backends[item.row()]
        menu = QMenu(self)
        menu.addAction("Edit…", self.edit_selected)
        menu.addAction("Remove", self.remove_selected)
        menu.addSeparator()
        for c in sort_classes(backend.served_classes):
            holder = default_for_class(self._backends, c)
            text = f"★ default for {c}" + (
                f" (now {holder.id})" if holder and holder.id != backend.id else ""
            )
            a = menu.addAction(text)
            a.setCheckable(True)
            a.setChecked(c in backend.default_for)
            a.triggered.connect(
                lambda on, c=c, bid=backend.id: self.set_star(bid if on else None, c)
            )
        menu.popup(self.table.viewport().mapToGlobal(pos))

    # -- saving --

    def save(self) -> bool:
        """Write the registry to the settings file; False (and the dialog says why) if not."""
        if self.read_only:
            self.status.setText(self._read_only_text())
            return False
        old = {e.id: e for e in self._loaded.settings.backends}
        try:
            entries = [BackendEntry.from_core(b, base=old.get(b.id)) for b in self._backends]
            settings = self._loaded.settings.model_copy(update={"backends": entries})
            saved = save_changes(self._loaded.settings, settings, self._loaded.path)
        except (SettingsError, ValueError) as e:
            self.status.setText(f"Not saved: {e}")
            notify.error(f"The backends were not saved: {e}", source=SOURCE)
            return False
        for message in saved.messages:  # the file had gone bad: moved aside, ours written
            notify.warning(message, source="settings")
        path = saved.path or self._loaded.path
        self._loaded = dataclasses.replace(self._loaded, settings=saved.settings, path=path)
        # the registry as saved: entries another process added meanwhile show up here too
        fresh = tuple(e.to_core() for e in saved.settings.backends)
        if fresh != self._backends:
            self._backends = fresh
            self._refresh()
        self._dirty = False
        self.status.setText(f"Saved to {path}.")
        self._refresh_buttons()
        self.saved.emit(self._loaded)
        return True

    def _read_only_text(self) -> str:
        return (
            f"⚠ {self._loaded.path or 'The settings file'} could not be loaded or moved aside;"
            " saving would overwrite it, so changes made here cannot be saved. Fix, move or"
            " delete that file first."
        )

    def _show_banner(self) -> None:
        lines = list(self._loaded.messages)
        if self.read_only:
            lines.insert(0, self._read_only_text())
        self.banner.setText("\n".join(lines))
        self.banner.setVisible(bool(lines))

    def done(self, result: int) -> None:
        if result != QDialog.DialogCode.Accepted and self._dirty and not self._closing:
            self.ask_unsaved()  # Close, Esc or the title bar's ×: never discard silently
            return
        if self.editor is not None:
            self.editor.reject()
        if self.unsaved_box is not None:
            self.unsaved_box.close()
        super().done(result)

    def ask_unsaved(self) -> QMessageBox:
        """Ask what to do with unsaved changes: Save (then close), Discard (close) or Cancel
        (keep editing). Window-modal and non-blocking; `unsaved_box` holds it while open."""
        if self.unsaved_box is not None:
            self.unsaved_box.raise_()
            return self.unsaved_box
        b = QMessageBox.StandardButton
        buttons = (b.Discard | b.Cancel) if self.read_only else (b.Save | b.Discard | b.Cancel)
        box = QMessageBox(
            QMessageBox.Icon.Question,
            "Unsaved backends",
            "The backend registry has changes that are not saved.",
            buttons,
            self,
        )
        box.setInformativeText(
            (self._read_only_text() if self.read_only else "Save them before closing?")
            + (f"\n\nLast change: {self.status.text()}" if self.status.text() else "")
        )
        box.setDefaultButton(b.Cancel if self.read_only else b.Save)
        box.setEscapeButton(b.Cancel)
        box.finished.connect(lambda _r: self._unsaved_answered(box))
        self.unsaved_box = box
        box.open()
        return box

    def _unsaved_answered(self, box: QMessageBox) -> None:
        if self.unsaved_box is box:
            self.unsaved_box = None
        box.deleteLater()
        answer = box.standardButton(box.clickedButton())
        b = QMessageBox.StandardButton
        if answer == b.Save and not self.save():
            return  # the status line says why; the dialog stays open with the changes
        if answer in (b.Save, b.Discard):
            self._closing = True
            try:
                self.reject()
            finally:
                self._closing = False

    # -- views --

    def _refresh(self) -> None:
        self._fill_table()
        self._fill_defaults()
        self._fill_serves()
        problems = registry_problems(self._backends)
        self.problems.setText("\n".join(f"⚠ {p}" for p in problems))
        self.problems.setVisible(bool(problems))
        self._refresh_buttons()

    def _refresh_buttons(self) -> None:
        has = self.selected_id() is not None
        self.edit_button.setEnabled(has)
        self.remove_button.setEnabled(has)
        self.undo_button.setEnabled(bool(self._removed))
        self.undo_action.setEnabled(bool(self._removed))
        save = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        save.setEnabled(self._dirty and not self.read_only)
        if self.read_only:
            save.setToolTip("The settings file could not be loaded; saving would overwrite it.")

    def _fill_table(self) -> None:
        selected = self.selected_id()
        self.table.setRowCount(len(self._backends))
        for row, b in enumerate(self._backends):
            cells = (
                b.id,
                b.kind,
                ", ".join(sort_classes(b.served_classes)) or "-",
                ", ".join(f"★ {c}" for c in sort_classes(b.default_for)) or "",
                b.version or "-",
                b.variant or "-",
                b.executable,
            )
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
                self.table.setItem(row, col, item)
            warning = executable_warning(b.executable)
            exe_item = self.table.item(row, len(COLUMNS) - 1)
            if warning and exe_item is not None:
                exe_item.setToolTip(warning)
        if selected is not None:
            self.select_id(selected)

    def _fill_defaults(self) -> None:
        for c, combo in self.default_combos.items():
            combo.blockSignals(True)
            combo.clear()
            combo.addItem(NO_DEFAULT, None)
            for b in self._backends:
                if b.serves(c):
                    combo.addItem(f"★ {b.id}", b.id)
            star = default_for_class(self._backends, c)
            combo.setCurrentIndex(max(0, combo.findData(star.id)) if star else 0)
            combo.setEnabled(combo.count() > 1)
            combo.blockSignals(False)

    def served_models(self) -> dict[str | None, list[tuple[ModelEntry, str]]]:
        """Which entry serves each model given to the dialog (None: no entry), with why."""
        pins: Mapping[str, str | None] = {
            k: o.backend_id for k, o in self._loaded.settings.model_overrides.items()
        }
        served: dict[str | None, list[tuple[ModelEntry, str]]] = {b.id: [] for b in self._backends}
        for m in self._models:
            choice = resolve_backend(m, self._backends, pin=pins.get(m.id))
            served.setdefault(choice.backend_id, []).append((m, choice.reason))
        return served

    def _fill_serves(self) -> None:
        self.serves.clear()
        for backend_id, rows in self.served_models().items():
            label = backend_id if backend_id is not None else NO_BACKEND
            top = QTreeWidgetItem([f"{label} ({len(rows)} model{'s' * (len(rows) != 1)})", ""])
            top.setData(0, Qt.ItemDataRole.UserRole, backend_id)
            for m, reason in rows:
                QTreeWidgetItem(top, [m.name, reason])
            self.serves.addTopLevelItem(top)
            top.setExpanded(True)
