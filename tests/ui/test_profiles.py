"""Profiles in the window: a change is saved for the model, shown again after another model,
in a new window and on the command line; Reset to defaults clears it (Undo brings it back);
"Paste command…" reads a llama-server command into a model's profile."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QCheckBox

from qmgui.core.discovery import entry_for_path
from qmgui.settings import ModelOverride, RunSet, load_settings
from qmgui.ui.main_window import MainWindow
from qmgui.ui.planning import PlanOutcome
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder
from tests.ui.conftest import settle


def saved(model: Path) -> ModelOverride | None:
    return load_settings().settings.model_overrides.get(str(model))


def select(qtbot, w: MainWindow, name: str) -> None:  # type: ignore[no-untyped-def]
    assert w.table.select_name(name)
    settle(qtbot, w)
    assert w.outcome is not None and name in w.outcome.entry.name


def test_profile_round_trip(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    model = models / "tiny-llama.gguf"
    assert entry_for_path(model).id == str(model)
    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    assert w.plan_panel.ctx_spin.value() == 4096  # the trained context (< 8192)
    assert "nothing saved" in w.profiles.bar.label.text()
    # change it in the window: saved (debounced, on a worker) for this model only
    w.plan_panel.ctx_spin.setValue(2048)
    w.plan_panel.ctk.setCurrentText("bf16")
    w.plan_panel.extra_args_edit.setText("--jinja --temp 0.5")
    qtbot.waitUntil(lambda: (ov := saved(model)) is not None and ov.extra_args != [], timeout=5000)
    ov = saved(model)
    assert ov is not None
    assert (ov.ctx_size, ov.cache_type_k, ov.extra_args) == (2048, "bf16", ["--jinja --temp 0.5"])
    assert ov.parallel is None and ov.flash_attn is None  # only what differs from the defaults
    bar = w.profiles.bar.label.text()
    assert "context 2,048" in bar and "K cache bf16" in bar
    settle(qtbot, w)
    text = w.preview.text.toPlainText()
    assert "-c 2048" in text and text.count("--jinja") == 1  # saved and shown: written once

    # another model starts at its own defaults; coming back shows the saved values
    select(qtbot, w, "tiny-qwen3")
    assert w.plan_panel.ctk.currentText() == "f16"
    assert w.plan_panel.extra_args() == ""
    select(qtbot, w, "tiny-llama")
    assert w.plan_panel.ctx_spin.value() == 2048
    assert w.plan_panel.ctk.currentText() == "bf16"
    assert w.plan_panel.extra_args() == "--jinja --temp 0.5"

    # a new window (the file as saved) shows it too
    again = MainWindow(load_settings(), probe=False, tray=False)
    qtbot.addWidget(again)
    again.start()
    settle(qtbot, again)
    select(qtbot, again, "tiny-llama")
    assert again.plan_panel.ctx_spin.value() == 2048
    assert again.plan_panel.extra_args() == "--jinja --temp 0.5"
    again.close()
    again.shutdown()

    # Reset to defaults clears it, in the window and in the file; Undo brings it back
    assert w.profiles.bar.reset_button.isEnabled()
    w.profiles.bar.reset_button.click()
    assert w.plan_panel.ctx_spin.value() == 4096
    assert w.plan_panel.ctk.currentText() == "f16" and w.plan_panel.extra_args() == ""
    assert w.profiles.bar.undo_button.isVisible()
    qtbot.waitUntil(lambda: saved(model) is None, timeout=5000)
    settle(qtbot, w)
    assert "-c 4096" in w.preview.text.toPlainText()
    w.profiles.bar.undo_button.click()
    assert w.plan_panel.ctx_spin.value() == 2048
    qtbot.waitUntil(lambda: (ov := saved(model)) is not None and ov.ctx_size == 2048, timeout=5000)


def test_the_last_change_is_saved_when_the_window_closes(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    model = models / "tiny-llama.gguf"
    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    w.plan_panel.slots.setValue(3)
    w.close()  # before the save delay ran out
    w.shutdown()
    ov = saved(model)
    assert ov is not None and ov.parallel == 3


def test_paste_command_saves_into_the_profile(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    model = models / "tiny-llama.gguf"
    w = make_window([str(models)])
    settle(qtbot, w)
    select(qtbot, w, "tiny-qwen3")
    dialog = w.profiles.open_paste(
        f"llama-server -m '{model}' -c 1024 -ctk bf16 --jinja --host 0.0.0.0"
    )
    report = dialog.report.text()
    assert "(in the library)" in report and "context 1,024" in report
    assert "Kept as extra arguments: --jinja" in report and "--host 0.0.0.0 dropped" in report
    dialog.accept()
    # the model it names is selected and shows the pasted values
    settle(qtbot, w)
    assert w.plan_panel.entry is not None and w.plan_panel.entry.id == str(model)
    assert w.plan_panel.ctx_spin.value() == 1024
    assert w.plan_panel.extra_args() == "--jinja"
    qtbot.waitUntil(lambda: (ov := saved(model)) is not None and ov.ctx_size == 1024, timeout=5000)
    ov = saved(model)
    assert ov is not None and ov.cache_type_k == "bf16" and ov.extra_args == ["--jinja"]
    # a command that cannot be read says why and cannot be saved
    bad = w.profiles.open_paste("llama-server -m x.gguf -c")
    assert "-c needs a value" in bad.report.text()
    assert not bad.buttons.buttons()[0].isEnabled()
    bad.reject()


def test_run_sets_start_each_model_with_its_profile(  # type: ignore[no-untyped-def]
    qtbot, make_window, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = str(models / "tiny-llama.gguf")
    w = make_window([str(models)])
    settle(qtbot, w)
    ov = ModelOverride(ctx_size=2048, cache_type_k="bf16", devices=[0], extra_args=["--jinja"])
    w.set_settings_in_memory(
        w.settings.model_copy(
            update={
                "model_overrides": {model: ov},
                "run_sets": [RunSet(name="pair", model_ids=[model])],
            }
        )
    )
    started: list[PlanOutcome] = []
    monkeypatch.setattr(w.engine_runner, "start", lambda o, *_a, **_k: started.append(o))
    w.fleet.start_run_set("pair")
    qtbot.waitUntil(lambda: bool(started), timeout=10_000)
    argv = list(started[0].command.argv)
    assert argv[argv.index("-c") + 1] == "2048" and argv[argv.index("-ctk") + 1] == "bf16"
    assert argv[argv.index("--device") + 1] == "CUDA0"
    assert argv.count("--jinja") == 1
    w.fleet.wait()


def test_a_hugging_face_model_shows_its_vllm_fields(qtbot, make_window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "hf"
    folder = write_hf_folder(root / "hf-llama")
    write_gguf(root / "tiny-llama.gguf", PRESETS["llama"])
    w = make_window([str(root)])
    settle(qtbot, w)
    select(qtbot, w, "hf-llama")
    box = w.profiles.vllm_box
    assert box.isVisible() and not w.plan_panel.ctk.isVisible()
    assert not w.plan_panel.fit_button.isVisible()
    box.util.setValue(0.5)
    box.parser.setCurrentText("hermes")
    box.tp.setValue(1)
    settle(qtbot, w)
    text = w.preview.text.toPlainText()
    assert "--gpu-memory-utilization 0.5" in text and "--tool-call-parser hermes" in text
    qtbot.waitUntil(
        lambda: (ov := saved(folder)) is not None and ov.tool_call_parser == "hermes",
        timeout=5000,
    )
    ov = saved(folder)
    assert ov is not None and ov.gpu_memory_utilization == 0.5 and ov.tensor_parallel_size == 1
    # a GGUF model shows the llama.cpp knobs again; coming back shows the saved vLLM fields
    select(qtbot, w, "tiny-llama")
    assert not box.isVisible() and w.plan_panel.ctk.isVisible()
    select(qtbot, w, "hf-llama")
    assert box.util.value() == 0.5 and box.parser.currentText() == "hermes"
    # a pasted `vllm serve org/repo` (a name, not a path here) is for the selected model
    dialog = w.profiles.open_paste("vllm serve org/repo --max-model-len 2048 -tp 2 --seed 1")
    assert "(selected; org/repo is not on this machine)" in dialog.report.text()
    dialog.accept()
    assert w.plan_panel.ctx_spin.value() == 2048 and box.tp.value() == 2
    assert box.parser.currentText() == ""  # the command is the whole launch
    qtbot.waitUntil(lambda: bool((ov := saved(folder)) and ov.ctx_size == 2048), timeout=5000)
    ov = saved(folder)
    assert ov is not None and ov.extra_args == ["--seed", "1"] and ov.tool_call_parser is None


def test_split_and_gpus_are_saved_on_two_gpus(qtbot, make_window, models: Path) -> None:  # type: ignore[no-untyped-def]
    model = models / "tiny-llama.gguf"
    w = make_window([str(models)], hardware_choice="2× RTX 3090")
    settle(qtbot, w)
    select(qtbot, w, "tiny-llama")
    w.plan_panel.split.setText("3,1")
    qtbot.waitUntil(lambda: bool((ov := saved(model)) and ov.tensor_split), timeout=5000)
    ov = saved(model)
    assert ov is not None and ov.tensor_split == [3.0, 1.0] and ov.devices is None
    boxes = w.plan_panel.gpu_row.findChildren(QCheckBox)
    boxes[1].setChecked(False)  # run on the first GPU only: its split no longer applies
    qtbot.waitUntil(lambda: (ov := saved(model)) is not None and ov.devices == [0], timeout=5000)
    select(qtbot, w, "tiny-qwen3")
    assert all(b.isChecked() for b in w.plan_panel.gpu_row.findChildren(QCheckBox))
    select(qtbot, w, "tiny-llama")
    assert [b.isChecked() for b in w.plan_panel.gpu_row.findChildren(QCheckBox)] == [True, False]
    # a window on one GPU keeps what it cannot show
    w.set_hardware("RTX 4090")
    settle(qtbot, w)
    w.plan_panel.ctx_spin.setValue(1024)
    qtbot.waitUntil(lambda: (ov := saved(model)) is not None and ov.ctx_size == 1024, timeout=5000)
    ov = saved(model)
    assert ov is not None and ov.devices == [0]


def test_the_tool_call_parser_field_suggests_upstream_names_and_takes_any(qtbot) -> None:  # type: ignore[no-untyped-def]
    """Reference 001: nothing probes vLLM for its parsers; the field offers the known names
    and takes any other (a plugin parser is a valid name no probe lists)."""
    from qmgui.ui.profile_actions import VllmBox

    box = VllmBox()
    qtbot.addWidget(box)
    offered = {box.parser.itemText(i) for i in range(box.parser.count())}
    assert {"hermes", "llama3_json", "mistral", "qwen3_coder", "none"} <= offered
    assert box.parser.isEditable()
    box.parser.setCurrentText("my_plugin_parser")
    assert box.values() == {"tool_call_parser": "my_plugin_parser"}
    box.parser.setCurrentText("")
    assert box.values() == {}  # empty: by the model's family
