"""Hugging Face architecture classes named as llama.cpp names them."""

from __future__ import annotations

from dataclasses import replace

from qmgui.core.arch_names import (
    HF_TO_LLAMA_CPP,
    architecture_tooltip,
    display_architecture,
    llama_cpp_arch,
)
from qmgui.core.meta import ModelClass, ModelMeta


def meta(fmt: str, arch: str) -> ModelMeta:
    return ModelMeta(
        format=fmt, architecture=arch, name="m", model_class=ModelClass.LLM, quant="BF16",
        param_count=1, weight_bytes=1, context_length=4096, n_layer=1, n_embd=64,
        n_head=(4,), n_head_kv=(2,), head_dim_k=16, head_dim_v=16,
    )  # fmt: skip


def test_hf_classes_map_to_llama_cpp_names() -> None:
    assert llama_cpp_arch("LlamaForCausalLM") == "llama"
    assert llama_cpp_arch("Qwen3MoeForCausalLM") == "qwen3moe"
    assert llama_cpp_arch("GptOssForCausalLM") == "gpt-oss"
    assert llama_cpp_arch("NoSuchForCausalLM") is None
    # names from llama.cpp's vocabulary only: lower case, no "For…" class names
    assert all(v == v.lower() and "for" not in v for v in HF_TO_LLAMA_CPP.values())


def test_display_and_tooltip() -> None:
    hf = meta("hf", "LlamaForCausalLM")
    assert display_architecture(hf) == "llama"
    tip = architecture_tooltip(hf)
    assert tip is not None and "LlamaForCausalLM" in tip
    unknown = replace(hf, architecture="NoSuchForCausalLM")
    assert display_architecture(unknown) == "NoSuchForCausalLM"
    assert architecture_tooltip(unknown) is None
    gguf = meta("gguf", "llama")
    assert display_architecture(gguf) == "llama" and architecture_tooltip(gguf) is None


def test_every_name_is_one_gguf_knows() -> None:
    import gguf

    assert set(HF_TO_LLAMA_CPP.values()) <= set(gguf.MODEL_ARCH_NAMES.values())
