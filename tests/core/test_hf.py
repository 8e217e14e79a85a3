"""Hugging Face folders: config.json mapping (nested text_config) and safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from qmgui.core.errors import ModelReadError
from qmgui.core.hf import (
    SafetensorsHeader,
    classify_hf,
    is_hf_llm_config,
    meta_from_hf,
    read_config,
    read_safetensors_header,
)
from qmgui.core.meta import ModelClass, TensorEntry


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, list[int], int]], *, pad_data: int = 0
) -> Path:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (off + pad_data))
    return path


def test_safetensors_header_exact_bytes(tmp_path: Path) -> None:
    p = write_safetensors(
        tmp_path / "m.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [100, 16], 3200),
            "model.layers.0.self_attn.q_proj.weight": ("F8_E4M3", [16, 16], 256),
        },
    )
    h = read_safetensors_header(p)
    assert h.tensors == (
        TensorEntry("model.embed_tokens.weight", "BF16", (100, 16), 3200),
        TensorEntry("model.layers.0.self_attn.q_proj.weight", "F8_E4M3", (16, 16), 256),
    )
    assert h.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\1\2", "not a safetensors file"),
        (struct.pack("<Q", 1 << 40) + b"{}", "truncated"),
        (struct.pack("<Q", 4) + b"nope", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_bad_safetensors(tmp_path: Path, content: bytes, words: str) -> None:
    p = tmp_path / "bad.safetensors"
    p.write_bytes(content)
    with pytest.raises(ModelReadError, match=words):
        read_safetensors_header(p)


def test_truncated_safetensors_data(tmp_path: Path) -> None:
    p = write_safetensors(tmp_path / "m.safetensors", {"w": ("F32", [4, 4], 64)})
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(ModelReadError, match="truncated"):
        read_safetensors_header(p)


def test_bad_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ModelReadError, match="not valid JSON"):
        read_config(tmp_path / "config.json")


@pytest.mark.parametrize(
    ("cfg", "llm"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, True),
        ({"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {}}, True),
        ({"architectures": ["Qwen2VLForConditionalGeneration"], "vision_config": {}}, True),
        ({"architectures": ["T5ForConditionalGeneration"]}, False),
        ({"architectures": ["WhisperForConditionalGeneration"]}, False),
        ({"architectures": ["ModernBertForSequenceClassification"]}, False),
        ({"architectures": "LlamaForCausalLM"}, False),
        ({}, False),
    ],
)
def test_llm_folder_rule(cfg: dict[str, object], llm: bool) -> None:
    assert is_hf_llm_config(cfg) is llm


def test_whisper_is_asr() -> None:
    assert classify_hf({"architectures": ["WhisperForConditionalGeneration"]}) == ModelClass.ASR


def test_nested_text_config_wins() -> None:
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 6,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "max_position_embeddings": 131072,
            "sliding_window": 1024,
            "vocab_size": 262208,
            "intermediate_size": 10240,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        },
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
    }
    shard = SafetensorsHeader(
        "x",
        (
            TensorEntry("language_model.model.layers.0.mlp.up_proj.weight", "BF16", (10, 10), 200),
            TensorEntry(
                "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight", "BF16", (10, 10), 200
            ),
        ),
        {},
    )
    m = meta_from_hf(cfg, [shard], name="g", model_class=ModelClass.LLM)
    assert (m.n_layer, m.n_embd, m.head_dim_k, m.context_length) == (6, 2560, 256, 131072)
    assert m.n_head_kv == (4,) * 6
    assert m.swa_layers == (True,) * 5 + (False,)
    assert m.sliding_window == 1024
    assert m.quant == "BF16"
    assert m.weight_bytes == 400
    assert m.bytes_per_layer[0] == 200  # the vision tower's layer 0 is not the LM's
    assert m.param_count == 200


def test_hybrid_layer_types_carry_no_kv() -> None:
    cfg = {
        "architectures": ["Qwen3NextForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    }
    m = meta_from_hf(cfg, [], name="q", model_class=ModelClass.LLM)
    assert m.n_head_kv == (0, 0, 0, 2)
    assert m.recurrent_layers == (True, True, True, False)


def test_layer_types_of_wrong_length_are_ignored() -> None:
    cfg = {
        "architectures": ["XForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "layer_types": ["linear_attention"],
    }
    m = meta_from_hf(cfg, [], name="x", model_class=ModelClass.LLM)
    assert m.n_head_kv == (4,) * 4
    assert m.warnings


def test_mla_and_quant_method() -> None:
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "quantization_config": {"quant_method": "fp8"},
    }
    m = meta_from_hf(cfg, [], name="d", model_class=ModelClass.LLM)
    assert m.mla is not None
    assert (m.mla.kv_lora_rank, m.mla.rope_dim, m.mla.key_length_mla) == (512, 64, 192)
    assert (m.n_expert, m.n_expert_used, m.n_expert_shared, m.leading_dense_layers) == (
        256,
        8,
        1,
        3,
    )
    assert m.quant == "FP8"


@pytest.mark.parametrize(
    ("architecture", "preset", "config"),
    [
        ("LlamaForCausalLM", "llama", {}),
        ("Qwen3ForCausalLM", "qwen3", {"max_position_embeddings": 40960}),
        ("Gemma3ForCausalLM", "gemma3", {}),
    ],
)
def test_the_hf_mapping_matches_the_same_models_gguf(
    tmp_path: Path, architecture: str, preset: str, config: dict[str, int]
) -> None:
    """Reference 001: config.json maps onto the same shape the GGUF header gives, so the vLLM
    sizing of a folder and of its conversion agree (sliding-window layers aside: a folder
    charges them as full attention, on purpose)."""
    from qmgui.core.discovery import entry_for_path
    from qmgui.core.units import GIB
    from qmgui.core.vllm import plan_vllm
    from tests.synth.factory import PRESETS, write_gguf, write_hf_folder

    gguf = entry_for_path(write_gguf(tmp_path / f"{preset}.gguf", PRESETS[preset])).meta
    hf = entry_for_path(
        write_hf_folder(tmp_path / f"hf-{preset}", architecture=architecture, config=config)
    ).meta
    assert gguf is not None and hf is not None
    assert (hf.format, gguf.format) == ("hf", "gguf")
    for field in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim_k", "head_dim_v",
                  "context_length", "model_class"):  # fmt: skip
        assert getattr(hf, field) == getattr(gguf, field), field
    g = plan_vllm(gguf, gpu_total_bytes=24 * GIB, budget_bytes=20 * GIB).breakdown
    h = plan_vllm(hf, gpu_total_bytes=24 * GIB, budget_bytes=20 * GIB).breakdown
    assert g is not None and h is not None
    # every layer's KV per token is the same; the GGUF's sliding layers are capped at the window
    assert h.kv_per_token.nbytes == g.kv_per_token.nbytes + g.swa_per_token.nbytes
    assert h.sliding_layers == 0 and h.attention_layers == gguf.n_layer
    assert (g.sliding_layers > 0) == (preset == "gemma3")
