"""Profiles in the window: what the user sets for the selected model is saved as its profile
(debounced, on a worker), the values saved are shown under the plan ("Saved for this model:
…") with "Reset to defaults" (and Undo), and "Paste command…" reads a llama-server or
`vllm serve` command line into a model's profile.

The rules are `qmgui.core.profile`'s and the file is written by `qmgui.service.profile`
(under the settings lock); the window owns a `Profiles` and hooks it in with a few lines."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QSignalBlocker, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLayoutItem,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from qmgui import notify
from qmgui.core.command_import import (
    CommandError,
    ParsedCommand,
    parse_command,
)
from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.errors import SettingsError
from qmgui.core.launch import LaunchSettings
from qmgui.core.profile import (
    LAUNCH_FIELDS,
    PANEL_FIELDS,
    VLLM_FIELDS,
    apply_profile,
    clean,
    describe,
    profile_from_settings,
)
from qmgui.core.vllm import PARSER_OFF, QWEN3_CODER_PARSER, TOOL_CALL_PARSERS
from qmgui.service.profile import KEEP_ON_RESET, profile_of, with_profile
from qmgui.settings import LoadResult, ModelOverride, Settings, merge_settings, save_changes
from qmgui.ui.plan_panel import DEFAULT_CONTEXT, PlanPanel
from qmgui.ui.workers import InOrder

if TYPE_CHECKING:
    from qmgui.ui.main_window import MainWindow

SOURCE = "window"
SAVE_DELAY_MS = 400  # a slider drag saves once, this long after it stops
# what "Paste command…" replaces: the command is the whole launch
COMMAND_FIELDS = (*LAUNCH_FIELDS, *VLLM_FIELDS, "devices", "extra_args")
WINDOW_FIELDS = frozenset({*PANEL_FIELDS, "devices"})  # what the window shows and saves


def window_defaults(entry: ModelEntry) -> LaunchSettings:
    """Where a model without a profile starts in the window: 8192 tokens, or its trained
    context when that is smaller."""
    trained = (entry.meta.context_length if entry.meta else None) or DEFAULT_CONTEXT
    return LaunchSettings(ctx_size=min(DEFAULT_CONTEXT, trained))


def window_settings(entry: ModelEntry, ov: ModelOverride | None) -> LaunchSettings:
    """The settings the window shows for `entry`: its profile over the window's defaults."""
    s = apply_profile(LaunchSettings(), profile_of(ov))
    return s if s.ctx_size is not None else replace(s, ctx_size=window_defaults(entry).ctx_size)


def panel_profile(
    entry: ModelEntry, settings: LaunchSettings, extra_args: str, gpus: Sequence[int]
) -> dict[str, Any]:
    """The profile values of what the window shows: only those that differ from the
    window's defaults (`window_defaults`)."""
    values = profile_from_settings(settings, window_defaults(entry))
    if extra_args.strip():
        values["extra_args"] = [extra_args.strip()]
    if gpus:
        values["devices"] = list(gpus)
    return values


def absolute_paths(profile: dict[str, Any]) -> dict[str, Any]:
    """A pasted command's projector as an absolute path (it was relative to where the
    command ran; the closest guess here is the current folder)."""
    mmproj = profile.get("mmproj")
    if isinstance(mmproj, str) and mmproj:
        profile["mmproj"] = os.path.abspath(os.path.expanduser(mmproj))
    return profile


class ProfileBar(QWidget):
    """ "Saved for this model: context 16,384 · K cache q8_0" with Reset to defaults / Undo."""

    resetRequested = Signal()
    undoRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("profile-bar")
        self.label = QLabel("", self)
        self.label.setWordWrap(True)
        self.reset_button = QPushButton("Reset to defaults", self)
        self.reset_button.setToolTip(
            "Forget what is saved for this model (its port is kept); Undo brings it back"
        )
        self.undo_button = QPushButton("Undo", self)
        self.undo_button.setToolTip("Bring back the settings that were reset")
        self.undo_button.hide()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.undo_button)
        layout.addWidget(self.reset_button)
        self.reset_button.clicked.connect(self.resetRequested)
        self.undo_button.clicked.connect(self.undoRequested)
        self.show_profile(None)

    def show_profile(self, profile: Mapping[str, Any] | None, *, undo: bool = False) -> None:
        words = describe(profile) if profile is not None else []
        if profile is None:
            self.label.setText("")
        elif words:
            self.label.setText("<b>Saved for this model:</b> " + " · ".join(_escape(words)))
        else:
            self.label.setText("Defaults: nothing saved for this model yet")
        self.label.setToolTip(
            "Saved for this model, used by the window, the tray, run sets and every qmgui "
            "command:\n" + "\n".join(words)
            if words
            else "Change a setting and it is saved for this model"
        )
        resettable = profile is not None and any(k not in KEEP_ON_RESET for k in clean(profile))
        self.reset_button.setEnabled(resettable)
        self.undo_button.setVisible(undo)


