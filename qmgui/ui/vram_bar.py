"""Memory bars: one per GPU and one for system RAM, stacked segments of what a plan uses.

`VramBar` only paints the `BarSpec` it is given; `bars_for` turns a plan into specs and
`MemoryPanel` lays the bars out with a legend, the verdict and the "Nearest fit" button.
A buffer the plan charges as an upper bound (`Footprint.bounds`: no exact model) is hatched
in its segment, its bar's total reads "≤ …", the tooltip says why, and a verdict of "Fits"
resting on one reads "Fits (bound)".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
    QPaintEvent,
    QPalette,
    QPen,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from qmgui.core.bounds import Bound
from qmgui.core.footprint import CPU, DeviceFootprint
from qmgui.core.units import GIB, format_bytes
from qmgui.core.vllm import VllmPlan
from qmgui.ui.occupancy import EngineLoad, EngineShare, LiveReading, others_on, shares_on
from qmgui.ui.planning import PlanOutcome

# segment key -> (legend label, colour); colours chosen to stay apart for the colour-blind
# (blue / orange / purple / grey) and readable on light and dark palettes
SEGMENTS: dict[str, tuple[str, QColor]] = {
    "engines": ("Running engines", QColor(38, 166, 154)),
    "others": ("Other processes", QColor(96, 96, 110)),
    "weights": ("Weights", QColor(66, 133, 244)),
    # the CPU backend's repacked copies of weights (CPU_REPACK, AMX): resident, beside the
    # mapped file (qmgui.core.repack)
    "repack": ("Repacked weights", QColor(129, 212, 250)),
    "kv": ("KV cache", QColor(245, 150, 40)),
    "compute": ("Compute", QColor(156, 95, 200)),
    "other": ("Output, state", QColor(120, 144, 156)),
    "context": ("Engine context", QColor(141, 110, 99)),
    "reserve": ("Reserve", QColor(190, 190, 190)),
    # not a segment of its own: the hatched part of a segment that is an upper bound
    "bound": ("Upper bound (not modelled)", QColor(255, 255, 255, 170)),
}
BOUND_PATTERN = Qt.BrushStyle.BDiagPattern
# which segment a bound's part is drawn in (Bound.part)
BOUND_SEGMENT = {"compute": "compute", "projector compute": "compute"}
# a second shade so that neighbouring engines stay apart
ENGINE_ALT_COLOUR = QColor(0, 121, 107)
OVER_COLOUR = QColor(215, 58, 73)
BAR_HEIGHT = 26


@dataclass(frozen=True)
class BarSpec:
    """What one bar shows: used bytes per segment out of `capacity` (None: unknown size)."""

    title: str
    capacity: int | None
    segments: tuple[tuple[str, int], ...]  # (segment key, bytes), in drawing order
    reserve: int = 0
    over: bool = False
    engines: tuple[EngineShare, ...] = ()  # running engines, drawn first
    others: int | None = None  # other processes (None: not known, e.g. what-if hardware)
    bounds: tuple[Bound, ...] = ()  # parts of the segments charged as upper bounds

    @property
    def bounded(self) -> int:
        """Bytes of the planned segments that are upper bounds, not estimates."""
        return sum(b.bytes for b in self.bounds)

    def bounded_in(self, key: str) -> int:
        return sum(b.bytes for b in self.bounds if BOUND_SEGMENT.get(b.part, "compute") == key)

    @property
    def planned(self) -> int:
        return sum(n for _, n in self.segments)

    @property
    def held(self) -> int:
        """What the running engines and other processes hold now."""
        return sum(e.bytes for e in self.engines) + (self.others or 0)

    @property
    def used(self) -> int:
        return self.planned + self.held


def gib(n: int) -> str:
    """GiB for the bars' totals; smaller amounts in the unit that reads (10.7 MiB, not 0.0 GiB)."""
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB // 10 else format_bytes(n)


def _segments(d: DeviceFootprint) -> tuple[tuple[str, int], ...]:
    return (
        ("weights", d.weights),
        ("repack", d.repack),
        ("kv", d.kv),
        ("compute", d.compute),
        ("other", d.output + d.recurrent),
        ("context", d.other),  # the backend's own context on a GPU (docs/sizing.md)
    )


