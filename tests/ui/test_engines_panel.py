"""The Engines panel: Start the selected model's command under the supervisor, follow it to
READY, Copy / Stop, and the quit path stopping what the window started."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import psutil
import pytest
from PySide6.QtGui import QGuiApplication

from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.supervisor import State
from qmgui.ui.engines_panel import uptime_words
from qmgui.ui.main_window import MainWindow
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle

LLAMA_SERVER = find_llama_server()
READY_MS = 60_000


@pytest.fixture
def one_model(tmp_path: Path) -> Path:
    d = tmp_path / "one"
    write_gguf(d / "tiny-llama.gguf", PRESETS["llama"])
    return d


@pytest.fixture
def llama_on_path() -> str:
    """The window's command names the llama-server `find_llama_server` finds."""
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    return LLAMA_SERVER


def ready_window(qtbot, make_window, root: Path) -> MainWindow:  # type: ignore[no-untyped-def]
    w: MainWindow = make_window([str(root)])
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    assert w.outcome is not None and w.outcome.command.runnable
    qtbot.waitUntil(w.start_button.isEnabled)
    return w


def test_uptime_words() -> None:
    assert uptime_words(None) == ""
    assert uptime_words(65) == "1:05"
    assert uptime_words(3725) == "1:02:05"


def test_start_with_a_missing_engine_says_what_to_install(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # no llama-server anywhere: the plan knows, and Start says what to install instead
    monkeypatch.setattr("qmgui.service.launch.find_llama_server", lambda env=None: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    w = ready_window(qtbot, make_window, one_model)
    assert "llama.cpp release" in w.start_button.toolTip()
    w.start_button.click()
    assert "llama.cpp release" in w.statusBar().currentMessage()
    assert not w.engine_runner.engines


def test_an_engine_gone_since_the_plan_fails_in_the_panel(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # planned while llama-server was there (as far as the plan knew); gone when Start runs it
    monkeypatch.setattr("qmgui.service.launch.find_llama_server", lambda env=None: None)
    monkeypatch.setattr("qmgui.ui.planning.missing_engine", lambda target: None)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    w = ready_window(qtbot, make_window, one_model)
    w.start_button.click()
    qtbot.waitUntil(lambda: len(w.engine_runner.engines) == 1)
    (eid,) = w.engine_runner.engines
    qtbot.waitUntil(lambda: w.engines_panel.state_of(eid) == "failed", timeout=10_000)
    engine = w.engine_runner.engines[eid]
    assert engine.supervisor is not None and engine.supervisor.outcome is not None
    assert "cannot start" in str(engine.supervisor.outcome)
    assert not w.engines_panel.stop_button.isEnabled()
    assert w.engines_panel.restart_button.isEnabled()
    w.engine_runner.wait()


def test_start_ready_health_copy_stop(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    w = ready_window(qtbot, make_window, one_model)
    panel = w.engines_panel
    w.start_button.click()
    qtbot.waitUntil(lambda: len(w.engine_runner.engines) == 1)
    (eid,) = w.engine_runner.engines
    engine = w.engine_runner.engines[eid]
    try:
        qtbot.waitUntil(
            lambda: panel.state_of(eid) == "ready" or engine.state.final, timeout=READY_MS
        )
        assert panel.state_of(eid) == "ready", engine.supervisor and engine.supervisor.outcome
        sup = engine.supervisor
        assert sup is not None and sup.url is not None
        # the command is the preview's, its port replaced by a free one
        assert sup.argv is not None and sup.argv[0].endswith("llama-server")
        assert w.outcome is not None and w.outcome.command.argv[1:3] == sup.argv[1:3]
        with urllib.request.urlopen(f"{sup.url}/health", timeout=5) as r:
            assert r.status == 200
        row = panel.table
        assert row.item(0, 2).text() == sup.url
        # planned vs actual total memory once ready
        # (the readback of the engine's log can land after the cell first shows the plan)
        qtbot.waitUntil(lambda: engine.memory is not None and bool(engine.memory.actual),
                        timeout=10_000)  # fmt: skip
        qtbot.waitUntil(lambda: "/" in row.item(0, 4).text(), timeout=5_000)
        # the log view follows the ring buffer
        qtbot.waitUntil(lambda: "qmgui:" in panel.log.toPlainText(), timeout=5_000)
        panel.copy_url()
        assert QGuiApplication.clipboard().text() == sup.url
        assert sup.pid is not None
        pids = [sup.pid, *(c.pid for c in psutil.Process(sup.pid).children(recursive=True))]

        assert panel.stop_button.isEnabled()
        panel.stop_button.click()
        qtbot.waitUntil(lambda: panel.state_of(eid) == "stopped", timeout=30_000)
        w.engine_runner.wait()
        assert not any(psutil.pid_exists(p) for p in pids)
    finally:
        w.engine_runner.stop_all()


def test_quit_stops_every_engine(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    w = ready_window(qtbot, make_window, one_model)
    eid = w.start_engine()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
    assert engine.state == State.READY
    w.close()  # no tray yet: closing is quitting
    assert engine.state == State.STOPPED
    assert not w.engine_runner.running()


def test_restart_keeps_the_saved_port(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    from qmgui.settings import load_settings

    w = ready_window(qtbot, make_window, one_model)
    assert w.outcome is not None
    argv = w.outcome.command.argv
    shown = int(argv[argv.index("--port") + 1])  # the port the first start will save
    eid = w.start_engine()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    try:
        qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
        first = engine.supervisor
        assert first is not None and first.state == State.READY, first.outcome
        assert first.port == shown and first.argv is not None and first.argv.count("-lv") == 1
        saved = load_settings().settings.model_overrides[w.outcome.entry.id].port
        assert saved == shown
        w.engine_runner.restart(eid)
        qtbot.waitUntil(
            lambda: engine.supervisor is not first and engine.state == State.READY,
            timeout=READY_MS,
        )
        assert engine.supervisor is not None and engine.supervisor.port == shown
        with urllib.request.urlopen(f"{engine.supervisor.url}/health", timeout=5) as r:
            assert r.status == 200
    finally:
        w.engine_runner.stop_all()


def test_start_on_a_taken_port_names_the_holder(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    import os
    import socket

    from qmgui.core.discovery import entry_for_path
    from qmgui.settings import ModelOverride

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        entry = entry_for_path(str(one_model / "tiny-llama.gguf"))
        w = ready_window(qtbot, make_window, one_model)
        overrides = {entry.id: ModelOverride(port=port)}  # the model's saved port
        w._store(w.settings.model_copy(update={"model_overrides": overrides}))
        w._schedule_plan()
        settle(qtbot, w)
        assert w.outcome is not None
        argv = w.outcome.command.argv
        assert argv[argv.index("--port") + 1] == str(port)  # the preview shows it
        eid = w.start_engine()
        assert eid is not None
        engine = w.engine_runner.engines[eid]
        qtbot.waitUntil(lambda: w.engines_panel.state_of(eid) == "failed", timeout=10_000)
        w.engine_runner.wait()
        sup = engine.supervisor
        assert sup is not None and sup.pid is None and sup.outcome is not None
        assert f"port {port}" in sup.outcome.message
        assert f"pid {os.getpid()}" in sup.outcome.message and "--port " in sup.outcome.message


def test_a_host_beyond_loopback_gets_an_api_key(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    """`--host 0.0.0.0` in the model's arguments: Start gives the engine the API key (made
    once, 0600, shown once) and says where it listens, once; a request without the key is
    refused."""
    import stat
    import urllib.error

    from qmgui import notify
    from qmgui.service.exposure import key_path

    w = ready_window(qtbot, make_window, one_model)
    w.plan_panel.extra_args_edit.setText("--host 0.0.0.0")
    w._schedule_plan()
    settle(qtbot, w)
    eid = w.start_engine()
    assert eid is not None
    engine = w.engine_runner.engines[eid]
    try:
        qtbot.waitUntil(lambda: engine.state == State.READY or engine.state.final, timeout=READY_MS)
        sup = engine.supervisor
        assert sup is not None and engine.state == State.READY, sup.outcome if sup else None
        argv = sup.argv or ()
        assert argv[argv.index("--api-key-file") + 1] == str(key_path())
        assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
        key = key_path().read_text().strip()
        texts = [m.text for m in notify.notifier.history]
        assert sum("reachable from the network" in t for t in texts) == 1
        assert any(key in t and "shown once" in t for t in texts)
        body = b'{"prompt": "hi", "n_predict": 1}'
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{sup.url}/completion", data=body, timeout=30)
        assert refused.value.code == 401
        req = urllib.request.Request(f"{sup.url}/props", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        # the Speed column's /metrics reading carries the key the engine was started with
        from qmgui.engines.bench import read_metrics
        from qmgui.service.exposure import api_key_of

        assert api_key_of(argv) == key
        assert read_metrics(sup.url) is None  # refused without it
        assert read_metrics(sup.url, api_key=key) is not None
    finally:
        w.engine_runner.stop_all()


def test_check_with_the_engine_shows_its_projection(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path, llama_on_path: str
) -> None:
    """ "Check with the engine" runs the real llama-server only as far as its -fit projection
    (on a worker, nothing left running) and shows it beside the plan."""
    w = ready_window(qtbot, make_window, one_model)
    assert w.memory.check.isVisibleTo(w)
    w.memory.check.click()
    qtbot.waitUntil(lambda: w.memory.checked.text().startswith("Engine check ("), timeout=60_000)
    text = w.memory.checked.text()
    assert "CPU: plan " in text and "(agrees)" in text, text
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(one_model) in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    # recorded with the memory residuals, apart from launch readbacks (qmgui doctor lists it)
    from qmgui.engines.residuals import ResidualStore

    assert len(ResidualStore().summary()["check"]) == 1
