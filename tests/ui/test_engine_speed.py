"""Live speed: the Engines panel's Speed column, from llama-server's `/metrics` (qmgui starts
llama-server with `--metrics`)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from qmgui.core.discovery import entry_for_path
from qmgui.core.emit import Command
from qmgui.engines.supervisor import EngineSpec
from qmgui.service.launch import engine_spec
from qmgui.ui.engine_runner import Engine, EngineRunner
from qmgui.ui.engines_panel import COL_SPEED, EnginesPanel
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle
from tests.ui.test_engines_panel import LLAMA_SERVER, READY_MS
from tests.ui.test_open_chat import LLAMA_URL, FakeSupervisor


@pytest.fixture
def runner() -> EngineRunner:
    r = EngineRunner(registry=False)
    spec = EngineSpec(argv=("llama-server", "-m", "/m/tiny.gguf"), name="tiny", kind="llama")
    engine = Engine(1, "tiny", spec, None)
    engine.supervisor = FakeSupervisor(spec, LLAMA_URL)  # type: ignore[assignment]
    r.engines[1] = engine
    return r


@pytest.fixture
def one_model(tmp_path: Path) -> Path:
    d = tmp_path / "one"
    write_gguf(d / "tiny-llama.gguf", PRESETS["llama"])
    return d


def reading(tokens: float, seconds: float) -> dict[str, float]:
    return {
        "llamacpp:tokens_predicted_total": tokens,
        "llamacpp:tokens_predicted_seconds_total": seconds,
    }


def test_speed_column_from_two_readings(qtbot, runner: EngineRunner) -> None:  # type: ignore[no-untyped-def]
    panel = EnginesPanel(runner)
    qtbot.addWidget(panel)
    runner.added.emit(1)
    panel._on_metrics({1: reading(10, 1.0), 2: None})
    assert panel.table.item(0, COL_SPEED).text() == ""  # one reading: no rate yet
    panel._on_metrics({1: reading(110, 3.0)})
    assert panel.table.item(0, COL_SPEED).text() == "50.0 t/s"
    panel._on_metrics({1: reading(110, 3.0)})
    assert panel.table.item(0, COL_SPEED).text() == "idle (last 50.0 t/s)"
    panel.timer.stop()


def test_llama_server_is_started_with_metrics_once(tmp_path: Path) -> None:
    from tests.synth.factory import PRESETS, write_gguf

    entry = entry_for_path(str(write_gguf(tmp_path / "m.gguf", PRESETS["llama"])))
    spec = engine_spec(Command(argv=("llama-server", "-m", "m.gguf")), "llama", entry)
    assert spec.argv.count("--metrics") == 1
    again = engine_spec(Command(argv=("llama-server", "--metrics")), "llama", entry)
    assert again.argv.count("--metrics") == 1
    vllm = engine_spec(Command(argv=("vllm", "serve", "x")), "vllm", entry)
    assert "--metrics" not in vllm.argv


def test_a_running_engine_shows_its_live_speed(  # type: ignore[no-untyped-def]
    qtbot,
    make_window,
    one_model: Path,
) -> None:
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    w = make_window([str(one_model)])
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    qtbot.waitUntil(w.start_button.isEnabled)
    panel = w.engines_panel
    eid = w.start_engine()
    engine = w.engine_runner.engines[eid]
    try:
        qtbot.waitUntil(
            lambda: panel.state_of(eid) == "ready" or engine.state.final, timeout=READY_MS
        )
        assert panel.state_of(eid) == "ready"
        assert engine.supervisor is not None and "--metrics" in (engine.supervisor.argv or ())
        qtbot.waitUntil(lambda: eid in panel._metrics, timeout=10_000)  # a first reading
        body = {
            "prompt": "hello",
            "n_predict": 32,
            "ignore_eos": True,
            "grammar": "root ::= [ -~]*",
        }
        request = urllib.request.Request(
            f"{engine.url}/completion",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 200
        row = panel._ids.index(eid)
        qtbot.waitUntil(lambda: "t/s" in panel.table.item(row, COL_SPEED).text(), timeout=10_000)
    finally:
        w.engine_runner.stop_all()
