"""vLLM emitter: `vllm serve PATH` + the plan's flags, framed and merged with extra arguments."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit import DevicePin
from qmgui.core.emit.vllm import emit_vllm
from qmgui.core.units import GIB
from qmgui.core.vllm import VllmPins, VllmPlan, plan_vllm
from tests.core.test_emit_llama import assert_golden, command_text
from tests.synth.factory import PRESETS, write_gguf, write_hf_folder, write_split

VLLM = "/opt/vllm/bin/vllm"


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_gguf(root / "qwen3.gguf", PRESETS["qwen3"])
    write_split(root / "split", PRESETS["llama"], n_shards=2)
    write_hf_folder(root / "Llama 3 hf")
    return root


def entry(path: Path) -> ModelEntry:
    e = entry_for_path(path)
    assert e.meta is not None, e.error
    return e


def plan(e: ModelEntry, pins: VllmPins | None = None, gpus: int = 1) -> VllmPlan:
    assert e.meta is not None
    return plan_vllm(
        e.meta,
        gpu_total_bytes=24 * GIB,
        budget_bytes=22 * GIB,
        tensor_parallel=gpus,
        pins=pins or VllmPins(),
        is_split_gguf=len(e.shards) > 1,
    )


def test_golden_gguf(models: Path) -> None:
    e = entry(models / "qwen3.gguf")
    cmd = emit_vllm(e, plan(e), executable=VLLM, port=8000)
    assert cmd.argv[:3] == (VLLM, "serve", str(models / "qwen3.gguf"))
    assert cmd.argv[cmd.argv.index("--quantization") + 1] == "gguf"
    assert cmd.argv[cmd.argv.index("--tool-call-parser") + 1] == "hermes"
    assert cmd.argv[cmd.argv.index("--served-model-name") + 1] == "qwen3"
    assert "--tokenizer" not in cmd.argv  # never guessed
    assert_golden("emit_vllm_gguf.txt", command_text(cmd), models)


def test_golden_hf_folder_tensor_parallel(models: Path) -> None:
    e = entry(models / "Llama 3 hf")
    cmd = emit_vllm(
        e,
        plan(e, gpus=2),
        executable=VLLM,
        port=8000,
        devices=DevicePin("cuda", (0, 1)),
        served_model_name="llama3",
    )
    assert "--quantization" not in cmd.argv  # an HF folder names its own
    assert cmd.argv[cmd.argv.index("--tensor-parallel-size") + 1] == "2"
    assert cmd.env == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert_golden("emit_vllm_hf_tp2.txt", command_text(cmd), models)


def test_split_gguf_gives_no_command_and_the_reason(models: Path) -> None:
    e = entry(models / "split" / "synth-llama-00001-of-00002.gguf")
    cmd = emit_vllm(e, plan(e), executable=VLLM, port=8000)
    assert not cmd.runnable
    assert "split GGUF" in cmd.warnings[0] and "llama-gguf-split --merge" in cmd.warnings[0]


def test_tool_call_parser_pin_and_none(models: Path) -> None:
    e = entry(models / "qwen3.gguf")
    pinned = emit_vllm(e, plan(e, VllmPins(tool_call_parser="qwen3_xml")), executable=VLLM, port=1)
    assert pinned.argv[pinned.argv.index("--tool-call-parser") + 1] == "qwen3_xml"
    off = emit_vllm(e, plan(e, VllmPins(tool_call_parser="none")), executable=VLLM, port=1)
    assert "--tool-call-parser" not in off.argv and "--enable-auto-tool-choice" not in off.argv


def test_tokenizer_only_when_pinned(models: Path) -> None:
    e = entry(models / "qwen3.gguf")
    cmd = emit_vllm(e, plan(e, VllmPins(tokenizer="Qwen/Qwen3-4B")), executable=VLLM, port=1)
    assert cmd.argv[cmd.argv.index("--tokenizer") + 1] == "Qwen/Qwen3-4B"


def test_extra_arguments_win_over_derived_memory_flags(models: Path) -> None:
    e = entry(models / "qwen3.gguf")
    extra = ("--gpu_memory_utilization", "0.5", "--max-model-len=2048", "--tool-call-parser", "x")
    p = plan(e, VllmPins(extra_args=extra))
    cmd = emit_vllm(e, p, executable=VLLM, port=1, extra_args=extra)
    assert cmd.argv[-len(extra) :] == extra  # theirs, last, once
    assert cmd.argv.count("--max-model-len=2048") == 1
    assert "--max-model-len" not in cmd.argv  # the derived one is dropped
    assert "--kv-cache-memory-bytes" not in cmd.argv and "--gpu-memory-utilization" not in cmd.argv
    assert "--enable-auto-tool-choice" not in cmd.argv
    assert any("--max-model-len replaces the derived --max-model-len" in w for w in cmd.warnings)
    # a plan made without the extra arguments gives the same command
    same = emit_vllm(e, plan(e), executable=VLLM, port=1, extra_args=extra)
    assert same.argv == cmd.argv
