"""The window shows the latest `qmgui bench` result of the selected model under the plan's
verdict: measured with the real engine by the CLI, read with the plan off the GUI thread."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from qmgui.core.bench import BenchResult
from qmgui.engines.bench import BenchStore
from qmgui.engines.llama_run import find_llama_server
from tests.synth.factory import PRESETS, write_gguf
from tests.ui.conftest import settle

LLAMA_SERVER = find_llama_server()


@pytest.fixture
def one_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QMGUI_LOG_DIR", str(tmp_path / "logs"))
    d = tmp_path / "one"
    write_gguf(d / "tiny-llama.gguf", PRESETS["llama"])
    return d


def measured_text(w) -> str:  # type: ignore[no-untyped-def]
    label = w.memory.measured
    return "" if label.isHidden() else label.text()


def test_window_shows_the_measured_speed_of_the_selected_model(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path
) -> None:
    if LLAMA_SERVER is None:
        pytest.skip("llama-server not found")
    from qmgui.cli import main

    model = one_model / "tiny-llama.gguf"
    out, err = io.StringIO(), io.StringIO()
    args = ["bench", str(model), "--no-probe", "--prompt-tokens", "32", "--gen-tokens", "8"]
    rc = main([*args, "--json"], out=out, err=err)
    assert rc == 0, err.getvalue()
    data = json.loads(out.getvalue())
    gen = data["generation_tokens_per_s"]

    w = make_window([str(one_model)])
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    text = measured_text(w)
    expected = f"{gen:.1f}" if gen < 100 else f"{gen:.0f}"
    assert text.startswith(f"last measured: {expected} t/s generation, "), text
    assert "other settings" not in text  # the command the plan shows is the one measured
    assert w.memory.measured.toolTip().startswith("qmgui bench: 32 prompt tokens, 8 generated")


def test_window_says_when_the_figure_was_measured_with_other_settings(  # type: ignore[no-untyped-def]
    qtbot, make_window, one_model: Path
) -> None:
    from qmgui.engines.residuals import machine_name
    from tests.core.test_bench import result

    w = make_window([str(one_model)])
    settle(qtbot, w)
    assert w.table.select_name("tiny-llama")
    settle(qtbot, w)
    assert measured_text(w) == ""  # never measured: nothing shown
    model_id = w.outcome.entry.id
    r: BenchResult = replace(result(), model_id=model_id, machine=machine_name(), settings="-c 7")
    BenchStore().record(r)
    w._schedule_plan()  # a new plan reads the store again
    settle(qtbot, w)
    assert measured_text(w) == (
        "last measured: 41.2 t/s generation, 310 t/s prompt (2026-12-02 01:10), with other settings"
    )
