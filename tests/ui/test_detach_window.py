"""Detached engines in the window, with the real engine: "Keep running after quit" and "Leave
them running" leave an engine serving after the window is gone, and a new window adopts it
(state, URL, uptime, its log from its log file) with Stop and Restart working on it. Every
engine still registered at the end is stopped (`leftovers`)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.registry import RunRegistry
from qmgui.engines.runner import group_members, watchdog
from qmgui.engines.supervisor import State
from qmgui.ui.engines_panel import COL_STATE, COL_UPTIME, COL_URL
from qmgui.ui.main_window import MainWindow
from qmgui.ui.tray import QuitChoice
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle
from tests.ui.test_tray import FakePrompts

LLAMA_SERVER = find_llama_server()
READY_MS = 60_000


@pytest.fixture
def leftovers() -> Iterator[RunRegistry]:
    """Stops whatever is still in the (per-test) run registry when the test ends."""
    registry = RunRegistry()
    yield registry
    for e in registry.entries():
        registry.stop(e, grace_s=2)


@pytest.fixture
def one_model(tmp_path: Path) -> Path:
    d = tmp_path / "one"
    write_gguf(d / "tiny-llama.gguf", PRESETS["llama"])
    return d


@pytest.fixture
def llama_on_path() -> str:
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    return LLAMA_SERVER


def ready_window(qtbot, make_window, root: Path, **kw: object) -> MainWindow:  # type: ignore[no-untyped-def]
    w: MainWindow = make_window([str(root)], **kw)
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    assert w.outcome is not None and w.outcome.command.runnable
    qtbot.waitUntil(w.start_button.isEnabled)
    return w


def start_ready(qtbot, w: MainWindow) -> int:  # type: ignore[no-untyped-def]
    eid = w.start_engine()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
    assert engine.state == State.READY, engine.supervisor and engine.supervisor.outcome
    return eid


def health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        status: int = r.status
        return status


def adopted_row(qtbot, make_window, root: Path) -> tuple[MainWindow, int]:  # type: ignore[no-untyped-def]
    w2: MainWindow = make_window([str(root)])
    qtbot.waitUntil(lambda: len(w2.engine_runner.engines) == 1, timeout=10_000)
    (eid,) = w2.engine_runner.engines
    panel = w2.engines_panel
    qtbot.waitUntil(lambda: panel.state_of(eid) == "ready", timeout=10_000)
    panel.select(eid)
    return w2, eid


def test_keep_running_after_quit_survives_the_window_and_is_adopted(  # type: ignore[no-untyped-def]
    leftovers: RunRegistry, qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    w1 = ready_window(qtbot, make_window, one_model)
    eid = start_ready(qtbot, w1)
    sup = w1.engine_runner.engines[eid].supervisor
    assert sup is not None and sup.pid is not None and sup.url is not None
    pid, url = sup.pid, sup.url
    assert pid in watchdog.watched()  # not kept: it would die with the window
    panel = w1.engines_panel
    panel.select(eid)
    assert panel.keep_box.isEnabled() and not panel.keep_box.isChecked()
    panel.keep_box.click()
    qtbot.waitUntil(lambda: pid not in watchdog.watched(), timeout=5_000)
    qtbot.waitUntil(lambda: all(e.detached for e in leftovers.running()), timeout=5_000)
    w1.engine_runner.wait()
    [entry] = leftovers.running()
    assert entry.detached and entry.model == "tiny-llama" and entry.log_path is not None

    w1.close()  # no tray: closing is quitting; the kept engine is let go of, not stopped
    assert sup.state == State.STOPPED and sup.released
    assert psutil.pid_exists(pid) and health(url) == 200

    w2, aid = adopted_row(qtbot, make_window, one_model)
    engine = w2.engine_runner.engines[aid]
    panel2 = w2.engines_panel
    assert engine.adopted is not None and engine.adopted.pid == pid
    assert panel2.table.item(0, COL_URL).text() == url
    assert panel2.table.item(0, COL_STATE).text() == "ready"
    qtbot.waitUntil(lambda: panel2.table.item(0, COL_UPTIME).text() != "", timeout=5_000)
    assert engine.keep and panel2.keep_box.isChecked()
    # its log, read from its log file: the window's own first line and the engine's
    qtbot.waitUntil(lambda: "listening on" in panel2.log.toPlainText(), timeout=5_000)
    assert "# qmgui:" in panel2.log.toPlainText()

    assert panel2.stop_button.isEnabled()
    panel2.stop_button.click()
    qtbot.waitUntil(lambda: panel2.state_of(aid) == "stopped", timeout=30_000)
    w2.engine_runner.wait()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert group_members(entry.pgid, None) == []
    assert leftovers.running() == []


@pytest.mark.usefixtures("llama_on_path")
def test_leave_them_running_then_restart_the_adopted_engine(  # type: ignore[no-untyped-def]
    leftovers: RunRegistry,
    qtbot,
    make_window,
    one_model: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w1 = ready_window(qtbot, make_window, one_model, tray=True)
    assert w1.tray is not None
    w1.tray.prompts = FakePrompts(QuitChoice.LEAVE)
    monkeypatch.setattr(w1.tray, "_quit", lambda: None)
    eid = start_ready(qtbot, w1)
    sup = w1.engine_runner.engines[eid].supervisor
    assert sup is not None and sup.pid is not None and sup.url is not None
    pid, url = sup.pid, sup.url
    assert w1.tray.request_quit()  # "Leave them running"
    assert sup.released and pid not in watchdog.watched()
    assert health(url) == 200
    [entry] = leftovers.running()
    assert entry.pid == pid and entry.detached

    w2, aid = adopted_row(qtbot, make_window, one_model)
    panel = w2.engines_panel
    assert panel.restart_button.isEnabled()
    panel.restart_button.click()
    engine = w2.engine_runner.engines[aid]
    qtbot.waitUntil(
        lambda: engine.supervisor is not None and engine.state == State.READY, timeout=READY_MS
    )
    new = engine.supervisor
    assert new is not None and new.pid != pid and new.url == url  # the same command, port
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert health(url) == 200
    [again] = leftovers.running()
    assert again.pid == new.pid and again.detached  # kept running, as it was
    assert new.pid not in watchdog.watched()
    w2.engine_runner.stop(aid)
    qtbot.waitUntil(lambda: engine.state == State.STOPPED, timeout=30_000)
    w2.engine_runner.wait()
    assert leftovers.running() == []
