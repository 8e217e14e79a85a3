"""The GUI thread never stalls: a 5 ms QTimer on it records the longest gap between ticks while
(a) 500 small models are scanned, (b) a fit search runs, (c) an engine starts (the real
llama-server when there is one). Each phase is measured several times and the median of the
longest gaps is held under 50 ms (one noisy sample on a busy CI machine is not a stall).

What it took (measured with this test on 2 cores): the table sorts its own list, the GUI's GIL
switch interval is 1 ms, workers breathe (`workers.Breather`), the fit badges start after the
new rows are painted, and the long-lived heap is frozen out of the garbage collector's full
passes (`main_window.freeze_heap`): gen-2 collections on worker threads were 100-220 ms."""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import State
from qmgui.ui.main_window import MainWindow
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle

N_MODELS = 500
TICK_MS = 5
LIMIT_MS = 50.0
ROUNDS = 3
LLAMA_SERVER = find_llama_server()


class StallMeter:
    """Ticks every TICK_MS on the GUI thread; `longest_ms` is the longest gap seen."""

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self._tick)
        self._last = 0.0
        self.longest_ms = 0.0

    def _tick(self) -> None:
        now = time.perf_counter()
        self.longest_ms = max(self.longest_ms, (now - self._last) * 1000)
        self._last = now

    def start(self) -> None:
        self.longest_ms = 0.0
        self._last = time.perf_counter()
        self.timer.start()

    def stop(self) -> float:
        self._tick()
        self.timer.stop()
        return self.longest_ms


@pytest.fixture(scope="module")
def many_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("many")
    one = write_gguf(d / "model-000.gguf", PRESETS["llama"])
    for i in range(1, N_MODELS):
        shutil.copyfile(one, d / f"model-{i:03d}.gguf")
    return d


def measure(qtbot, meter: StallMeter, act: Callable[[], None], done: Callable[[], bool]) -> float:  # type: ignore[no-untyped-def]
    meter.start()
    act()
    qtbot.waitUntil(done, timeout=120_000)
    qtbot.wait(50)  # what the finish posts to the GUI thread is part of the phase
    return meter.stop()


def report(gaps: dict[str, list[float]]) -> None:
    for phase, values in gaps.items():
        if values:
            shown = ", ".join(f"{v:.1f}" for v in values)
            print(
                f"\nlongest GUI gap, {phase}: {shown} ms (median {statistics.median(values):.1f})"
            )


def test_scan_does_not_stall(qtbot, make_window, many_models: Path) -> None:  # type: ignore[no-untyped-def]
    meter = StallMeter()
    meter.start()
    w: MainWindow = make_window([str(many_models)])  # builds, shows and starts the first scan
    qtbot.waitUntil(w.is_settled, timeout=120_000)
    first = meter.stop()
    assert w.table.model.rowCount() == N_MODELS
    print(f"\nfirst scan of {N_MODELS} models (window build included): {first:.1f} ms")
    gaps = {"scan": [measure(qtbot, meter, w.rescan, w.is_settled) for _ in range(ROUNDS)]}
    report(gaps)
    assert statistics.median(gaps["scan"]) < LIMIT_MS, gaps


def test_fit_search_and_engine_start_do_not_stall(  # type: ignore[no-untyped-def]
    qtbot, make_window, many_models: Path
) -> None:
    meter = StallMeter()
    w: MainWindow = make_window([str(many_models)])
    settle(qtbot, w)
    assert w.table.model.rowCount() == N_MODELS
    gaps: dict[str, list[float]] = {"fit": [], "engine": []}
    engine_ids: list[int] = []

    def start() -> None:
        eid = w.start_engine()
        assert eid is not None
        engine_ids.append(eid)

    def ready() -> bool:
        e = w.engine_runner.engines[engine_ids[-1]]
        return e.state == State.READY or e.state.final

    for _ in range(ROUNDS):
        settle(qtbot, w)
        gaps["fit"].append(measure(qtbot, meter, w.plan_panel.fitRequested.emit, w.is_settled))
        if LLAMA_SERVER is None:
            continue
        settle(qtbot, w)
        try:
            gaps["engine"].append(measure(qtbot, meter, start, ready))
            assert w.engine_runner.engines[engine_ids[-1]].state == State.READY
        finally:
            w.engine_runner.stop_all()
    report(gaps)
    for phase, values in gaps.items():
        if values:
            assert statistics.median(values) < LIMIT_MS, (phase, values)
