"""The launch settings of the selected model: context, slots, KV cache types, flash attention,
GPU layers, "Fit context", CPU experts (MoE models), the GPU split (2+ GPUs, `set_gpus`) and
extra llama-server arguments. It only edits values; the window re-plans on `changed`."""

from __future__ import annotations

import math
from dataclasses import replace

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QResizeEvent, QValidator
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QWidget,
)

from qmgui.core.arch_names import architecture_tooltip, display_architecture
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import EmitError, split_args
from qmgui.core.launch import CACHE_TYPES, CTX_PAD, LaunchSettings
from qmgui.core.units import format_count
from qmgui.ui.elided import ElidedLabel

ALL_LAYERS = -1  # the GPU-layers spin box's special value: every layer (the engine default)
AUTO_SLOTS = 0  # the slots spin box's special value: the engine's auto
DEFAULT_CONTEXT = 8192  # a new selection starts here (or at the trained context when smaller)
MAX_CONTEXT = 4 * 1024 * 1024  # what the context box takes when typed (the slider: trained)
MAX_SLOTS = 64
FLASH_CHOICES = ("auto", "on", "off")
ALL_EXPERTS = -1  # the CPU-experts spin box's special value: every layer's experts (--cpu-moe)
INVALID_STYLE = "color: #c62828;"  # red text for a field whose input is not applied


def parse_split(text: str, n_gpus: int) -> tuple[float, ...]:
    """`3,1` as (3.0, 1.0): one non-negative number per GPU, not all zero; empty is () (split
    by free memory). ValueError with a sentence for anything else."""
    if not text.strip():
        return ()
    parts = [p.strip() for p in text.replace(";", ",").split(",")]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        raise ValueError("write numbers separated by commas, e.g. 3,1") from None
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError("proportions must be zero or more")
    if len(values) != n_gpus:
        raise ValueError(f"give one proportion per GPU: {n_gpus}, not {len(values)}")
    if not any(values):
        raise ValueError("at least one proportion must be above zero")
    return values


def format_split(values: tuple[float, ...]) -> str:
    return ",".join(format(v, "g") for v in values)


def snap(n: int, top: int) -> int:
    """The multiple of 256 nearest to `n`, within [256, top]."""
    return max(CTX_PAD, min(top, round(n / CTX_PAD) * CTX_PAD))


def context_note(ctx: int, trained: int) -> str:
    """What the line under the context box says: the trained context, and beyond it what
    llama-server does (it allocates the whole cache but caps each slot at the trained
    context, logging "the slot context … exceeds the training context … capping")."""
    if ctx <= trained:
        return f"trained context {trained:,} tokens"
    return (
        f"⚠ {ctx:,} is beyond the trained {trained:,} tokens: llama-server allocates the "
        f"cache for all {ctx:,}, but caps each slot at {trained:,} (it logs “capping”)"
    )


class _ExpertsSpin(QSpinBox):
    """ "all" (every layer's experts on the CPU), "none", or "first N layers"."""

    def textFromValue(self, value: int) -> str:
        if value == ALL_EXPERTS:
            return "all"
        return "none" if value == 0 else f"first {value}"

    def valueFromText(self, text: str) -> int:
        t = text.strip().lower()
        if t == "all":
            return ALL_EXPERTS
        digits = "".join(ch for ch in t if ch.isdigit())
        return int(digits) if digits else 0

    def validate(self, text: str, pos: int) -> tuple[QValidator.State, str, int]:
        return QValidator.State.Acceptable, text, pos


