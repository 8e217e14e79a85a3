"""A Hugging Face folder in the window is a vLLM launch: its plan (by vLLM's rules), its bars,
its fit badge, its verdict; Start says what to install when vLLM is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.service.launch import Target, missing_engine
from qmgui.ui.model_table import BADGE_TEXT, FIT_COLUMN
from qmgui.ui.planning import Badge
from tests.synth.factory import write_hf_folder
from tests.ui.conftest import settle


@pytest.fixture
def no_vllm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A PATH without vllm (the registry is empty, so `vllm` is looked up on PATH)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_a_hugging_face_folder_is_planned_drawn_and_judged_as_vllm(  # type: ignore[no-untyped-def]
    qtbot, make_window, tmp_path: Path, no_vllm: None
) -> None:
    write_hf_folder(tmp_path / "hf" / "hf-llama")
    w = make_window([str(tmp_path / "hf")], hardware_choice="RTX 4090")
    settle(qtbot, w)
    assert w.table.select_name("hf-llama")
    settle(qtbot, w)
    o = w.outcome
    assert o is not None and o.vllm is not None and o.vllm.fits
    assert o.error is None
    # the GPU's bar holds the plan's weights, KV pool and overhead
    gpu_bar = w.memory.bars[0].spec
    assert gpu_bar is not None and gpu_bar.planned > 0
    b = o.vllm.breakdown
    assert b is not None
    assert dict(gpu_bar.segments)["kv"] == b.kv_pool.nbytes
    assert dict(gpu_bar.segments)["weights"] == b.weights.nbytes
    assert "(vLLM)" in w.memory.verdict.text() and "max model length" in w.memory.verdict.text()
    # llama.cpp's name in the subtitle, the Hugging Face class in its tooltip
    assert w.plan_panel.subtitle.text().startswith("llama ·")
    assert "LlamaForCausalLM" in w.plan_panel.subtitle.toolTip()
    # the table judges it too
    model = w.table.model
    row = next(i for i, e in enumerate(model.entries) if e.name == "hf-llama")
    qtbot.waitUntil(
        lambda: model.data(model.index(row, FIT_COLUMN)) == BADGE_TEXT[Badge.FITS], timeout=10_000
    )
    # vllm is not installed: Start starts nothing and says what to install
    assert o.missing is not None and "pip install vllm" in o.missing
    assert "pip install vllm" in w.start_button.toolTip()
    assert w.start_engine() is None
    assert "pip install vllm" in w.statusBar().currentMessage()
    assert not w.engine_runner.engines


def test_missing_engine_names_the_kind_s_install(tmp_path: Path) -> None:
    exe = tmp_path / "vllm"
    target = Target("vllm", str(exe), None, "test")
    assert "pip install vllm" in (missing_engine(target) or "")
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert missing_engine(target) is None
    llama = Target("llama", "no-such-llama-server-here", None, "test")
    assert "llama.cpp release" in (missing_engine(llama) or "")
