"""llama.cpp router presets: golden file, read back by llama.cpp's own INI rules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import DevicePin
from qmgui.core.export.models_ini import PresetModel, preset_options, render_models_ini
from qmgui.core.launch import LaunchSettings
from tests.core.test_emit_llama import assert_golden
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_mmproj

# common/preset.cpp's grammar: a header `[name]`, `key = value` with key
# [a-zA-Z_][a-zA-Z0-9_.-]*, the value ending at optional spaces then ; # or the line end,
# comment lines starting with ; or #, blank lines
_HEADER = re.compile(r"^[ \t]*\[[ \t]*([^]]+?)[ \t]*\][ \t]*(?:[;#].*)?$")
_KV = re.compile(r"^[ \t]*([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?$")
_SKIP = re.compile(r"^[ \t]*(?:[;#].*)?$")


def read_ini(text: str) -> dict[str, dict[str, str]]:
    """Sections -> keys -> values, as llama.cpp's parser reads them (every line must parse)."""
    sections: dict[str, dict[str, str]] = {"": {}}
    current = ""
    for line in text.lstrip("\ufeff").split("\n"):
        if m := _HEADER.match(line):
            current = m.group(1)
            assert current not in sections, f"section [{current}] twice"
            sections[current] = {}
        elif m := _KV.match(line):
            # the value stops at the first ; or # (with or without spaces before it)
            value = re.split(r"[ \t]*[;#]", m.group(2), maxsplit=1)[0]
            sections[current][m.group(1)] = value
        else:
            assert _SKIP.match(line), f"llama.cpp cannot parse {line!r}"
    return sections


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "My Models"
    write_gguf(root / "gemma3" / "synth-gemma3.gguf", PRESETS["gemma3"])
    write_mmproj(root / "gemma3" / "mmproj-synth-gemma3.gguf")
    write_gguf(root / "qwen3moe.gguf", PRESETS["qwen3moe"])
    write_gguf(root / "bad;name" / "m.gguf", PRESETS["llama"])
    write_hf_folder(root / "hf-llama")
    return root


def entry(path: Path) -> ModelEntry:
    e = entry_for_path(path)
    assert e.meta is not None
    return e


def test_golden_and_read_back(models: Path) -> None:
    items = [
        PresetModel(
            name="gemma3",
            model=entry(models / "gemma3" / "synth-gemma3.gguf"),
            settings=LaunchSettings(ctx_size=8192, parallel=2, kv_unified=False, mmap=False,
                                    kv_offload=False, cache_type_k="q8_0", flash_attn="on"),
            devices=DevicePin("cuda", (0, 1)),
            extra_args=("--jinja", "--temp", "0.7", "--alias=g3", "--chat-template-file=t.jinja"),
            comments=("estimated VRAM: GPU0 1 GiB",),
        ),
        PresetModel(name="qwen3 [moe]", model=entry(models / "qwen3moe.gguf"),
                    settings=LaunchSettings(n_cpu_moe=2, n_gpu_layers=-1)),
        PresetModel(name="hf", model=entry(models / "hf-llama")),
        PresetModel(name="bad", model=entry(models / "bad;name" / "m.gguf")),
    ]  # fmt: skip
    result = render_models_ini(items, header=("written by a test",))
    assert_golden("models.ini", result.text, models)
    ini = read_ini(result.text)
    assert ini[""] == {"version": "1"}
    gemma = ini["gemma3"]
    assert gemma["model"] == str(models / "gemma3" / "synth-gemma3.gguf")
    assert gemma["mmproj"].endswith("mmproj-synth-gemma3.gguf")
    assert gemma["ctx-size"] == "8192" and gemma["parallel"] == "2"
    assert gemma["no-kv-unified"] == "true" and gemma["no-mmap"] == "true"
    assert gemma["no-kv-offload"] == "true"
    assert gemma["device"] == "CUDA0,CUDA1"  # a preset has no per-model environment
    assert gemma["flash-attn"] == "on" and gemma["fit"] == "off" and gemma["verbosity"] == "4"
    assert gemma["jinja"] == "true" and gemma["temp"] == "0.7"
    assert gemma["chat-template-file"] == "t.jinja"
    assert "host" not in gemma and "port" not in gemma and "alias" not in gemma
    assert ini["qwen3 (moe)"]["n-cpu-moe"] == "2"
    assert set(ini) == {"", "gemma3", "qwen3 (moe)"}
    reasons = "\n".join(result.warnings)
    assert "hf: left out of models.ini" in reasons and "GGUF files only" in reasons
    assert "bad: left out of models.ini" in reasons and "ends at ';' or '#'" in reasons
    assert "gemma3: left out alias = g3: the router sets it" in reasons


def test_build_spelling_and_unsupported_flags(models: Path) -> None:
    item = PresetModel(
        name="q", model=entry(models / "qwen3moe.gguf"), settings=LaunchSettings(mmap=False)
    )
    pairs, warnings = preset_options(
        item, supported_flags=frozenset({"-m", "--model", "-c", "-lm", "--load-mode"})
    )
    # the long spelling when the build has one, else the one it has
    assert pairs == [
        ("model", str(models / "qwen3moe.gguf")),
        ("c", "40960"),
        ("load-mode", "none"),
    ]
    assert any(w.startswith("left out -fa auto") for w in warnings)
