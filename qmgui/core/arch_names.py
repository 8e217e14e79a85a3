"""One architecture vocabulary: a Hugging Face `config.json` architecture class
("LlamaForCausalLM") named as llama.cpp names the same model ("llama"), as
`convert_hf_to_gguf.py` registers its converters (`@ModelBase.register(...)` → `MODEL_ARCH`).

Pure: no Qt, no I/O. The model table and the plan panel show these names for Hugging Face
folders, with the class itself in a tooltip; an unknown class is shown as it is."""

from __future__ import annotations

from qmgui.core.meta import ModelMeta

# Hugging Face architecture class -> llama.cpp architecture name (gguf's MODEL_ARCH_NAMES)
HF_TO_LLAMA_CPP: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "LlavaForConditionalGeneration": "llama",
    "Mistral3ForConditionalGeneration": "llama",
    "Llama4ForCausalLM": "llama4",
    "Llama4ForConditionalGeneration": "llama4",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen2VLForConditionalGeneration": "qwen2vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2vl",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3moe",
    "Qwen3NextForCausalLM": "qwen3next",
    "Qwen3VLForConditionalGeneration": "qwen3vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3vlmoe",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma3nForConditionalGeneration": "gemma3n",
    "PhiForCausalLM": "phi2",
    "Phi3ForCausalLM": "phi3",
    "PhiMoEForCausalLM": "phimoe",
    "DeepseekForCausalLM": "deepseek",
    "DeepseekV2ForCausalLM": "deepseek2",
    "DeepseekV3ForCausalLM": "deepseek2",
    "GptOssForCausalLM": "gpt-oss",
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeHybridForCausalLM": "granitehybrid",
    "Glm4ForCausalLM": "glm4",
    "Glm4MoeForCausalLM": "glm4moe",
    "CohereForCausalLM": "command-r",
    "Cohere2ForCausalLM": "cohere2",
    "OlmoForCausalLM": "olmo",
    "Olmo2ForCausalLM": "olmo2",
    "OlmoeForCausalLM": "olmoe",
    "StableLmForCausalLM": "stablelm",
    "Starcoder2ForCausalLM": "starcoder2",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gptneox",
    "FalconForCausalLM": "falcon",
    "FalconH1ForCausalLM": "falcon-h1",
    "MambaForCausalLM": "mamba",
    "Mamba2ForCausalLM": "mamba2",
    "JambaForCausalLM": "jamba",
    "NemotronForCausalLM": "nemotron",
    "NemotronHForCausalLM": "nemotron_h",
    "ExaoneForCausalLM": "exaone",
    "Exaone4ForCausalLM": "exaone4",
    "InternLM2ForCausalLM": "internlm2",
    "InternLM3ForCausalLM": "llama",
    "MiniCPMForCausalLM": "minicpm",
    "MiniCPM3ForCausalLM": "minicpm3",
    "Lfm2ForCausalLM": "lfm2",
    "SmolLM3ForCausalLM": "smollm3",
    "Ernie4_5_ForCausalLM": "ernie4_5",
    "Ernie4_5_MoeForCausalLM": "ernie4_5-moe",
    "HunYuanDenseV1ForCausalLM": "hunyuan-dense",
    "HunYuanMoEV1ForCausalLM": "hunyuan-moe",
    "SeedOssForCausalLM": "seed_oss",
    "ArceeForCausalLM": "arcee",
    "BailingMoeForCausalLM": "bailingmoe",
    "Dots1ForCausalLM": "dots1",
    "RWKV7ForCausalLM": "rwkv7",
    "BertModel": "bert",
}


def llama_cpp_arch(hf_architecture: str) -> str | None:
    """llama.cpp's name for a Hugging Face architecture class; None when it has none here."""
    return HF_TO_LLAMA_CPP.get(hf_architecture)


def display_architecture(meta: ModelMeta) -> str:
    """The architecture as the window shows it: llama.cpp's name for GGUFs (as written in the
    file) and for Hugging Face folders whose class llama.cpp converts; else the class."""
    if meta.format == "gguf":
        return meta.architecture
    return llama_cpp_arch(meta.architecture) or meta.architecture


def architecture_tooltip(meta: ModelMeta) -> str | None:
    """The Hugging Face class behind a translated name ("LlamaForCausalLM (config.json)")."""
    if meta.format == "gguf" or display_architecture(meta) == meta.architecture:
        return None
    return f"{meta.architecture} (config.json); llama.cpp calls it {display_architecture(meta)}"
