"""Stable ports: a model's port is chosen once, saved, and used by every start; a taken port
fails, naming what holds it and the next free one."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from qmgui.cli import main
from qmgui.core.discovery import entry_for_path
from qmgui.core.emit import Command
from qmgui.engines.llama_run import find_llama_server
from qmgui.engines.model_ports import choose_port, ensure_port
from qmgui.engines.ports import free_port, port_holder, taken_sentence
from qmgui.engines.supervisor import EngineSpec, OutcomeKind, State, Supervisor
from qmgui.service.launch import engine_spec
from qmgui.settings import ModelOverride, PortRange, Settings, load_settings, save_settings
from tests.synth.factory import PRESETS, write_gguf

BINARY = find_llama_server()
CHILD = str(Path(__file__).with_name("supervisor_child.py"))


@pytest.fixture(autouse=True)
def _dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("QMGUI_STATE_DIR", str(tmp_path / "state"))


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A socket listening on a loopback port: held by this test's own process."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        yield s
    finally:
        s.close()


def _range() -> PortRange:
    first = free_port()
    first = min(first, 65535 - 40)
    return PortRange(first=first, last=first + 30)


def test_port_settings_are_checked() -> None:
    with pytest.raises(ValidationError):
        ModelOverride(port=0)
    with pytest.raises(ValidationError):
        ModelOverride(port=65536)
    with pytest.raises(ValidationError):
        PortRange(first=9000, last=8000)
    assert Settings().ports.first == 8080 and Settings().ports.last == 8179


def test_chosen_once_skipping_other_models_and_busy_ports(listener: socket.socket) -> None:
    busy = listener.getsockname()[1]
    settings = Settings(
        ports=PortRange(first=busy - 1, last=busy + 5),
        model_overrides={"other": ModelOverride(port=busy - 1)},
    )
    save_settings(settings)
    # the other model's port, then the busy one, are skipped
    first = choose_port(settings, "mine")
    assert first not in (busy - 1, busy)
    assert ensure_port("mine") == first
    assert load_settings().settings.model_overrides["mine"].port == first
    # once saved it is the model's, even while something listens on it
    with socket.socket() as s:
        s.bind(("127.0.0.1", first))
        s.listen()
        assert ensure_port("mine") == first
        assert choose_port(load_settings().settings, "mine") == first
    assert load_settings().settings.model_overrides["other"].port == busy - 1


def test_the_sentence_names_the_holder_and_the_next_free_port(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    holder = port_holder(port)
    assert holder is not None and f"pid {os.getpid()}" in holder
    words = taken_sentence("tiny", port)
    assert f"port {port}" in words and f"pid {os.getpid()}" in words
    assert "--port " in words and "taken" in words


def test_a_taken_port_fails_and_no_engine_runs(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    spec = EngineSpec(argv=(sys.executable, CHILD, "ready"), name="tiny", port=port)
    sup = Supervisor(spec)
    sup.start()
    assert sup.wait(10) is not None
    assert sup.state == State.FAILED and sup.pid is None
    outcome = sup.outcome
    assert outcome is not None and outcome.kind == OutcomeKind.PORT_TAKEN
    assert f"pid {os.getpid()}" in outcome.message and "--port " in outcome.message


def test_lv_once_in_the_engine_argv(tmp_path: Path) -> None:
    entry = entry_for_path(str(write_gguf(tmp_path / "m.gguf", PRESETS["llama"])))
    emitted = Command(argv=("llama-server", "-m", "m.gguf", "--port", "8080", "-lv", "4"))
    assert engine_spec(emitted, "llama", entry, port=8080).argv.count("-lv") == 1
    bare = Command(argv=("llama-server", "-m", "m.gguf"))
    assert engine_spec(bare, "llama", entry).argv.count("-lv") == 1


def test_preview_shows_the_saved_port(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", PRESETS["llama"])
    entry = entry_for_path(str(path))
    save_settings(Settings(model_overrides={entry.id: ModelOverride(port=9123)}))
    out, err = io.StringIO(), io.StringIO()
    code = main(["preview", str(path), "--no-probe", "--json"], out=out, err=err)
    assert code == 0, err.getvalue()
    argv = json.loads(out.getvalue())["argv"]
    assert argv[argv.index("--port") + 1] == "9123"
    assert argv.count("-lv") == 1


def _serve(model: Path, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "qmgui", "serve", str(model), "-c", "512", "--no-probe"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "QMGUI_TEST_LLAMA_SERVER": str(BINARY)},
    )


@pytest.mark.skipif(BINARY is None, reason="llama-server not found")
def test_serve_keeps_the_port_across_runs_and_names_a_holder(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "models" / "tiny.gguf", PRESETS["llama"])
    save_settings(Settings(ports=_range()))
    urls = []
    for _ in range(2):
        proc = _serve(model, tmp_path)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            assert first.startswith("ready http://127.0.0.1:"), (first, proc.stderr)
            urls.append(first.split()[1])
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=20)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert urls[0] == urls[1]
    port = int(urls[0].rsplit(":", 1)[1])
    entry = entry_for_path(str(model))
    assert load_settings().settings.model_overrides[entry.id].port == port
    # the port taken: serve fails naming the holder, and starts nothing on another port
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        proc = _serve(model, tmp_path)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "ready" not in out
    assert f"pid {os.getpid()}" in err and "--port " in err, err