class PlanPanel(QWidget):
    """Settings editor. `changed` after every user edit; `fitRequested` for "Fit context"."""

    changed = Signal()
    fitRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entry: ModelEntry | None = None
        self._trained = 4096
        self._n_layers = 0
        self._extra = LaunchSettings()  # settings this panel does not edit (-nkvo, -b…)
        self._is_moe = False
        self._gpus: list[str] = []
        self._gpu_boxes: list[QCheckBox] = []  # one per GPU when there are 2 or more
        self._split: tuple[float, ...] = ()  # the last valid split
        self._extra_args = ""  # the last extra arguments that split

        self.title = ElidedLabel("No model selected", self)
        font = self.title.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        font.setBold(True)
        self.title.setFont(font)
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.subtitle = QLabel("", self)
        self.subtitle.setWordWrap(True)
        self.subtitle.setForegroundRole(self.subtitle.foregroundRole())

        self.ctx_slider = QSlider(Qt.Orientation.Horizontal, self)
        self.ctx_slider.setMinimum(1)
        self.ctx_slider.setPageStep(4)
        self.ctx_slider.setToolTip("Context in tokens, across all slots (multiples of 256)")
        self.ctx_spin = QSpinBox(self)
        self.ctx_spin.setSingleStep(CTX_PAD)
        self.ctx_spin.setMinimum(CTX_PAD)
        self.ctx_spin.setGroupSeparatorShown(True)
        self.ctx_spin.setSuffix(" tokens")
        self.ctx_spin.setKeyboardTracking(False)
        self.ctx_max = QLabel("", self)  # the trained context, or what happens beyond it
        self.fit_button = QPushButton("Fit context", self)
        self.fit_button.setToolTip("The longest context that fits this hardware")

        self.slots = QSpinBox(self)
        self.slots.setRange(AUTO_SLOTS, MAX_SLOTS)
        self.slots.setSpecialValueText("auto")
        self.slots.setToolTip("Parallel slots (-np); auto is 4 with a unified KV cache")
        self.ctk = QComboBox(self)
        self.ctv = QComboBox(self)
        for box in (self.ctk, self.ctv):
            box.addItems(CACHE_TYPES)
            box.setCurrentText("f16")
        self.flash = QComboBox(self)
        self.flash.addItems(FLASH_CHOICES)
        self.ngl = QSpinBox(self)
        self.ngl.setRange(ALL_LAYERS, 0)
        self.ngl.setSpecialValueText("all")
        self.ngl.setToolTip("Layers on the GPU, the output layer counted (-ngl)")
        self._build_offload_widgets()

        self._lay_out()
        self._wire()
        self.set_entry(None)

    def _build_offload_widgets(self) -> None:
        """CPU experts (MoE models), the GPU split (2+ GPUs) and the extra arguments."""
        self.moe_label = QLabel("CPU experts", self)
        self.cpu_moe = _ExpertsSpin(self)
        self.cpu_moe.setRange(ALL_EXPERTS, 0)
        self.cpu_moe.setAccessibleName("CPU experts (first N layers)")
        self.cpu_moe.setToolTip(
            "Keep the expert weights of the first N layers in host memory (--n-cpu-moe); "
            '"all" keeps every layer\'s experts there (--cpu-moe). 0: experts on the GPU'
        )
        self.moe_label.setBuddy(self.cpu_moe)
        self.gpu_row = QWidget(self)  # "run on": a check box per GPU (2 or more GPUs)
        self._gpu_layout = QHBoxLayout(self.gpu_row)
        self._gpu_layout.setContentsMargins(0, 0, 0, 0)
        self.split_label = QLabel("Split", self)
        self.split = QLineEdit(self)
        self.split.setPlaceholderText("by free memory")
        self.split.setClearButtonEnabled(True)
        self.split.setAccessibleName("GPU split")
        self.split_label.setBuddy(self.split)
        self.extra_args_edit = QLineEdit(self)
        self.extra_args_edit.setPlaceholderText("e.g. --jinja --temp 0.7")
        self.extra_args_edit.setClearButtonEnabled(True)
        self.extra_args_edit.setAccessibleName("Extra arguments")
        self._split_tip = ""
        self._has_meta = False
        self._extra_tip = (
            "More llama-server arguments, appended last; one that repeats a flag set above "
            "replaces it. Quote with '…' or \"…\" to keep spaces"
        )
        self.extra_args_edit.setToolTip(self._extra_tip)

    def _lay_out(self) -> None:
        ctx_row = QHBoxLayout()
        ctx_row.addWidget(self.ctx_slider, 1)
        ctx_row.addWidget(self.ctx_spin)
        ctx_row.addWidget(self.fit_button)
        kv_row = QHBoxLayout()
        kv_row.addWidget(QLabel("K", self))
        kv_row.addWidget(self.ctk)
        kv_row.addSpacing(8)
        kv_row.addWidget(QLabel("V", self))
        kv_row.addWidget(self.ctv)
        kv_row.addStretch(1)
        other_row, flash_row = self._slots_rows()
        self.offload_row = QWidget(self)  # hidden when it holds nothing (dense model, 1 GPU)
        offload = QHBoxLayout(self.offload_row)
        offload.setContentsMargins(0, 0, 0, 0)
        offload.addWidget(self.moe_label)
        offload.addWidget(self.cpu_moe)
        offload.addSpacing(16)
        offload.addWidget(self.split_label)
        offload.addWidget(self.split, 1)
        offload.addStretch(1)

        self.ctx_max.setWordWrap(True)
        self.ctx_max.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow(self.title)
        form.addRow(self.subtitle)
        form.addRow("Context", ctx_row)
        form.addRow("", self.ctx_max)
        form.addRow("KV cache", kv_row)
        form.addRow("Slots", other_row)
        form.addRow("Flash attention", flash_row)
        self._form = form
        form.addRow(self.offload_row)
        self.gpu_label = QLabel("Run on", self)
        form.addRow(self.gpu_label, self.gpu_row)
        form.addRow("Extra args", self.extra_args_edit)

    def _slots_rows(self) -> tuple[QHBoxLayout, QHBoxLayout]:
        """Slots, flash attention and GPU layers: one row where the panel is wide enough, else
        flash attention on a row of its own (`_place_flash`)."""
        self._other_row = other_row = QHBoxLayout()
        other_row.addWidget(self.slots)
        other_row.addSpacing(16)
        self._flash_inline = QLabel("Flash attention", self)
        other_row.addWidget(self._flash_inline)
        other_row.addSpacing(16)
        self._ngl_label = QLabel("GPU layers", self)
        other_row.addWidget(self._ngl_label)
        other_row.addWidget(self.ngl)
        other_row.addStretch(1)
        self._flash_row = flash_row = QHBoxLayout()
        flash_row.addWidget(self.flash)
        flash_row.addStretch(1)
        self._flash_wide: bool | None = None
        return other_row, flash_row

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_flash()

    def _place_flash(self) -> None:
        """Flash attention beside slots and GPU layers when they fit on one line, else on its
        own row (a narrow window: nothing clipped, nothing scrolled sideways)."""
        fm = self.fontMetrics()
        labels = ("Context", "KV cache", "Slots", "Extra args")
        label_w = max(fm.horizontalAdvance(t) for t in labels) + 16
        row_w = sum(
            w.sizeHint().width()
            for w in (self.slots, self._flash_inline, self.flash, self._ngl_label, self.ngl)
        )
        wide = self.width() >= label_w + row_w + 2 * 16 + 6 * self._other_row.spacing() + 8
        if wide == self._flash_wide:
            return
        self._flash_wide = wide
        if wide:
            self._flash_row.removeWidget(self.flash)
            self._other_row.insertWidget(3, self.flash)
        else:
            self._other_row.removeWidget(self.flash)
            self._flash_row.insertWidget(0, self.flash)
        self._flash_inline.setVisible(wide)
        self._form.setRowVisible(self._flash_row, not wide)

    def _wire(self) -> None:

        self.ctx_slider.valueChanged.connect(self._slider_moved)
        self.ctx_spin.valueChanged.connect(self._spin_changed)
        for spin in (self.slots, self.ngl, self.cpu_moe):
            spin.valueChanged.connect(self.changed)
        self.split.textChanged.connect(self._split_edited)
        self.extra_args_edit.textChanged.connect(self._extra_args_edited)
        for box in (self.ctk, self.ctv, self.flash):
            box.currentIndexChanged.connect(self.changed)
        self.fit_button.clicked.connect(self.fitRequested)
        self.setTabOrder(self.ctx_slider, self.ctx_spin)
        self.setTabOrder(self.ctx_spin, self.fit_button)
        self.setTabOrder(self.fit_button, self.ctk)
        self.setTabOrder(self.ctk, self.ctv)
        self.setTabOrder(self.ctv, self.slots)
        self.setTabOrder(self.slots, self.flash)
        self.setTabOrder(self.flash, self.ngl)
        self.setTabOrder(self.ngl, self.cpu_moe)
        self.setTabOrder(self.cpu_moe, self.split)
        self.setTabOrder(self.split, self.extra_args_edit)

    # --- the model --------------------------------------------------------------------------
    @property
    def entry(self) -> ModelEntry | None:
        return self._entry

    def set_entry(self, entry: ModelEntry | None, settings: LaunchSettings | None = None) -> None:
        """Show `entry` with `settings` (default: 8192 tokens or the trained context). The
        extra arguments are kept for the same model and cleared for another."""
        if entry is None or self._entry is None or entry.id != self._entry.id:
            with QSignalBlocker(self.extra_args_edit):
                self.extra_args_edit.clear()
            self._extra_args_edited("", notify=False)
        self._entry = entry
        meta = entry.meta if entry else None
        self._trained = (meta.context_length if meta else None) or 4096
        self._n_layers = (meta.n_layer + 1) if meta else 0
        if entry is None:
            self.title.setText("No model selected")
            self.subtitle.setText("Select a model to plan its launch.")
        else:
            self.title.setText(entry.name)
            self.subtitle.setText(self._describe(entry))
            tip = architecture_tooltip(entry.meta) if entry.meta is not None else None
            self.subtitle.setToolTip(tip or "")
        top = max(self._trained // CTX_PAD, 1)
        with QSignalBlocker(self.ctx_slider), QSignalBlocker(self.ctx_spin):
            self.ctx_slider.setMaximum(top)
            # typed, any context is taken (beyond the trained one: `ctx_max` says what happens)
            self.ctx_spin.setMaximum(max(MAX_CONTEXT, top * CTX_PAD))
        self._is_moe = bool(meta and meta.is_moe)
        with QSignalBlocker(self.ngl), QSignalBlocker(self.cpu_moe):
            self.ngl.setMaximum(self._n_layers)
            self.cpu_moe.setMaximum(meta.n_layer if meta and self._is_moe else 0)
        self._has_meta = meta is not None
        enabled = bool(meta) and not (entry and entry.error)
        for w in (self.ctx_slider, self.ctx_spin, self.fit_button, self.slots, self.ctk,
                  self.ctv, self.flash, self.ngl, self.cpu_moe, self.split,
                  self.extra_args_edit):  # fmt: skip
            w.setEnabled(enabled)
        self._show_offload_row()
        self.apply(settings or LaunchSettings(ctx_size=min(DEFAULT_CONTEXT, self._trained)))

    @staticmethod
    def _describe(e: ModelEntry) -> str:
        m = e.meta
        if e.error:
            return f"Cannot be planned: {e.error}"
        if m is None:
            return ""
        bits = [display_architecture(m), m.model_class.value]
        if m.quant:
            bits.append(m.quant)
        if m.param_count:
            bits.append(f"{format_count(m.param_count)} params")
        bits.append(f"{m.n_layer} layers")
        if m.is_moe:
            bits.append(f"{m.n_expert} experts ({m.n_expert_used} active)")
        if e.mmproj:
            bits.append("vision projector")
        if len(e.shards) > 1:
            bits.append(f"{len(e.shards)} shards")
        return " · ".join(bits)

    # --- settings in and out ----------------------------------------------------------------
    def settings(self) -> LaunchSettings:
        ngl = self.ngl.value()
        return LaunchSettings(
            ctx_size=self.ctx_spin.value(),
            parallel=self.slots.value() or None,
            cache_type_k=self.ctk.currentText(),
            cache_type_v=self.ctv.currentText(),
            flash_attn=self.flash.currentText(),
            n_gpu_layers=None if ngl == ALL_LAYERS else ngl,
            n_cpu_moe=max(self.cpu_moe.value(), 0) if self._is_moe else 0,
            cpu_moe=self._is_moe and self.cpu_moe.value() == ALL_EXPERTS,
            tensor_split=self._split if len(self._chosen_names()) >= 2 else (),
        )

    def apply(self, s: LaunchSettings, *, notify: bool = False) -> None:
        """Show `s` (the parts this panel edits); `notify` emits `changed` once."""
        widgets = (self.ctx_slider, self.ctx_spin, self.slots, self.ctk, self.ctv, self.flash,
                   self.ngl, self.cpu_moe, self.split)  # fmt: skip
        blockers = [QSignalBlocker(w) for w in widgets]
        ctx = snap(s.ctx_size or self._trained, self.ctx_spin.maximum())
        self.ctx_slider.setValue(ctx // CTX_PAD)
        self.ctx_spin.setValue(ctx)
        self._show_ctx_note(ctx)
        self.slots.setValue(s.parallel or AUTO_SLOTS)
        self.ctk.setCurrentText(s.cache_type_k)
        self.ctv.setCurrentText(s.cache_type_v)
        self.flash.setCurrentText(s.flash_attn)
        ngl = s.n_gpu_layers
        self.ngl.setValue(ALL_LAYERS if ngl is None or ngl >= self._n_layers else ngl)
        self.cpu_moe.setValue(
            ALL_EXPERTS if s.cpu_moe else min(s.n_cpu_moe, self.cpu_moe.maximum())
        )
        if len(self._chosen_names()) < 2 or s.tensor_split:
            # a split this panel cannot show (1 GPU) is dropped; an empty one keeps the field
            self.split.setText(format_split(s.tensor_split))
            self._split = s.tensor_split
            self._mark(self.split, "")
        for b in blockers:
            b.unblock()
        self._extra = replace(s, ctx_size=None)  # n_cpu_moe and friends survive a round trip
        if notify:
            self.changed.emit()

    def full_settings(self) -> LaunchSettings:
        """The edited settings with those this panel does not show kept from the last apply."""
        mine = self.settings()
        return replace(
            self._extra,
            ctx_size=mine.ctx_size,
            parallel=mine.parallel,
            cache_type_k=mine.cache_type_k,
            cache_type_v=mine.cache_type_v,
            flash_attn=mine.flash_attn,
            n_gpu_layers=mine.n_gpu_layers,
            n_cpu_moe=mine.n_cpu_moe,
            cpu_moe=mine.cpu_moe,
            tensor_split=mine.tensor_split,
        )

    def extra_args(self) -> str:
        """The extra llama-server arguments as typed (the last text that splits); the command
        builder splits them (`plan_model(..., extra_args=...)`)."""
        return self._extra_args

    # --- GPUs, split, extra arguments -------------------------------------------------------
    def set_gpus(self, names: list[str]) -> None:
        """The GPUs of the current hardware choice: with 2 or more, a check box each (which
        GPUs the engine may use: `--device`) and the split field. Emits nothing (the window
        re-plans after a hardware change)."""
        self._gpus = list(names)
        for box in self._gpu_boxes:
            self._gpu_layout.removeWidget(box)
            box.deleteLater()
        self._gpu_boxes = []
        if len(self._gpus) >= 2:
            for name in self._gpus:
                box = QCheckBox(name, self.gpu_row)
                box.setChecked(True)
                box.setToolTip(f"Let the engine use {name} (unchecked: --device leaves it out)")
                box.toggled.connect(self._gpu_toggled)
                self._gpu_layout.addWidget(box)
                self._gpu_boxes.append(box)
            self._gpu_layout.addStretch(1)
        self._update_split_tip()
        self._split_edited(self.split.text(), notify=False)
        self._show_offload_row()

    def select_gpus(self, subset: tuple[int, ...]) -> None:
        """Check the GPUs at positions `subset` (a model's saved devices); () or a position
        this hardware lacks: all of them. Emits nothing."""
        valid = bool(subset) and all(0 <= i < len(self._gpu_boxes) for i in subset)
        for i, box in enumerate(self._gpu_boxes):
            with QSignalBlocker(box):
                box.setChecked(not valid or i in subset)
        self._update_split_tip()
        self._split_edited(self.split.text(), notify=False)
        self._show_offload_row()

    def set_extra_args(self, text: str) -> None:
        """Show `text` as the extra arguments (a model's saved ones). Emits nothing."""
        with QSignalBlocker(self.extra_args_edit):
            self.extra_args_edit.setText(text)
        self._extra_args_edited(text, notify=False)

    def selected_gpus(self) -> tuple[int, ...]:
        """Positions of the GPUs the engine may use; () = all of them."""
        chosen = tuple(i for i, b in enumerate(self._gpu_boxes) if b.isChecked())
        return () if len(chosen) == len(self._gpus) else chosen

    def _chosen_names(self) -> list[str]:
        picked = self.selected_gpus()
        return [self._gpus[i] for i in picked] if picked else list(self._gpus)

    def _update_split_tip(self) -> None:
        self._split_tip = (
            "How to share the model between "
            + ", ".join(self._chosen_names())
            + ": one proportion per GPU, in this order (-ts, e.g. 3,1). Empty: by free memory"
        )

    def _gpu_toggled(self, checked: bool) -> None:
        if not checked and not any(b.isChecked() for b in self._gpu_boxes):
            box = self.sender()
            if isinstance(box, QCheckBox):  # one GPU at least: keep the last one checked
                with QSignalBlocker(box):
                    box.setChecked(True)
            return
        self._update_split_tip()
        self._split_edited(self.split.text(), notify=False)
        self._show_offload_row()
        self.changed.emit()

    @property
    def gpus(self) -> list[str]:
        return list(self._gpus)

    def _show_offload_row(self) -> None:
        many = len(self._chosen_names()) >= 2
        self.moe_label.setVisible(self._is_moe)
        self.cpu_moe.setVisible(self._is_moe)
        self.split_label.setVisible(many)
        self.split.setVisible(many)
        self.offload_row.setVisible(self._is_moe or many)
        self.gpu_label.setVisible(bool(self._gpu_boxes))
        self.gpu_row.setVisible(bool(self._gpu_boxes))

    @staticmethod
    def _mark(edit: QLineEdit, error: str) -> None:
        edit.setStyleSheet(INVALID_STYLE if error else "")
        edit.setProperty("invalid", bool(error))

    def _split_edited(self, text: str, *, notify: bool = True) -> None:
        try:
            values = parse_split(text, len(self._chosen_names()))
        except ValueError as e:
            self._mark(self.split, str(e))
            self.split.setToolTip(f"Not applied: {e}\n\n{self._split_tip}")
            return
        self._mark(self.split, "")
        self.split.setToolTip(self._split_tip)
        if values != self._split:
            self._split = values
            if notify:
                self.changed.emit()

    def _extra_args_edited(self, text: str, *, notify: bool = True) -> None:
        try:
            split_args(text)
        except EmitError as e:
            self._mark(self.extra_args_edit, str(e))
            self.extra_args_edit.setToolTip(f"Not applied: {e}\n\n{self._extra_tip}")
            return
        self._mark(self.extra_args_edit, "")
        self.extra_args_edit.setToolTip(self._extra_tip)
        if text != self._extra_args:
            self._extra_args = text
            if notify:
                self.changed.emit()

    def _slider_moved(self, k: int) -> None:
        with QSignalBlocker(self.ctx_spin):
            self.ctx_spin.setValue(k * CTX_PAD)
        self._show_ctx_note(k * CTX_PAD)
        self.changed.emit()

    def _spin_changed(self, value: int) -> None:
        snapped = snap(value, self.ctx_spin.maximum())
        with QSignalBlocker(self.ctx_spin), QSignalBlocker(self.ctx_slider):
            if snapped != value:
                self.ctx_spin.setValue(snapped)
            self.ctx_slider.setValue(snapped // CTX_PAD)  # beyond trained: the slider's end
        self._show_ctx_note(snapped)
        self.changed.emit()

    def _show_ctx_note(self, ctx: int) -> None:
        self.ctx_max.setWordWrap(ctx > self._trained)  # one short line needs no wrapping room
        self.ctx_max.setText(context_note(ctx, self._trained) if self._has_meta else "")
