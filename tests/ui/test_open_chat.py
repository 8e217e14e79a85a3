"""Open chat: the Engines panel and the tray open the engine's own web UI (llama-server's `/`)
through `qmgui.ui.browser.open_url`; an engine without one (vLLM, whisper, sd) has no button
and no menu entry."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from qmgui.engines.supervisor import EngineSpec, State
from qmgui.settings import Settings
from qmgui.ui.engine_runner import Engine, EngineRunner
from qmgui.ui.engines_panel import EnginesPanel
from qmgui.ui.tray import EngineRow, RunnerEngines, Tray
from tests.ui.test_tray import FakeEngines, FakePrompts, PolicyWindow

LLAMA_URL = "http://127.0.0.1:8081"
VLLM_URL = "http://127.0.0.1:8082"


class FakeLog:
    last_line_at = None

    def tail(self, n: int) -> list[str]:
        return []


class FakeSupervisor:
    """What the panel reads of a supervisor: a ready engine at `url`."""

    def __init__(self, spec: EngineSpec, url: str) -> None:
        self.spec = spec
        self.url = url
        self.state = State.READY
        self.log = FakeLog()
        self.outcome = None
        self.pid = None


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def fake_open(url: str) -> bool:
        calls.append(url)
        return True

    monkeypatch.setattr("qmgui.ui.browser.open_url", fake_open)
    return calls


@pytest.fixture
def runner(qtbot) -> EngineRunner:  # type: ignore[no-untyped-def]
    r = EngineRunner(registry=False)
    llama = EngineSpec(argv=("llama-server", "-m", "/m/tiny.gguf"), name="tiny", kind="llama")
    vllm = EngineSpec(argv=("vllm", "serve", "/m/hf"), name="hf", kind="vllm")
    for eid, spec, url in ((1, llama, LLAMA_URL), (2, vllm, VLLM_URL)):
        engine = Engine(eid, spec.name, spec, None)
        engine.supervisor = FakeSupervisor(spec, url)  # type: ignore[assignment]
        r.engines[eid] = engine
    return r


def test_panel_opens_the_llama_server_web_ui(
    qtbot, runner: EngineRunner, opened: list[str]
) -> None:  # type: ignore[no-untyped-def]
    panel = EnginesPanel(runner)
    qtbot.addWidget(panel)
    runner.added.emit(1)
    runner.added.emit(2)
    panel.select(1)
    assert not panel.chat_button.isHidden() and panel.chat_button.isEnabled()
    panel.chat_button.click()
    assert opened == [LLAMA_URL + "/"]
    # a vLLM engine serves no chat page: the button is absent
    panel.select(2)
    assert panel.chat_button.isHidden()
    panel.open_chat()
    assert opened == [LLAMA_URL + "/"]
    panel.timer.stop()


def test_tray_offers_open_chat_only_for_an_engine_with_a_web_ui(
    qtbot, runner: EngineRunner, opened: list[str]
) -> None:  # type: ignore[no-untyped-def]
    source = RunnerEngines(runner)
    rows = source.engines()
    assert [r.chat_url for r in rows] == [LLAMA_URL + "/", None]
    window = PolicyWindow()
    qtbot.addWidget(window)
    tray = Tray(
        window, FakeEngines(rows), load=Settings, save=lambda s: None, prompts=FakePrompts(),
        quit=lambda: None, tray_available=False,
    )  # fmt: skip
    window.tray = tray
    action = tray.find_action("engine:1", "open-chat")
    assert action is not None and action.text() == "Open chat"
    action.trigger()
    assert opened == [LLAMA_URL + "/"]
    assert tray.find_action("engine:2", "open-chat") is None
    assert tray.find_action("engine:2", "copy-url") is not None
    tray._quitting = True
    QApplication.processEvents()


def test_tray_has_no_open_chat_for_an_engine_not_ready(qtbot, opened: list[str]) -> None:  # type: ignore[no-untyped-def]
    window = PolicyWindow()
    qtbot.addWidget(window)
    row = EngineRow("e1", "tiny", State.LOADING, LLAMA_URL, LLAMA_URL + "/")
    tray = Tray(
        window, FakeEngines([row]), load=Settings, save=lambda s: None, prompts=FakePrompts(),
        quit=lambda: None, tray_available=False,
    )  # fmt: skip
    window.tray = tray
    assert tray.find_action("engine:e1", "open-chat") is None
    tray._quitting = True
