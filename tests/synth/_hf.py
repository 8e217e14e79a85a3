"""Hugging Face model folders: ``config.json`` plus hand-written safetensors.

The safetensors layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian
header length N, N bytes of JSON (``{"__metadata__": {...}, name: {"dtype", "shape",
"data_offsets": [begin, end]}}`` with offsets relative to the end of the header, padded with
spaces to a multiple of 8), then the tensor bytes back to back. Tensor data are zeros.

Sharded folders use ``model-0000K-of-0000N.safetensors`` and ``model.safetensors.index.json``
(``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``), as ``transformers`` writes.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

_DTYPES = {"BF16": ("bfloat16", 2), "F16": ("float16", 2), "F32": ("float32", 4)}

_TEXT_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
    "vocab_size": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "sliding_window": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# architecture -> (model_type, text-config overrides)
_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "LlamaForCausalLM": ("llama", {"rope_theta": 500000.0}),
    "MistralForCausalLM": ("mistral", {"rope_theta": 1000000.0}),
    "Qwen2ForCausalLM": (
        "qwen2",
        {"rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "use_sliding_window": False,
         "sliding_window": 32768, "max_window_layers": 2},
    ),
    "Qwen3ForCausalLM": ("qwen3", {"head_dim": 32, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}),
    "Qwen3MoeForCausalLM": (
        "qwen3_moe",
        {"head_dim": 32, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "num_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True},
    ),
    "Gemma3ForCausalLM": (
        "gemma3_text",
        {"head_dim": 32, "num_key_value_heads": 1, "sliding_window": 128,
         "sliding_window_pattern": 6, "num_hidden_layers": 6, "rope_theta": 1000000.0,
         "rope_local_base_freq": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
         "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 32,
         "max_position_embeddings": 32768},
    ),
}  # fmt: skip

_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "image_size": 64,
    "patch_size": 8,
    "num_channels": 3,
    "layer_norm_eps": 1e-6,
}


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _family(architecture: str) -> tuple[str, dict[str, Any]]:
    """Text model_type and config overrides for an architecture name."""
    if architecture in _FAMILIES:
        return _FAMILIES[architecture]
    causal = architecture.replace("ForConditionalGeneration", "ForCausalLM")
    if causal in _FAMILIES:
        return _FAMILIES[causal]
    if architecture.endswith("ForConditionalGeneration"):
        return "llama", {}  # LLaVA-style wrappers around a llama text model
    return architecture.split("For", 1)[0].lower(), {}


def build_config(
    architecture: str, config: dict[str, Any] | None, dtype: str, nested: bool
) -> dict[str, Any]:
    """The ``config.json`` dict (text settings nested under ``text_config`` when ``nested``)."""
    torch_dtype = _DTYPES[dtype][0]
    model_type, overrides = _family(architecture)
    text = {**_TEXT_DEFAULTS, **overrides, "model_type": model_type, "torch_dtype": torch_dtype}
    cfg: dict[str, Any] = {"architectures": [architecture]}
    if not nested:
        cfg.update(text)
    elif not architecture.endswith("ForConditionalGeneration"):
        cfg.update({"model_type": model_type, "torch_dtype": torch_dtype, "text_config": text})
    else:
        gemma = model_type.startswith("gemma3")
        cfg.update(
            {
                "model_type": "gemma3" if gemma else architecture.split("For", 1)[0].lower(),
                "torch_dtype": torch_dtype,
                "text_config": text,
                "vision_config": {
                    **_VISION_DEFAULTS,
                    "model_type": "siglip_vision_model" if gemma else "clip_vision_model",
                },
                "image_token_index": 3,
            }
        )
    return _deep_merge(cfg, config or {})


def _text_tensors(tc: dict[str, Any], prefix: str) -> list[tuple[str, list[int]]]:
    h, n_layer = tc["hidden_size"], tc["num_hidden_layers"]
    nh, nkv = tc["num_attention_heads"], tc.get("num_key_value_heads", tc["num_attention_heads"])
    hd = tc.get("head_dim") or h // nh
    ff, vocab, mt = tc["intermediate_size"], tc["vocab_size"], tc.get("model_type", "")
    qk_norm = mt.startswith(("qwen3", "gemma3"))
    bias = mt == "qwen2" or bool(tc.get("attention_bias"))
    n_exp = tc.get("num_experts", 0) or 0
    out: list[tuple[str, list[int]]] = [(f"{prefix}embed_tokens.weight", [vocab, h])]
    for i in range(n_layer):
        b = f"{prefix}layers.{i}."
        out += [
            (b + "input_layernorm.weight", [h]),
            (b + "self_attn.q_proj.weight", [nh * hd, h]),
            (b + "self_attn.k_proj.weight", [nkv * hd, h]),
            (b + "self_attn.v_proj.weight", [nkv * hd, h]),
            (b + "self_attn.o_proj.weight", [h, nh * hd]),
            (b + "post_attention_layernorm.weight", [h]),
        ]
        if bias:
            out += [
                (b + "self_attn.q_proj.bias", [nh * hd]),
                (b + "self_attn.k_proj.bias", [nkv * hd]),
                (b + "self_attn.v_proj.bias", [nkv * hd]),
            ]
        if qk_norm:
            out += [(b + "self_attn.q_norm.weight", [hd]), (b + "self_attn.k_norm.weight", [hd])]
        if mt.startswith("gemma3"):
            out += [
                (b + "pre_feedforward_layernorm.weight", [h]),
                (b + "post_feedforward_layernorm.weight", [h]),
            ]
        if n_exp:
            mff = tc.get("moe_intermediate_size", ff)
            out.append((b + "mlp.gate.weight", [n_exp, h]))
            for e in range(n_exp):
                eb = f"{b}mlp.experts.{e}."
                out += [
                    (eb + "gate_proj.weight", [mff, h]),
                    (eb + "up_proj.weight", [mff, h]),
                    (eb + "down_proj.weight", [h, mff]),
                ]
        else:
            out += [
                (b + "mlp.gate_proj.weight", [ff, h]),
                (b + "mlp.up_proj.weight", [ff, h]),
                (b + "mlp.down_proj.weight", [h, ff]),
            ]
    out.append((f"{prefix}norm.weight", [h]))
    return out


def _vision_tensors(vc: dict[str, Any], text_h: int, gemma: bool) -> list[tuple[str, list[int]]]:
    h, ff, n_layer = vc["hidden_size"], vc["intermediate_size"], vc["num_hidden_layers"]
    patch, n_pos = vc["patch_size"], (vc["image_size"] // vc["patch_size"]) ** 2
    p = "vision_tower.vision_model."
    out: list[tuple[str, list[int]]] = [
        (p + "embeddings.patch_embedding.weight", [h, vc.get("num_channels", 3), patch, patch]),
        (p + "embeddings.patch_embedding.bias", [h]),
        (p + "embeddings.position_embedding.weight", [n_pos, h]),
    ]
    for i in range(n_layer):
        b = f"{p}encoder.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(f"{b}self_attn.{proj}.weight", [h, h]), (f"{b}self_attn.{proj}.bias", [h])]
        for ln in ("layer_norm1", "layer_norm2"):
            out += [(f"{b}{ln}.weight", [h]), (f"{b}{ln}.bias", [h])]
        out += [
            (b + "mlp.fc1.weight", [ff, h]),
            (b + "mlp.fc1.bias", [ff]),
            (b + "mlp.fc2.weight", [h, ff]),
            (b + "mlp.fc2.bias", [h]),
        ]
    out += [(p + "post_layernorm.weight", [h]), (p + "post_layernorm.bias", [h])]
    if gemma:
        out += [
            ("multi_modal_projector.mm_input_projection_weight", [h, text_h]),
            ("multi_modal_projector.mm_soft_emb_norm.weight", [h]),
        ]
    else:
        out += [
            ("multi_modal_projector.linear_1.weight", [text_h, h]),
            ("multi_modal_projector.linear_1.bias", [text_h]),
            ("multi_modal_projector.linear_2.weight", [text_h, text_h]),
            ("multi_modal_projector.linear_2.bias", [text_h]),
        ]
    return out


def write_safetensors(
    path: Path, tensors: list[tuple[str, list[int]]], dtype: str, metadata: dict[str, str]
) -> int:
    """Write one safetensors file of zero-filled tensors; returns the data size in bytes."""
    itemsize = _DTYPES[dtype][1]
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, shape in tensors:
        n = itemsize
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.write(bytes(offset))
    return offset


def write_hf_folder(
    dir: str | Path,
    *,
    architecture: str = "LlamaForCausalLM",
    config: dict[str, Any] | None = None,
    dtype: str = "BF16",
    n_shards: int = 1,
    nested_text_config: bool = False,
) -> Path:
    """Write a Hugging Face model folder and return its path.

    ``config`` is deep-merged over the defaults for ``architecture`` (for a nested config,
    pass ``{"text_config": {...}}``). ``*ForConditionalGeneration`` architectures always nest
    the text settings under ``text_config`` and add a ``vision_config`` and vision tensors.
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}")
    if n_shards < 1:
        raise ValueError("n_shards must be >= 1")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    multimodal = architecture.endswith("ForConditionalGeneration")
    nested = nested_text_config or multimodal
    cfg = build_config(architecture, config, dtype, nested)
    text = cfg["text_config"] if nested else cfg
    prefix = "language_model.model." if nested else "model."
    tensors = _text_tensors(text, prefix)
    if not text.get("tie_word_embeddings", False):
        lm_head = "language_model.lm_head.weight" if nested else "lm_head.weight"
        tensors.append((lm_head, [text["vocab_size"], text["hidden_size"]]))
    if multimodal:
        gemma = cfg.get("model_type") == "gemma3"
        tensors += _vision_tensors(cfg["vision_config"], text["hidden_size"], gemma)

    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    meta = {"format": "pt"}
    if n_shards == 1:
        write_safetensors(out / "model.safetensors", tensors, dtype, meta)
        return out
    if n_shards > len(tensors):
        raise ValueError(f"only {len(tensors)} tensors to shard")
    base, extra = divmod(len(tensors), n_shards)
    weight_map: dict[str, str] = {}
    total, start = 0, 0
    for k in range(n_shards):
        count = base + (1 if k < extra else 0)
        chunk = tensors[start : start + count]
        start += count
        fname = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        total += write_safetensors(out / fname, chunk, dtype, meta)
        weight_map.update({name: fname for name, _ in chunk})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out
