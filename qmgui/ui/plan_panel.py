"""The launch settings of the selected model: context, slots, KV cache types, flash attention,
GPU layers, and "Fit context". It only edits values; the window re-plans on `changed`."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSlider,
    QSpinBox,
    QWidget,
)

from qmgui.core.discovery import ModelEntry
from qmgui.core.launch import CACHE_TYPES, CTX_PAD, LaunchSettings

ALL_LAYERS = -1  # the GPU-layers spin box's special value: every layer (the engine default)
AUTO_SLOTS = 0  # the slots spin box's special value: the engine's auto
DEFAULT_CONTEXT = 8192  # a new selection starts here (or at the trained context when smaller)
MAX_SLOTS = 64
FLASH_CHOICES = ("auto", "on", "off")


def snap(n: int, top: int) -> int:
    """The multiple of 256 nearest to `n`, within [256, top]."""
    return max(CTX_PAD, min(top, round(n / CTX_PAD) * CTX_PAD))


class PlanPanel(QWidget):
    """Settings editor. `changed` after every user edit; `fitRequested` for "Fit context"."""

    changed = Signal()
    fitRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._entry: ModelEntry | None = None
        self._trained = 4096
        self._n_layers = 0
        self._extra = LaunchSettings()  # settings this panel does not edit (--n-cpu-moe…)

        self.title = QLabel("No model selected", self)
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
        self.ctx_max = QLabel("", self)
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

        self._lay_out()
        self._wire()
        self.set_entry(None)

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
        other_row = QHBoxLayout()
        other_row.addWidget(self.slots)
        other_row.addSpacing(16)
        other_row.addWidget(QLabel("Flash attention", self))
        other_row.addWidget(self.flash)
        other_row.addSpacing(16)
        other_row.addWidget(QLabel("GPU layers", self))
        other_row.addWidget(self.ngl)
        other_row.addStretch(1)

        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.addRow(self.title)
        form.addRow(self.subtitle)
        form.addRow("Context", ctx_row)
        form.addRow("", self.ctx_max)
        form.addRow("KV cache", kv_row)
        form.addRow("Slots", other_row)

    def _wire(self) -> None:

        self.ctx_slider.valueChanged.connect(self._slider_moved)
        self.ctx_spin.valueChanged.connect(self._spin_changed)
        for spin in (self.slots, self.ngl):
            spin.valueChanged.connect(self.changed)
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

    # --- the model --------------------------------------------------------------------------
    @property
    def entry(self) -> ModelEntry | None:
        return self._entry

    def set_entry(self, entry: ModelEntry | None, settings: LaunchSettings | None = None) -> None:
        """Show `entry` with `settings` (default: 8192 tokens or the trained context)."""
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
        top = max(self._trained // CTX_PAD, 1)
        with QSignalBlocker(self.ctx_slider), QSignalBlocker(self.ctx_spin):
            self.ctx_slider.setMaximum(top)
            self.ctx_spin.setMaximum(top * CTX_PAD)
        with QSignalBlocker(self.ngl):
            self.ngl.setMaximum(self._n_layers)
        self.ctx_max.setText(f"trained context {self._trained:,} tokens" if meta else "")
        enabled = bool(meta) and not (entry and entry.error)
        for w in (self.ctx_slider, self.ctx_spin, self.fit_button, self.slots, self.ctk,
                  self.ctv, self.flash, self.ngl):  # fmt: skip
            w.setEnabled(enabled)
        self.apply(settings or LaunchSettings(ctx_size=min(DEFAULT_CONTEXT, self._trained)))

    @staticmethod
    def _describe(e: ModelEntry) -> str:
        m = e.meta
        if e.error:
            return f"Cannot be planned: {e.error}"
        if m is None:
            return ""
        bits = [m.architecture, m.model_class.value]
        if m.quant:
            bits.append(m.quant)
        if m.param_count:
            bits.append(f"{m.param_count / 1e9:.1f} B params")
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
        )

    def apply(self, s: LaunchSettings, *, notify: bool = False) -> None:
        """Show `s` (the parts this panel edits); `notify` emits `changed` once."""
        widgets = (self.ctx_slider, self.ctx_spin, self.slots, self.ctk, self.ctv, self.flash,
                   self.ngl)  # fmt: skip
        blockers = [QSignalBlocker(w) for w in widgets]
        ctx = snap(s.ctx_size or self._trained, self._trained // CTX_PAD * CTX_PAD or CTX_PAD)
        self.ctx_slider.setValue(ctx // CTX_PAD)
        self.ctx_spin.setValue(ctx)
        self.slots.setValue(s.parallel or AUTO_SLOTS)
        self.ctk.setCurrentText(s.cache_type_k)
        self.ctv.setCurrentText(s.cache_type_v)
        self.flash.setCurrentText(s.flash_attn)
        ngl = s.n_gpu_layers
        self.ngl.setValue(ALL_LAYERS if ngl is None or ngl >= self._n_layers else ngl)
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
        )

    def _slider_moved(self, k: int) -> None:
        with QSignalBlocker(self.ctx_spin):
            self.ctx_spin.setValue(k * CTX_PAD)
        self.changed.emit()

    def _spin_changed(self, value: int) -> None:
        snapped = snap(value, self.ctx_spin.maximum())
        with QSignalBlocker(self.ctx_spin), QSignalBlocker(self.ctx_slider):
            if snapped != value:
                self.ctx_spin.setValue(snapped)
            self.ctx_slider.setValue(snapped // CTX_PAD)
        self.changed.emit()
