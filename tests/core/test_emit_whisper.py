"""whisper-server emitter: -m, --host, --port, and the few knobs it has."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import DevicePin
from qmgui.core.emit.whisper import WhisperOptions, emit_whisper
from tests.core.test_emit_llama import assert_golden, command_text

WHISPER = "/opt/whisper.cpp/whisper-server"


def whisper_entry(tmp_path: Path) -> ModelEntry:
    # whisper.cpp's models are ggml .bin files discovery does not read: an entry without meta
    path = tmp_path / "speech" / "ggml-large-v3 turbo.bin"
    path.parent.mkdir()
    path.write_bytes(b"lmgg")
    return ModelEntry(
        id=str(path),
        path=str(path),
        name="ggml-large-v3 turbo",
        format="ggml",
        source="folder",
        size_bytes=4,
    )


def test_golden(tmp_path: Path) -> None:
    e = whisper_entry(tmp_path)
    cmd = emit_whisper(
        e,
        WhisperOptions(threads=8, flash_attn=False),
        executable=WHISPER,
        port=8178,
        devices=DevicePin("cuda", (1,)),
        extra_args="-l auto",
    )
    assert cmd.argv[1:3] == ("-m", e.path)
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert_golden("emit_whisper.txt", command_text(cmd), tmp_path)


def test_defaults_and_flag_replacement(tmp_path: Path) -> None:
    e = whisper_entry(tmp_path)
    cmd = emit_whisper(e, executable=WHISPER, port=1)
    assert cmd.argv == (WHISPER, "-m", e.path, "--host", "127.0.0.1", "--port", "1")
    cpu = emit_whisper(
        e, WhisperOptions(use_gpu=False, flash_attn=True), executable=WHISPER, port=1
    )
    assert "-ng" in cpu.argv and "-fa" in cpu.argv
    swapped = emit_whisper(
        e, WhisperOptions(flash_attn=True), executable=WHISPER, port=1, extra_args="-nfa"
    )
    assert "-fa" not in swapped.argv and swapped.argv[-1] == "-nfa"


def test_unsupported_flag_on_an_old_build(tmp_path: Path) -> None:
    e = whisper_entry(tmp_path)
    old = frozenset({"-m", "--host", "--port", "-t"})
    cmd = emit_whisper(
        e, WhisperOptions(flash_attn=True), executable=WHISPER, port=1, supported_flags=old
    )
    assert "-fa" not in cmd.argv
    assert cmd.warnings == ("left out -fa: this build does not know -fa or --flash-attn",)


def test_an_image_model_is_refused(tmp_path: Path) -> None:
    e = whisper_entry(tmp_path)
    from qmgui.core.discovery import entry_for_path
    from tests.synth.factory import PRESETS, write_gguf

    llm = entry_for_path(write_gguf(tmp_path / "q.gguf", PRESETS["qwen3"]))
    assert emit_whisper(e, executable=WHISPER, port=1).runnable
    cmd = emit_whisper(replace(llm), executable=WHISPER, port=1)
    assert not cmd.runnable and "transcribes speech" in cmd.warnings[0]
