"""The engines this window started or adopted: model, state, URL, uptime and planned vs actual
memory, the selected engine's log (followed on a timer from the supervisor's ring buffer, or
the adopted engine's, filled from its log file), and Open chat (the engine's own web UI in the
browser; absent for an engine without one), Copy URL / Stop / Restart and "Keep
running after quit" (per engine: it is left running, detached, when qmgui quits). It shows
what its `EngineRunner` holds and asks it to act; the runner does the blocking work on its own
threads. The Speed column is the tokens per second a llama-server engine generated over the
last two seconds, from its `/metrics` counters (read on a worker thread), or "idle (last …)"."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from qmgui.core.bench import generation_rate
from qmgui.core.units import format_bytes
from qmgui.engines.bench import read_metrics
from qmgui.engines.router import read_router
from qmgui.engines.supervisor import State
from qmgui.service.exposure import api_key_of
from qmgui.ui import browser
from qmgui.ui.engine_runner import Engine, EngineRunner
from qmgui.ui.workers import LatestWins

REFRESH_MS = 500
LOG_LINES = 400  # the log view shows at most the last this many lines of the ring buffer
COLUMNS = ("Model", "State", "URL", "Uptime", "Memory (planned / actual)", "Speed")
COL_MODEL, COL_STATE, COL_URL, COL_UPTIME, COL_MEMORY, COL_SPEED = range(len(COLUMNS))
MODEL_COLUMN_PX = 190
METRICS_EVERY = 4  # refreshes between two /metrics readings (2 s)


def _argv(engine: Engine) -> tuple[str, ...]:
    if engine.spec is not None:
        return tuple(engine.spec.argv)
    handle = engine.handle
    return tuple(handle.argv or ()) if handle is not None else ()


def uptime_words(seconds: float | None) -> str:
    if seconds is None:
        return ""
    s = int(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def router_memory_words(engine: Engine) -> str:
    """A router's Memory cell: what its loaded models allocated, read back from their logs
    (else what their processes hold); no plan to compare."""
    reading = engine.router
    held = [m.buffer_bytes or m.rss_bytes or 0 for m in reading.loaded] if reading else []
    return f"— / {format_bytes(sum(held))}" if any(held) else ""


def router_tip(engine: Engine) -> str:
    reading = engine.router
    if reading is None:
        return ""
    lines = []
    for m in reading.models:
        held = f", {format_bytes(m.buffer_bytes)} allocated" if m.buffer_bytes else ""
        held += f", {format_bytes(m.rss_bytes)} resident (pid {m.pid})" if m.rss_bytes else ""
        lines.append(f"{m.name}: {m.status}{held}")
    return "\n".join(lines)


def memory_words(engine: Engine) -> str:
    if engine.is_router:
        return router_memory_words(engine)
    mem = engine.memory
    if mem is None:
        return ""
    planned = format_bytes(mem.planned) if mem.planned is not None else "—"
    actual = format_bytes(mem.actual) if mem.actual is not None else "—"
    return f"{planned} / {actual}" + (" ⚠" if mem.overruns else "")


def state_words(engine: Engine) -> str:
    if engine.busy:
        return {State.READY: "stopping…"}.get(engine.state, engine.state.value + "…")
    return engine.state.value


class EnginesPanel(QWidget):
    """`copied(url)` after Copy URL."""

    copied = Signal(str)

    def __init__(self, runner: EngineRunner, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self._ids: list[int] = []
        self._log_key: tuple[int, int, int, str] | None = None
        self.metrics = self._init_metrics()

        # the dock around this panel carries the "Engines" title; this line says what to do
        title = QLabel("Running engines: start one with Start under the launch command.", self)
        self.chat_button = QPushButton("Open chat", self)
        self.chat_button.setToolTip("Open the selected engine's own chat page in the browser")
        self.chat_button.hide()
        self.copy_button = QPushButton("Copy URL", self)
        self.copy_button.setToolTip("Copy the selected engine's address")
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setToolTip("Stop the selected engine (its whole process tree)")
        self.restart_button = QPushButton("Restart", self)
        self.restart_button.setToolTip("Stop the selected engine and start it again")
        self.keep_box = QCheckBox("Keep running after quit", self)
        self.keep_box.setToolTip(
            "Leave the selected engine running when qmgui quits; qmgui adopts it when it "
            "starts again (`qmgui engines stop` stops it)"
        )

        self.table = self._build_table()
        self.log = self._build_log()

        top = QHBoxLayout()
        top.addWidget(title)
        top.addStretch(1)
        top.addWidget(self.chat_button)
        top.addWidget(self.copy_button)
        top.addWidget(self.stop_button)
        top.addWidget(self.restart_button)
        top.addWidget(self.keep_box)
        self.split = QSplitter(Qt.Orientation.Horizontal, self)
        self.split.addWidget(self.table)
        self.split.addWidget(self.log)
        self.split.setStretchFactor(0, 3)  # the table's columns first, then the log
        self.split.setStretchFactor(1, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 4)
        layout.addLayout(top)
        layout.addWidget(self.split, 1)

        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)

        self.chat_button.clicked.connect(self.open_chat)
        self.copy_button.clicked.connect(self.copy_url)
        self.stop_button.clicked.connect(self._stop)
        self.restart_button.clicked.connect(self._restart)
        self.keep_box.toggled.connect(self._keep)
        self.table.itemSelectionChanged.connect(self._on_selection)
        self.timer.timeout.connect(self.refresh)
        runner.added.connect(self._on_added)
        runner.changed.connect(self._on_changed)
        self._update_buttons()

    def _init_metrics(self) -> LatestWins:
        self._metrics: dict[int, dict[str, float]] = {}  # the last /metrics reading per engine
        self._speed: dict[int, tuple[float | None, float | None]] = {}  # now, last seen
        self._ticks = 0
        worker = LatestWins("metrics", self)
        worker.finished.connect(self._on_metrics)
        self.routers = LatestWins("routers", self)  # routers' models, read on a worker
        self.routers.finished.connect(self._on_routers)
        return worker

    def _build_table(self) -> QTableWidget:
        table = QTableWidget(0, len(COLUMNS), self)
        table.setHorizontalHeaderLabels(list(COLUMNS))
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.verticalHeader().hide()
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        # a long name (a router's models) is elided, whole in its tooltip: the columns after
        # it (memory, speed) stay in view
        header.setSectionResizeMode(COL_MODEL, QHeaderView.ResizeMode.Interactive)
        table.setColumnWidth(COL_MODEL, MODEL_COLUMN_PX)
        header.setStretchLastSection(True)
        header.setTextElideMode(Qt.TextElideMode.ElideRight)  # a narrow dock: "Memory (pl…"
        return table

    def _build_log(self) -> QPlainTextEdit:
        log = QPlainTextEdit(self)
        log.setReadOnly(True)
        log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        log.setMaximumBlockCount(LOG_LINES)
        log.setPlaceholderText("Start a model to see its engine's log here.")
        return log

    # --- what is shown ----------------------------------------------------------------------
    def selected_id(self) -> int | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        row = rows[0].row()
        return self._ids[row] if 0 <= row < len(self._ids) else None

    def selected(self) -> Engine | None:
        eid = self.selected_id()
        return None if eid is None else self.runner.engines.get(eid)

    def select(self, eid: int) -> None:
        if eid in self._ids:
            self.table.selectRow(self._ids.index(eid))

    def state_of(self, eid: int) -> str:
        """The State column's text for engine `eid` ("" when it is not listed)."""
        if eid not in self._ids:
            return ""
        item = self.table.item(self._ids.index(eid), COL_STATE)
        return item.text() if item else ""

    def _on_added(self, eid: int) -> None:
        self._sync_rows()
        self.select(eid)
        if not self.timer.isActive():
            self.timer.start()

    def _on_changed(self, eid: int) -> None:
        self._sync_rows()
        self._update_buttons()

    def _sync_rows(self) -> None:
        ids = list(self.runner.engines)
        if ids != self._ids:
            keep = self.selected_id()
            self._ids = ids
            self.table.setRowCount(len(ids))
            if keep in ids:
                self.select(keep)
        for row, eid in enumerate(ids):
            self._fill_row(row, self.runner.engines[eid])

    def _fill_row(self, row: int, engine: Engine) -> None:
        url = engine.url or ""
        texts = (
            engine.label,
            state_words(engine),
            url,
            uptime_words(engine.uptime_s()),
            memory_words(engine),
            self.speed_words(engine.id),
        )
        for col, text in enumerate(texts):
            item = self.table.item(row, col)
            if item is None:
                item = QTableWidgetItem(text)
                self.table.setItem(row, col, item)
            elif item.text() != text:
                item.setText(text)
        tip = engine.error
        handle = engine.handle
        if not tip and handle is not None and engine.state.final:
            tip = str(handle.outcome or "")
        state_item = self.table.item(row, COL_STATE)
        if state_item is not None and state_item.toolTip() != tip:
            state_item.setToolTip(tip)
        memory_item = self.table.item(row, COL_MEMORY)
        mem = engine.memory
        memory_tip = "\n".join(mem.overruns) if mem is not None and mem.overruns else ""
        if memory_item is not None and memory_item.toolTip() != memory_tip:
            memory_item.setToolTip(memory_tip)
        model_item = self.table.item(row, COL_MODEL)
        if model_item is not None:
            tip = router_tip(engine) if engine.is_router else engine.label
            if model_item.toolTip() != tip:
                model_item.setToolTip(tip)

    def refresh(self) -> None:
        """The timer: uptimes, states and the selected engine's log tail (all cheap reads)."""
        self._sync_rows()
        self._update_buttons()
        self._follow_log()
        self._poll_metrics()
        if not self.runner.running() and not any(e.busy for e in self.runner.engines.values()):
            self.timer.stop()
            self._follow_log()

    def speed_words(self, eid: int) -> str:
        """The Speed column: generation tokens/s over the last reading, else the last seen."""
        now, last = self._speed.get(eid, (None, None))
        if now is not None:
            return f"{now:.1f} t/s"
        return f"idle (last {last:.1f} t/s)" if last is not None else ""

    def _poll_metrics(self) -> None:
        """Every `METRICS_EVERY` refreshes: read the ready llama-server engines' `/metrics`
        on a worker thread (a bounded request each)."""
        self._ticks += 1
        if self._ticks % METRICS_EVERY or self.metrics.busy:
            return
        targets = [
            (eid, e.url, _argv(e))
            for eid, e in self.runner.engines.items()
            if e.kind == "llama" and e.url and e.state is State.READY and not e.busy
        ]
        if targets:  # an engine with an API key is asked with it (the key file read there)
            self.metrics.submit(
                lambda: {
                    eid: read_metrics(url, api_key=api_key_of(argv)) for eid, url, argv in targets
                }
            )
        self.poll_routers()

    def poll_routers(self) -> None:
        """Read the ready routers' models (and their children's memory) on a worker."""
        routers = [
            (eid, e.url, e.handle)
            for eid, e in self.runner.engines.items()
            if e.is_router and e.url and e.handle and e.state is State.READY and not e.busy
        ]
        if routers and not self.routers.busy:
            self.routers.submit(
                lambda: {eid: read_router(url, h.pid, h.log.text()) for eid, url, h in routers}
            )

    def _on_routers(self, result: object) -> None:
        assert isinstance(result, dict)
        for eid, reading in result.items():
            engine = self.runner.engines.get(eid)
            if engine is not None and engine.router != reading:
                before = engine.label
                engine.router = reading
                if engine.label != before:
                    self.runner.changed.emit(eid)  # the tray shows the loaded models too
        self._sync_rows()

    def _on_metrics(self, result: object) -> None:
        assert isinstance(result, dict)
        for eid, reading in result.items():
            if reading is None:
                continue
            prev = self._metrics.get(eid)
            self._metrics[eid] = reading
            if prev is not None:
                rate = generation_rate(prev, reading)
                last = self._speed.get(eid, (None, None))[1]
                self._speed[eid] = (rate, rate if rate is not None else last)
        self._sync_rows()

    def _follow_log(self) -> None:
        engine = self.selected()
        sup = engine.handle if engine is not None else None
        if sup is None:
            if self._log_key is not None:
                self._log_key = None
                self.log.clear()
            return
        lines = sup.log.tail(LOG_LINES)
        key = (engine.id if engine else 0, id(sup), len(lines), lines[-1] if lines else "")
        if key == self._log_key:
            return
        self._log_key = key
        bar = self.log.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        self.log.setPlainText("\n".join(lines))
        if at_end:
            bar.setValue(bar.maximum())

    def _on_selection(self) -> None:
        self._update_buttons()
        self._follow_log()

    def _update_buttons(self) -> None:
        engine = self.selected()
        live = engine is not None and not engine.busy and not engine.state.final
        self.copy_button.setEnabled(engine is not None and bool(engine.url) and live)
        chat = engine.chat_url if engine is not None else None
        self.chat_button.setVisible(chat is not None)  # absent for an engine without one
        ready = engine is not None and engine.state is State.READY
        self.chat_button.setEnabled(chat is not None and live and ready)
        self.stop_button.setEnabled(live and engine is not None and engine.handle is not None)
        self.keep_box.setEnabled(live)
        keep = engine is not None and engine.keep
        if self.keep_box.isChecked() != keep:
            self.keep_box.blockSignals(True)
            self.keep_box.setChecked(keep)
            self.keep_box.blockSignals(False)
        self.restart_button.setEnabled(
            engine is not None and not engine.busy and engine.spec is not None
        )

    # --- actions ----------------------------------------------------------------------------
    def copy_url(self) -> None:
        engine = self.selected()
        if engine is not None and engine.url:
            QGuiApplication.clipboard().setText(engine.url)
            self.copied.emit(engine.url)

    def open_chat(self) -> None:
        """The selected engine's own chat page (llama-server's web UI) in the browser."""
        engine = self.selected()
        url = engine.chat_url if engine is not None else None
        if url is not None:
            browser.open_url(url)

    def _stop(self) -> None:
        eid = self.selected_id()
        if eid is not None:
            self.runner.stop(eid)

    def _keep(self, on: bool) -> None:
        eid = self.selected_id()
        if eid is not None:
            self.runner.set_keep(eid, on)

    def _restart(self) -> None:
        eid = self.selected_id()
        if eid is not None:
            self.runner.restart(eid)
            if not self.timer.isActive():
                self.timer.start()
