"""Custom engines: a template split into words first, then placeholders filled per word."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import EmitError
from qmgui.core.emit.custom import PLACEHOLDERS, emit_custom
from qmgui.core.launch import LaunchSettings
from tests.core.test_emit_llama import assert_golden, command_text
from tests.synth.factory import PRESETS, write_gguf, write_mmproj

EXE = "/opt/my engine/serve"


@pytest.fixture
def model(tmp_path: Path) -> ModelEntry:
    root = tmp_path / "My Models"
    write_gguf(root / "gemma 3.gguf", PRESETS["gemma3"])
    write_mmproj(root / "mmproj-gemma 3.gguf")
    e = entry_for_path(root / "gemma 3.gguf")
    assert e.meta is not None and e.mmproj is not None
    return e


def test_golden_paths_with_spaces_stay_one_argument(model: ModelEntry, tmp_path: Path) -> None:
    template = (
        "--model {model} --mmproj={mmproj} --listen {host}:{port} -c {ctx} "
        "--name '{name} (local)' --cache {ctk}/{ctv} --fa {fa} --literal {{x}}"
    )
    cmd = emit_custom(
        model,
        template,
        LaunchSettings(ctx_size=8192, cache_type_k="q8_0"),
        executable=EXE,
        port=9000,
        env={"OMP_NUM_THREADS": "8"},
        extra_args="--verbose",
    )
    assert cmd.argv[:3] == (EXE, "--model", model.path)
    assert f"--mmproj={model.mmproj}" in cmd.argv
    assert "127.0.0.1:9000" in cmd.argv
    assert "gemma 3 (local)" in cmd.argv
    assert "{x}" in cmd.argv
    assert cmd.argv[-1] == "--verbose"
    assert_golden("emit_custom.txt", command_text(cmd), tmp_path)


def test_missing_values_drop_their_words(model: ModelEntry) -> None:
    cmd = emit_custom(model, "-ngl {ngl} --slots={parallel} -m {model}", executable=EXE, port=1)
    assert cmd.argv == (EXE, "-m", model.path)
    assert cmd.warnings == (
        "left out -ngl {ngl}: no ngl for this model",
        "left out --slots={parallel}: no parallel for this model",
    )


def test_unknown_placeholder_is_an_error_sentence(model: ModelEntry) -> None:
    with pytest.raises(EmitError) as err:
        emit_custom(model, "-m {model} --gpu {gpu}", executable=EXE, port=1)
    message = str(err.value)
    assert "names {gpu}, which qmgui does not fill" in message
    for name in PLACEHOLDERS:
        assert f"{{{name}}}" in message


def test_template_syntax_errors(model: ModelEntry) -> None:
    with pytest.raises(EmitError, match=r"unmatched '\{' or '\}'.*write \{\{ and \}\}"):
        emit_custom(model, "-m {model", executable=EXE, port=1)
    with pytest.raises(EmitError, match=r"placeholders take no format: write \{ctx\}"):
        emit_custom(model, "-c {ctx:>8}", executable=EXE, port=1)
    with pytest.raises(EmitError, match="cannot split the command template"):
        emit_custom(model, "-m '{model}", executable=EXE, port=1)
    with pytest.raises(EmitError, match="neither an executable nor a command template"):
        emit_custom(model, "", executable="", port=1)


def test_without_executable_the_template_is_the_command(model: ModelEntry) -> None:
    cmd = emit_custom(model, "python -m myserver {model} {port}", executable="", port=7)
    assert cmd.argv == ("python", "-m", "myserver", model.path, "7")