def _escape(words: Iterable[str]) -> list[str]:
    return [w.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for w in words]


AUTO = "auto"
GIB = 1024**3


class VllmBox(QWidget):
    """The vLLM fields of a Hugging Face model's profile (the context is the plan panel's:
    its `--max-model-len`). 0 / empty means "derive it". `changed` after every edit."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vllm-box")
        self.util = QDoubleSpinBox(self)
        self.util.setRange(0.0, 1.0)
        self.util.setSingleStep(0.05)
        self.util.setDecimals(2)
        self.util.setSpecialValueText(AUTO)
        self.util.setToolTip(
            "--gpu-memory-utilization: the share of each card vLLM takes (auto: derived from "
            "the budget)"
        )
        self.tp = QSpinBox(self)
        self.tp.setRange(0, 64)
        self.tp.setSpecialValueText(AUTO)
        self.tp.setToolTip("--tensor-parallel-size: GPUs per model (auto: every GPU planned for)")
        self.budget = QDoubleSpinBox(self)
        self.budget.setRange(0.0, 4096.0)
        self.budget.setDecimals(1)
        self.budget.setSuffix(" GiB")
        self.budget.setSpecialValueText(AUTO)
        self.budget.setToolTip("The VRAM per GPU to size the launch for (auto: the card's free)")
        self.tokenizer = QLineEdit(self)
        self.tokenizer.setPlaceholderText("the model's own")
        self.tokenizer.setToolTip("--tokenizer: a folder or Hugging Face repo")
        self.parser = QComboBox(self)
        self.parser.setEditable(True)
        self.parser.addItems(
            ["", PARSER_OFF, *sorted({*TOOL_CALL_PARSERS.values(), QWEN3_CODER_PARSER})]
        )
        line = self.parser.lineEdit()
        if line is not None:
            line.setPlaceholderText("by model family")
        self.parser.setToolTip("--tool-call-parser (none: no tool calling)")
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("GPU memory share", self.util)
        form.addRow("Tensor parallel", self.tp)
        form.addRow("VRAM budget", self.budget)
        form.addRow("Tokenizer", self.tokenizer)
        form.addRow("Tool-call parser", self.parser)
        for spin in (self.util, self.budget):
            spin.valueChanged.connect(self.changed)
        self.tp.valueChanged.connect(self.changed)
        self.tokenizer.editingFinished.connect(self.changed)
        self.parser.currentTextChanged.connect(self.changed)

    def set_values(self, profile: Mapping[str, Any]) -> None:
        widgets = (self.util, self.tp, self.budget, self.tokenizer, self.parser)
        blockers = [QSignalBlocker(w) for w in widgets]
        self.util.setValue(float(profile.get("gpu_memory_utilization") or 0.0))
        self.tp.setValue(int(profile.get("tensor_parallel_size") or 0))
        self.budget.setValue((profile.get("vllm_budget_bytes") or 0) / GIB)
        self.tokenizer.setText(str(profile.get("tokenizer") or ""))
        self.parser.setCurrentText(str(profile.get("tool_call_parser") or ""))
        for b in blockers:
            b.unblock()

    def values(self) -> dict[str, Any]:
        """The fields set, as profile values."""
        out: dict[str, Any] = {}
        if self.util.value() > 0:
            out["gpu_memory_utilization"] = round(self.util.value(), 2)
        if self.tp.value() > 0:
            out["tensor_parallel_size"] = self.tp.value()
        if self.budget.value() > 0:
            out["vllm_budget_bytes"] = int(self.budget.value() * GIB)
        if self.tokenizer.text().strip():
            out["tokenizer"] = self.tokenizer.text().strip()
        if self.parser.currentText().strip():
            out["tool_call_parser"] = self.parser.currentText().strip()
        return out


# the plan panel's llama.cpp-only rows, found by a widget they hold (hidden for vLLM)
def _llama_widgets(panel: PlanPanel) -> tuple[QWidget, ...]:
    return (panel.ctk, panel.slots, panel.flash, panel.ngl, panel.offload_row, panel.gpu_row)


def _contains(item: QLayoutItem | None, widget: QWidget) -> bool:
    if item is None:
        return False
    if item.widget() is widget:
        return True
    layout = item.layout()
    return layout is not None and (
        layout.indexOf(widget) >= 0
        or any(_contains(layout.itemAt(i), widget) for i in range(layout.count()))
    )


def show_llama_rows(panel: PlanPanel, visible: bool) -> None:
    """Show or hide the plan panel's llama.cpp knobs (a vLLM model has none of them)."""
    form = panel.layout()
    if not isinstance(form, QFormLayout):
        return
    widgets = _llama_widgets(panel)
    for row in range(form.rowCount()):
        for role in (QFormLayout.ItemRole.FieldRole, QFormLayout.ItemRole.SpanningRole):
            item = form.itemAt(row, role)
            if any(_contains(item, w) for w in widgets):
                form.setRowVisible(row, visible)
    panel.fit_button.setVisible(visible)