def bars_for(
    outcome: PlanOutcome,
    reserve: int,
    loads: Sequence[EngineLoad] = (),
    live: LiveReading | None = None,
) -> list[BarSpec]:
    """One bar per GPU of the hardware, then system RAM. On this machine each bar also shows
    the running engines' shares and what other processes hold (`live`); a what-if card has
    neither. A GPU is over when the plan does not fit in what is free there less the reserve
    (the same test the fitter makes)."""
    hw = outcome.hardware
    fit = outcome.fit
    devices = {d.name: d for d in fit.footprint.devices} if fit else {}
    bounds = fit.footprint.bounds if fit else ()
    if fit is None and outcome.vllm is not None:
        devices = _vllm_devices(outcome.vllm, outcome.vllm_gpus)
    here = not hw.what_if
    bars: list[BarSpec] = []
    for g in hw.gpus:
        d = devices.get(g.name, DeviceFootprint(g.name))
        limit = max(g.available - reserve, 0)
        engines = shares_on(g.name, loads) if here else ()
        others = others_on(g.name, live, loads) if here else None
        on = tuple(b for b in bounds if b.device == g.name)
        bars.append(
            BarSpec(
                g.name, g.total_bytes, _segments(d), reserve, d.total > limit, engines, others, on
            )
        )
    host = devices.get(CPU, DeviceFootprint(CPU))
    over = hw.host_bytes is not None and host.total > hw.host_bytes
    title = "System RAM" + (" (this machine)" if hw.what_if else "")
    engines = shares_on(CPU, loads)
    others = others_on(CPU, live, loads)
    on = tuple(b for b in bounds if b.device == CPU)
    bars.append(BarSpec(title, hw.host_bytes, _segments(host), 0, over, engines, others, on))
    return bars


def _vllm_devices(plan: VllmPlan, gpus: Sequence[str]) -> dict[str, DeviceFootprint]:
    """What a vLLM launch holds on each GPU it uses (every tensor-parallel rank the same): its
    weights, its KV pool, its overhead (activations, CUDA graphs, the runtime) as compute, and
    whatever else its footprint counts."""
    b = plan.breakdown
    if b is None or plan.skipped:
        return {}
    w, kv, oh = b.weights.nbytes, b.kv_pool.nbytes, b.overhead.nbytes
    rest = max(b.footprint.nbytes - w - kv - oh, 0)
    return {g: DeviceFootprint(g, weights=w, kv=kv, compute=oh, other=rest) for g in gpus}


