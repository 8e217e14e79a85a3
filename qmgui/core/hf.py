"""Hugging Face folders: `config.json` and safetensors headers mapped onto `ModelMeta`.

Only headers are read: a safetensors file starts with an 8-byte little-endian length and a
JSON table of tensors (dtype, shape, data offsets), which gives exact weight bytes per dtype
without touching the data. Multimodal wrappers keep the language model's numbers in a nested
`text_config`; those win over the top level.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qmgui.core.errors import ModelReadError
from qmgui.core.meta import MlaDims, ModelClass, ModelMeta, SsmDims, TensorEntry

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # real config.json files are a few KiB
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit

# bytes per element of each safetensors dtype
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}

# config.json architecture suffixes and names that say what a folder is
_LLM_SUFFIXES = ("ForCausalLM", "LMHeadModel")
_ASR_ARCH = re.compile(r"^(Whisper|Wav2Vec2|Hubert|Parakeet|SpeechEncoderDecoder).*")
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")
_NO_KV_LAYER_TYPES = frozenset(
    {"linear_attention", "mamba", "ssm", "mamba2", "conv", "recurrent", "short_conv"}
)


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    tensors: tuple[TensorEntry, ...]
    metadata: Mapping[str, str]


def read_safetensors_header(path: str | os.PathLike[str]) -> SafetensorsHeader:
    """Read the JSON header of one .safetensors file; ModelReadError if it is malformed."""
    fspath = os.fspath(path)
    try:
        with open(fspath, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ModelReadError(fspath, f"only {size} bytes; not a safetensors file", offset=0)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise ModelReadError(
                    fspath,
                    f"header claims {n} bytes but the file has {size}; truncated or not "
                    "safetensors: download it again",
                    offset=0,
                )
            raw = f.read(n)
    except ModelReadError:
        raise
    except OSError as e:
        raise ModelReadError(fspath, f"could not be read ({e.strerror or e})") from e
    try:
        table = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelReadError(fspath, f"header is not valid JSON ({e})", offset=8) from e
    if not isinstance(table, dict):
        raise ModelReadError(fspath, "header is not a JSON object", offset=8)
    data_size = size - 8 - n
    tensors = []
    for name, info in table.items():
        if name == "__metadata__":
            continue
        tensors.append(_safetensors_entry(fspath, name, info, data_size))
    md = table.get("__metadata__") or {}
    metadata = {str(k): str(v) for k, v in md.items()} if isinstance(md, dict) else {}
    return SafetensorsHeader(fspath, tuple(tensors), metadata)


def _safetensors_entry(path: str, name: str, info: Any, data_size: int) -> TensorEntry:
    try:
        dtype = str(info["dtype"])
        shape = tuple(int(d) for d in info["shape"])
        start, end = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelReadError(path, f"tensor {name!r} has a malformed header entry") from e
    if not 0 <= start <= end <= data_size:
        raise ModelReadError(
            path,
            f"tensor {name!r} data ends at {end} but the file holds {data_size} data bytes; "
            "truncated: download it again",
        )
    return TensorEntry(name, dtype, shape, end - start)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    fspath = os.fspath(path)
    try:
        with open(fspath, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ModelReadError(fspath, f"could not be read ({e.strerror or e})") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelReadError(fspath, f"larger than {MAX_CONFIG_BYTES} bytes; not a model config")
    try:
        cfg = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelReadError(fspath, f"is not valid JSON ({e}); fix or re-download it") from e
    if not isinstance(cfg, dict):
        raise ModelReadError(fspath, "is not a JSON object")
    return cfg


def architectures(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    archs = cfg.get("architectures")
    if isinstance(archs, list):
        return tuple(str(a) for a in archs)
    return ()


def is_hf_llm_config(cfg: Mapping[str, Any]) -> bool:
    """Rule 1 of HF folder detection: a causal LM, or a multimodal wrapper around one.

    Seq2seq models (T5, Whisper) also end in ForConditionalGeneration but carry neither a
    text_config nor a vision_config, so they are not served as chat models.
    """
    for arch in architectures(cfg):
        if arch.endswith(_LLM_SUFFIXES):
            return True
        if arch.endswith("ForConditionalGeneration") and (
            "text_config" in cfg or "vision_config" in cfg
        ):
            return True
    return False


def classify_hf(cfg: Mapping[str, Any]) -> ModelClass | None:
    """The class of an HF folder, or None when it is not a model qmgui can serve."""
    if is_hf_llm_config(cfg):
        return ModelClass.LLM
    if any(_ASR_ARCH.match(a) for a in architectures(cfg)):
        return ModelClass.ASR
    return None


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    for key in keys:
        v = cfg.get(key)
        if isinstance(v, bool):
            continue
        if isinstance(v, int):
            return v
        if isinstance(v, float) and v.is_integer():
            return int(v)
    return default


def _quant_label(cfg: Mapping[str, Any], dtypes: Mapping[str, int]) -> str | None:
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("quant_method"), str):
        method = str(qc["quant_method"]).upper()
        bits = qc.get("bits")
        return f"{method}-{bits}bit" if isinstance(bits, int) else method
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(dtype, str):
        return {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(dtype, dtype.upper())
    return max(dtypes, key=lambda k: dtypes[k]) if dtypes else None


@dataclass(frozen=True)
class _Layers:
    kv_heads: tuple[int, ...]
    swa: tuple[bool, ...]
    recurrent: tuple[bool, ...]
    warnings: tuple[str, ...]


def _hf_layers(c: Mapping[str, Any], n_layer: int, n_kv: int) -> _Layers:
    """Per-layer KV heads, sliding and recurrent flags from `layer_types` (or the interval of
    Qwen3-Next-style hybrids). A `layer_types` list of the wrong length is ignored."""
    kv = [n_kv] * n_layer
    swa = [False] * n_layer
    recurrent = [False] * n_layer
    warnings: list[str] = []
    layer_types = c.get("layer_types")
    interval = _int(c, "full_attention_interval")
    if isinstance(layer_types, list) and len(layer_types) == n_layer:
        for il, lt in enumerate(layer_types):
            if lt in _NO_KV_LAYER_TYPES:
                kv[il] = 0
                recurrent[il] = True
            elif lt in ("sliding_attention", "chunked_attention"):
                swa[il] = True
    elif isinstance(layer_types, list):
        warnings.append(
            f"config.json layer_types has {len(layer_types)} entries for {n_layer} layers; ignored"
        )
    elif interval:
        for il in range(n_layer):
            if (il + 1) % interval:
                kv[il] = 0
                recurrent[il] = True
    return _Layers(tuple(kv), tuple(swa), tuple(recurrent), tuple(warnings))


def _hf_mla(c: Mapping[str, Any]) -> MlaDims | None:
    if not _int(c, "kv_lora_rank"):
        return None
    nope = _int(c, "qk_nope_head_dim")
    rope = _int(c, "qk_rope_head_dim")
    return MlaDims(
        kv_lora_rank=_int(c, "kv_lora_rank", default=0) or 0,
        q_lora_rank=_int(c, "q_lora_rank"),
        rope_dim=rope,
        key_length_mla=(nope + rope) if nope is not None and rope is not None else None,
        value_length_mla=_int(c, "v_head_dim"),
    )


def _hf_ssm(c: Mapping[str, Any], n_embd: int) -> SsmDims | None:
    state = _int(c, "mamba_d_state", "state_size", "ssm_state_size", "d_state")
    if not state:
        return None
    expand = _int(c, "mamba_expand", "expand", default=2) or 2
    return SsmDims(
        conv_kernel=_int(c, "mamba_d_conv", "conv_kernel", "d_conv", default=4) or 4,
        inner_size=_int(c, "mamba_d_inner", "intermediate_size_ssm") or expand * n_embd,
        state_size=state,
        group_count=_int(c, "mamba_n_groups", "n_groups", default=1) or 1,
        time_step_rank=_int(c, "time_step_rank", "mamba_n_heads"),
    )


@dataclass(frozen=True)
class _WeightStats:
    dtypes: dict[str, int]
    per_layer: tuple[int, ...]
    other: int
    params: int


def _weight_stats(tensors: Sequence[TensorEntry], n_layer: int) -> _WeightStats:
    dtypes: dict[str, int] = {}
    per_layer = [0] * n_layer
    other = 0
    params = 0
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
        m = _LAYER.search(t.name)
        if m and int(m.group(1)) < n_layer and "vision" not in t.name:
            per_layer[int(m.group(1))] += t.nbytes
        else:
            other += t.nbytes
        n = 1
        for d in t.shape:
            n *= d
        params += n
    return _WeightStats(dtypes, tuple(per_layer), other, params)


def meta_from_hf(
    cfg: Mapping[str, Any],
    shards: Sequence[SafetensorsHeader],
    *,
    name: str,
    model_class: ModelClass,
) -> ModelMeta:
    """Map config.json (its language-model part) and safetensors headers onto ModelMeta.

    Element counts of packed quantised weights (AWQ/GPTQ int32) undercount parameters; the
    byte counts stay exact.
    """
    text = cfg.get("text_config")
    c: Mapping[str, Any] = {**cfg, **text} if isinstance(text, dict) else cfg
    n_layer = _int(c, "num_hidden_layers", "n_layer", "num_layers", default=0) or 0
    n_embd = _int(c, "hidden_size", "n_embd", "d_model", default=0) or 0
    n_head = _int(c, "num_attention_heads", "n_head", default=0) or 0
    n_kv = _int(c, "num_key_value_heads", "num_kv_heads", default=n_head) or 0
    head_dim = _int(c, "head_dim") or (n_embd // n_head if n_head else None)
    layers = _hf_layers(c, n_layer, n_kv)
    tensors = tuple(t for s in shards for t in s.tensors)
    stats = _weight_stats(tensors, n_layer)
    ff = _int(c, "intermediate_size", "n_inner", default=0) or 0
    return ModelMeta(
        format="hf",
        architecture=(architectures(cfg) or (str(cfg.get("model_type", "unknown")),))[0],
        name=name,
        model_class=model_class,
        quant=_quant_label(cfg, stats.dtypes),
        param_count=stats.params or None,
        weight_bytes=sum(t.nbytes for t in tensors),
        context_length=_int(c, "max_position_embeddings", "n_positions", "max_seq_len"),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=(n_head,) * n_layer,
        n_head_kv=layers.kv_heads,
        head_dim_k=head_dim,
        head_dim_v=_int(c, "v_head_dim") or head_dim,
        n_ff=(ff,) * n_layer,
        vocab_size=_int(c, "vocab_size"),
        sliding_window=_int(c, "sliding_window", "attention_chunk_size"),
        swa_layers=layers.swa,
        mla=_hf_mla(c),
        n_expert=_int(c, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0,
        n_expert_used=_int(c, "num_experts_per_tok", "moe_topk", default=0) or 0,
        n_expert_shared=_int(c, "n_shared_experts", "num_shared_experts", default=0) or 0,
        leading_dense_layers=_int(c, "first_k_dense_replace", default=0) or 0,
        nextn_layers=_int(c, "num_nextn_predict_layers", default=0) or 0,
        ssm=_hf_ssm(c, n_embd),
        recurrent_layers=layers.recurrent,
        causal=True,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        tensors=tensors,
        bytes_per_layer=stats.per_layer,
        non_layer_bytes=stats.other,
        dtypes=stats.dtypes,
        warnings=layers.warnings,
    )