class PasteCommandDialog(QDialog):
    """Paste a llama-server / vllm serve command line; shows what will be kept."""

    def __init__(
        self,
        parent: QWidget,
        *,
        find: Callable[[str], ModelEntry | None],
        current: ModelEntry | None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Paste command")
        self.setObjectName("paste-command-dialog")
        self._find = find
        self._current = current
        self.parsed: ParsedCommand | None = None
        self.model_path: str | None = None
        self.edit = QPlainTextEdit(self)
        self.edit.setPlaceholderText(
            "llama-server -m /models/model.gguf -c 16384 -ngl 99 -fa on --jinja\n"
            "vllm serve /models/Qwen3-8B --max-model-len 32768 -tp 2"
        )
        self.edit.setAccessibleName("Command line")
        self.report = QLabel("", self)
        self.report.setWordWrap(True)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        ok.setText("Save to profile")
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("A llama-server or vllm serve command line:", self))
        layout.addWidget(self.edit, 1)
        layout.addWidget(self.report)
        layout.addWidget(self.buttons)
        self.edit.textChanged.connect(self.update_report)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.resize(640, 360)
        self.update_report()

    def set_text(self, text: str) -> None:
        self.edit.setPlainText(text)

    def update_report(self) -> None:
        ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        text = self.edit.toPlainText()
        self.parsed, self.model_path = None, None
        if not text.strip():
            self.report.setText("Paste a command to see what is kept.")
            ok.setEnabled(False)
            return
        try:
            parsed = parse_command(text)
        except CommandError as e:
            self.report.setText(f"Cannot read it: {e}")
            ok.setEnabled(False)
            return
        path = parsed.model
        lines: list[str] = []
        if path is None and self._current is not None:
            path = self._current.path
            lines.append(f"Model: {self._current.name} (selected; the command names none)")
        elif path is None:
            self.report.setText("The command names no model (-m PATH); select one first.")
            ok.setEnabled(False)
            return
        else:
            known = self._find(path)
            here = known is not None or os.path.exists(os.path.expanduser(path))
            if not here and self._current is not None:
                # `vllm serve org/repo`: a name, not a path here; the selected model it is
                lines.append(
                    f"Model: {self._current.name} (selected; {path} is not on this machine)"
                )
                path = self._current.path
            elif known is not None:
                lines.append(f"Model: {known.name} (in the library)")
            else:
                where = "not in the library" if here else "not found on this machine"
                lines.append(f"Model: {path} ({where})")
        stored = describe(parsed.values)
        lines.append("Settings: " + (", ".join(stored) if stored else "none"))
        if parsed.extra_args:
            lines.append("Kept as extra arguments: " + " ".join(parsed.extra_args))
        lines += [f"Note: {n}" for n in parsed.notes]
        self.report.setText("\n".join(lines))
        self.parsed, self.model_path = parsed, path
        ok.setEnabled(True)