class VramBar(QWidget):
    """Paints one `BarSpec`: title and totals above, the stacked bar below."""

    def __init__(self, spec: BarSpec | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._spec = spec
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumWidth(160)

    @property
    def spec(self) -> BarSpec | None:
        return self._spec

    def set_spec(self, spec: BarSpec | None) -> None:
        self._spec = spec
        self.setToolTip(self._tooltip())
        self.update()

    def sizeHint(self) -> QSize:
        return QSize(320, self.fontMetrics().height() + 6 + BAR_HEIGHT + 2)

    def minimumSizeHint(self) -> QSize:
        return QSize(160, self.sizeHint().height())

    def _tooltip(self) -> str:
        s = self._spec
        if s is None:
            return ""
        at_most = "≤ " if s.bounded else ""
        lines = [f"{s.title}: {at_most}{format_bytes(s.planned)} planned for the selected model"]
        for k, n in s.segments:
            if not n:
                continue
            bound = s.bounded_in(k)
            upper = f" (≤; {format_bytes(bound)} of it an upper bound)" if bound else ""
            lines.append(f"  {SEGMENTS[k][0]}: {format_bytes(n)}{upper}")
        lines += [f"Upper bound, {b.part}: ≤ {format_bytes(b.bytes)}: {b.why}" for b in s.bounds]
        for e in s.engines:
            measured = f", measured {format_bytes(e.measured)}" if e.measured is not None else ""
            lines.append(f"Running {e.name}: planned {format_bytes(e.planned)}{measured}")
        if s.others is not None:
            lines.append(f"Other processes and the driver: {format_bytes(s.others)}")
        if s.reserve:
            lines.append(f"  reserve kept free: {format_bytes(s.reserve)}")
        if s.capacity:
            lines.append(f"  of {format_bytes(s.capacity)}")
        return "\n".join(lines)

    def paintEvent(self, event: QPaintEvent) -> None:
        s = self._spec
        if s is None:
            return
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        fm = self.fontMetrics()
        w = self.width()
        text_h = fm.height()
        # title left, totals right
        bold = QFont(self.font())
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(pal.color(QPalette.ColorRole.WindowText))
        title_rect = QRectF(0, 0, w, text_h)
        p.drawText(title_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, s.title)
        p.setFont(self.font())
        cap = f" of {gib(s.capacity)}" if s.capacity else ""
        at_most = "≤ " if s.bounded else ""  # part of the plan is an upper bound
        total = (
            f"{at_most}{gib(s.planned)} planned + {gib(s.held)} in use{cap}"
            if s.held
            else f"{at_most}{gib(s.used)}{cap}"
        )
        if s.over:
            p.setPen(OVER_COLOUR)
            total += "  — over"
        # a narrow panel: the totals give way (elided; the tooltip has them all), not the title
        room = w - QFontMetrics(bold).horizontalAdvance(s.title) - 12
        total = fm.elidedText(total, Qt.TextElideMode.ElideRight, max(room, 0))
        p.drawText(title_rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, total)

        self._paint_bar(p, s, QRectF(0.5, text_h + 4.5, w - 1.0, BAR_HEIGHT - 1.0))
        p.end()

    def _paint_bar(self, p: QPainter, s: BarSpec, bar: QRectF) -> None:
        pal = self.palette()
        fm = self.fontMetrics()
        scale_bytes = max(s.capacity or 0, s.used + s.reserve, 1)
        free_colour = pal.color(QPalette.ColorRole.Base)
        p.setPen(Qt.PenStyle.NoPen)
        p.setBrush(free_colour)
        p.drawRoundedRect(bar, 4, 4)
        p.save()
        p.setClipRect(bar)
        x = bar.left()
        held: list[tuple[str, int, str]] = [("engines", e.bytes, e.name) for e in s.engines]
        if s.others:
            held.append(("others", s.others, ""))
        pieces = [*held, *((k, n, "") for k, n in s.segments)]
        if s.capacity:
            pieces.append(("reserve", s.reserve, ""))
        n_engine = 0
        for key, n, name in pieces:
            if n <= 0:
                continue
            seg_w = bar.width() * n / scale_bytes
            colour = QColor(SEGMENTS[key][1])
            if key == "engines":
                colour = colour if n_engine % 2 == 0 else ENGINE_ALT_COLOUR
                n_engine += 1
            if key == "reserve":  # the reserve sits at the far end of the card
                rect = QRectF(bar.right() - seg_w, bar.top(), seg_w, bar.height())
                p.setBrush(colour)
                p.setOpacity(0.55)
                p.drawRect(rect)
                p.setOpacity(1.0)
            else:
                rect = QRectF(x, bar.top(), seg_w, bar.height())
                p.setBrush(colour)
                p.drawRect(rect)
                x += seg_w
                self._hatch(p, rect, min(s.bounded_in(key), n) / n if key != "engines" else 0)
            label = gib(n) if n >= 0.05 * GIB else ""
            if name and fm.horizontalAdvance(f"{name} {label}") + 8 < seg_w:
                label = f"{name} {label}".strip()
            if label and fm.horizontalAdvance(label) + 8 < seg_w:
                p.setPen(QColor(255, 255, 255) if key != "reserve" else QColor(40, 40, 40))
                p.drawText(rect, Qt.AlignmentFlag.AlignCenter, label)
                p.setPen(Qt.PenStyle.NoPen)
        p.restore()
        outline = OVER_COLOUR if s.over else pal.color(QPalette.ColorRole.Mid)
        p.setPen(QPen(outline, 2.0 if s.over else 1.0))
        p.setBrush(Qt.BrushStyle.NoBrush)
        p.drawRoundedRect(bar, 4, 4)

    @staticmethod
    def _hatch(p: QPainter, rect: QRectF, share: float) -> None:
        """Hatch the last `share` of a segment: the part charged as an upper bound."""
        if share <= 0:
            return
        w = rect.width() * share
        p.setBrush(QBrush(SEGMENTS["bound"][1], BOUND_PATTERN))
        p.drawRect(QRectF(rect.right() - w, rect.top(), w, rect.height()))


class Legend(QLabel):
    """Colour swatches with their names, wrapped onto as many lines as the width needs (a
    word-wrapped label: its minimum width is one item, so it never widens the panel). The
    running-engine, other-process and engine-context swatches show only when a bar has them."""

    OPTIONAL = ("engines", "others", "repack", "context", "bound")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("legend")
        self.setWordWrap(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.keys: tuple[str, ...] = ()
        self.show_keys(())

    def show_keys(self, present: Sequence[str]) -> None:
        keys = [k for k in SEGMENTS if k not in self.OPTIONAL or k in present]
        self.keys = (*keys, "free")
        items = []
        for key in self.keys:
            label, colour = SEGMENTS.get(key, ("Free", QColor()))
            swatch = (
                colour.name()
                if key != "free"
                else self.palette().color(QPalette.ColorRole.Base).name()
            )
            mark = "■"
            if key == "bound":  # hatched in the compute colour, as the bars draw it
                mark, swatch = "▨", SEGMENTS["compute"][1].name()
            name = label.replace(" ", "&nbsp;")
            items.append(f'<span style="color:{swatch}; font-size:large">{mark}</span>&nbsp;{name}')
        self.setText(" &nbsp;&nbsp; ".join(items))


class MemoryPanel(QWidget):
    """The bars of one plan, a legend, the verdict, and "Nearest fit" when it does not fit."""

    nearestRequested = Signal()
    checkRequested = Signal()  # "Check with the engine": its own projection of this launch

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._bars_box = QVBoxLayout()
        self._bars_box.setSpacing(10)
        self.bars: list[VramBar] = []
        self._bounds: tuple[Bound, ...] = ()  # the plan's upper bounds (set_bars)
        self._bounded_checked = False
        self.verdict = QLabel(self)
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.nearest = QPushButton("Nearest fit", self)
        self.nearest.setToolTip("Apply the closest settings that fit this hardware")
        self.nearest.clicked.connect(self.nearestRequested)
        self.nearest.hide()
        verdict_row = QHBoxLayout()
        verdict_row.addWidget(self.verdict, 1)
        verdict_row.addWidget(self.nearest, 0, Qt.AlignmentFlag.AlignTop)
        # the latest `qmgui bench` figures of this model here ("last measured: …")
        self.measured = QLabel(self)
        self.measured.setObjectName("measured")
        self.measured.setWordWrap(True)
        self.measured.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.measured.hide()
        # the engine's own projection beside the plan (llama-server -fit on, stopped early)
        self.check = QPushButton("Check with the engine", self)
        self.check.setToolTip(
            "Run llama-server only as far as its own memory projection of this launch "
            "(-fit on; stopped before it loads any weight) and show it beside the plan"
        )
        self.check.clicked.connect(self.checkRequested)
        self.check.hide()
        self.checked = QLabel(self)
        self.checked.setObjectName("checked")
        self.checked.setWordWrap(True)
        self.checked.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.checked.hide()
        verdict_row.addWidget(self.check, 0, Qt.AlignmentFlag.AlignTop)  # no row of its own
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(8)
        layout.addLayout(self._bars_box)
        self.legend = Legend(self)
        layout.addWidget(self.legend)
        layout.addLayout(verdict_row)
        layout.addWidget(self.measured)
        layout.addWidget(self.checked)

    def set_bars(self, specs: list[BarSpec]) -> None:
        while len(self.bars) < len(specs):
            bar = VramBar(parent=self)
            self.bars.append(bar)
            self._bars_box.addWidget(bar)
        while len(self.bars) > len(specs):
            self.bars.pop().deleteLater()
        for bar, spec in zip(self.bars, specs, strict=True):
            bar.set_spec(spec)
        present = []
        if any(spec.engines for spec in specs):
            present.append("engines")
        if any(spec.others for spec in specs):
            present.append("others")
        if any(n for spec in specs for k, n in spec.segments if k == "repack"):
            present.append("repack")
        if any(n for spec in specs for k, n in spec.segments if k == "context"):
            present.append("context")
        self._bounds = tuple(b for spec in specs for b in spec.bounds)
        self._bounded_checked = any(
            spec.bounds and spec.capacity is not None for spec in specs
        )  # a bar whose size is known: its verdict rests on the bound
        if self._bounds:
            present.append("bound")
        if tuple(present) != tuple(k for k in self.legend.keys if k in Legend.OPTIONAL):
            self.legend.show_keys(present)

    def set_checked(self, text: str, *, available: bool) -> None:
        """The engine's projection beside the plan ("" hides it); `available`: the button
        (a llama-server launch on this machine)."""
        self.checked.setText(text)
        self.checked.setVisible(bool(text))
        self.check.setVisible(available)

    def set_measured(self, text: str, tip: str = "") -> None:
        """The measured speed under the verdict ("" hides it)."""
        self.measured.setText(text)
        self.measured.setToolTip(tip)
        self.measured.setVisible(bool(text))

    def set_verdict(self, text: str, *, ok: bool, nearest: bool) -> None:
        """The verdict under the bars (set after `set_bars`): a "Fits" that rests on a buffer
        charged as an upper bound on a bar of known size reads "Fits (bound)", its tooltip
        says which and why."""
        colour = SEGMENTS["weights"][1] if ok else OVER_COLOUR
        if ok and self._bounded_checked and text.startswith("Fits") and "(bound)" not in text:
            text = "Fits (bound)" + text[len("Fits") :]
        self.verdict.setText(text)
        self.verdict.setToolTip(
            "\n".join(
                f"{b.device} {b.part}: ≤ {format_bytes(b.bytes)}, an upper bound: {b.why}"
                for b in self._bounds
            )
        )
        self.verdict.setStyleSheet("" if ok else f"color: {colour.name()};")
        self.nearest.setVisible(nearest)