class Profiles(QObject):
    """The window's profile logic: save on change, show, reset / undo, paste a command."""

    saved = Signal(object)  # LoadResult after a save reached the file

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.w = window
        self.bar = ProfileBar(window)
        self.vllm_box = VllmBox(window)
        self.vllm_box.hide()
        self._llama_rows = True  # the plan panel's llama.cpp rows on show
        self.vllm_box.changed.connect(self.vllm_changed)
        self._base: Settings | None = None  # the window's settings before unsaved changes
        self._inflight: list[Settings] = []  # the bases of the saves submitted, oldest first
        self._latest: Settings | None = None  # the window's settings after the last change
        self._undo: tuple[str, dict[str, Any]] | None = None
        self._applying = False
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(SAVE_DELAY_MS)
        self.timer.timeout.connect(self._write)
        self.worker = InOrder("profile", self)
        self.worker.finished.connect(self._on_saved)
        self.worker.failed.connect(self._on_failed)
        self.paste_action = QAction("Paste command…", window)
        self.paste_action.setShortcut(QKeySequence("Ctrl+Shift+V"))
        self.paste_action.setToolTip(
            "Read a llama-server or vllm serve command line into a model's saved settings "
            "(Ctrl+Shift+V)"
        )
        self.paste_action.triggered.connect(self.open_paste)
        window.addAction(self.paste_action)
        self.bar.resetRequested.connect(self.reset)
        self.bar.undoRequested.connect(self.undo)
        window.plan_panel.changed.connect(self.panel_changed)

    # --- showing ----------------------------------------------------------------------------
    def show_entry(self, entry: ModelEntry | None) -> LaunchSettings | None:
        """Put the model's profile into the plan panel (its settings, extra arguments and
        GPUs); returns the settings to show (None: no model)."""
        vllm = entry is not None and entry.format == "hf"
        self.vllm_box.setVisible(vllm)
        if vllm == self._llama_rows:  # only on a change: the panel shows its own rows
            self._llama_rows = not vllm
            show_llama_rows(self.w.plan_panel, not vllm)
        if entry is None:
            self.bar.show_profile(None)
            return None
        ov = self.w.settings.model_overrides.get(entry.id)
        profile = profile_of(ov)
        self.vllm_box.set_values(profile)
        self.bar.show_profile(profile, undo=self._undo is not None and self._undo[0] == entry.id)
        return window_settings(entry, ov)

    def vllm_changed(self) -> None:
        """A vLLM field of the selected model changed: keep it, plan again."""
        entry = self.w.plan_panel.entry
        if self._applying or entry is None or entry.meta is None or entry.error:
            return
        if self._store(entry, self.vllm_box.values(), VLLM_FIELDS):
            self.w.plan_panel.changed.emit()  # the window plans again

    def before_set_entry(self, entry: ModelEntry) -> None:
        """The GPUs the model's profile runs on (before the panel shows its split)."""
        profile = profile_of(self.w.settings.model_overrides.get(entry.id))
        self.w.plan_panel.select_gpus(tuple(profile.get("devices") or ()))

    def after_set_entry(self, entry: ModelEntry) -> None:
        """The extra arguments (`PlanPanel.set_entry` clears them for another model)."""
        profile = profile_of(self.w.settings.model_overrides.get(entry.id))
        self.w.plan_panel.set_extra_args(" ".join(profile.get("extra_args") or ()))

    # --- saving -----------------------------------------------------------------------------
    def panel_changed(self) -> None:
        """The user changed a setting of the selected model: keep it as its profile."""
        panel = self.w.plan_panel
        entry = panel.entry
        if self._applying or entry is None or entry.meta is None or entry.error:
            return
        values = panel_profile(
            entry, panel.full_settings(), panel.extra_args(), panel.selected_gpus()
        )
        fields = set(WINDOW_FIELDS)
        if len(panel.gpus) < 2:  # no GPU choice or split on show: keep the saved ones
            fields -= {"devices", "tensor_split"}
            values.pop("tensor_split", None)
        self._store(entry, values, fields)

    def _store(self, entry: ModelEntry, values: dict[str, Any], fields: Iterable[str]) -> bool:
        names = tuple(fields)
        try:
            ours = with_profile(self.w.settings, entry.id, values, replace=names)
        except ValueError as e:
            notify.error(f"{entry.name}: not saved: {e}", source=SOURCE)
            return False
        before = self.w.settings
        if ours == before:
            return False
        self.w.set_settings_in_memory(ours)
        if self._undo is not None and self._undo[0] == entry.id:
            self._undo = None
        self.bar.show_profile(profile_of(ours.model_overrides.get(entry.id)))
        if self.w.persisting:
            if self._base is None:
                self._base = before  # what the file is merged from: the window before
            self._latest = ours
            self.timer.start()
        return True

    def _write(self) -> None:
        """Save what changed since the first unsaved change, merged into the file as it is
        now (`save_changes`), on a worker."""
        base, ours, path = self._base, self._latest, self.w.settings_file
        if base is None or ours is None:
            return
        self._base = None
        self._inflight.append(base)
        self.worker.submit(lambda: save_changes(base, ours, path))

    def _on_saved(self, result: object) -> None:
        assert isinstance(result, LoadResult)
        if self._inflight:
            self._inflight.pop(0)
        for message in result.messages:  # the file was unusable: moved aside, ours written
            notify.warning(message, source="settings")
        if self._inflight or self._base is not None:
            self.w.wrote_settings()  # a later save is on its way: take the file after it
        else:
            self._latest = None
            self.w.saved_elsewhere(result.settings)
        self.saved.emit(result)

    def _on_failed(self, error: str) -> None:
        if self._inflight:
            self._inflight.pop(0)
        notify.error(f"profile not saved: {error}", source=SOURCE)

    def overlay(self, settings: Settings) -> Settings:
        """`settings` (the file, as another qmgui left it) with the changes made here and not
        saved yet put back on top."""
        base = self._inflight[0] if self._inflight else self._base
        if base is None or self._latest is None:
            return settings
        try:
            return merge_settings(base, self._latest, settings)
        except SettingsError:
            return settings

    @property
    def busy(self) -> bool:
        return self._base is not None or bool(self._inflight)

    def flush(self) -> None:
        """Write what is not saved yet, now (the window is closing)."""
        self.timer.stop()
        self.worker.wait()  # the one running finishes; those queued are saved below
        base = self._inflight[0] if self._inflight else self._base
        ours = self._latest
        self._inflight.clear()
        self._base, self._latest = None, None
        if base is None or ours is None:
            return
        try:
            save_changes(base, ours, self.w.settings_file)
        except Exception as e:  # a settings file that cannot be written is a message
            notify.error(f"profile not saved: {e}", source=SOURCE)

    # --- reset, undo ------------------------------------------------------------------------
    def reset(self) -> None:
        entry = self.w.plan_panel.entry
        if entry is None:
            return
        old = profile_of(self.w.settings.model_overrides.get(entry.id))
        cleared = {k: v for k, v in old.items() if k not in KEEP_ON_RESET}
        if not cleared:
            return
        self._store(entry, {}, cleared.keys())
        self._undo = (entry.id, cleared)
        self.reapply(entry)
        self.bar.show_profile(profile_of(self.w.settings.model_overrides.get(entry.id)), undo=True)
        notify.info(
            f"{entry.name}: reset to defaults (cleared {', '.join(describe(cleared))})",
            source=SOURCE,
        )

    def undo(self) -> None:
        entry = self.w.plan_panel.entry
        if self._undo is None or entry is None or self._undo[0] != entry.id:
            return
        _, values = self._undo
        self._undo = None
        self._store(entry, values, values.keys())
        self.reapply(entry)
        notify.info(f"{entry.name}: saved settings restored", source=SOURCE)

    def reapply(self, entry: ModelEntry) -> None:
        """Show the model's profile in the panel again (after a reset, an undo, a paste)."""
        panel = self.w.plan_panel
        if panel.entry is None or panel.entry.id != entry.id:
            return
        settings = self.show_entry(entry)
        assert settings is not None
        self._applying = True
        try:
            self.before_set_entry(entry)
            self.after_set_entry(entry)
            panel.apply(settings, notify=True)
        finally:
            self._applying = False

    # --- paste a command --------------------------------------------------------------------
    def find(self, path: str) -> ModelEntry | None:
        """The library's model at `path` (its file, folder or any shard)."""
        want = os.path.normcase(os.path.realpath(os.path.expanduser(path)))
        for e in self.w.table.model.entries:
            for p in (e.path, e.id, *e.shards):
                if os.path.normcase(os.path.realpath(p)) == want:
                    return e
        return None

    def open_paste(self, text: str = "") -> PasteCommandDialog:
        dialog = PasteCommandDialog(self.w, find=self.find, current=self.w.plan_panel.entry)
        if text:
            dialog.set_text(text)
        dialog.accepted.connect(lambda: self.apply_command(dialog))
        dialog.open()
        return dialog

    def apply_command(self, dialog: PasteCommandDialog) -> None:
        parsed, path = dialog.parsed, dialog.model_path
        if parsed is None or path is None:
            return
        entry = self.find(path)
        if entry is None:
            entry = entry_for_path(os.path.expanduser(path))
            if entry.meta is None or entry.error:
                notify.error(
                    f"{path}: {entry.error or 'not a model'}; nothing saved", source=SOURCE
                )
                return
        stored = self._store(entry, absolute_paths(parsed.profile()), COMMAND_FIELDS)
        kept = f"; kept {' '.join(parsed.extra_args)}" if parsed.extra_args else ""
        words = ", ".join(describe(parsed.values)) or "no settings"
        notify.info(f"{entry.name}: saved {words}{kept}", source=SOURCE)
        if not stored:
            return
        if self.w.table.select_id(entry.id):
            self.reapply(entry)
        else:
            notify.info(
                f"{entry.name} is not in the library: add its folder to see it", source=SOURCE
            )
