"""Hugging Face folders: `config.json` and safetensors headers mapped onto `ModelMeta`.

Only headers are read: a safetensors file starts with an 8-byte little-endian length and a
JSON table of tensors (dtype, shape, data offsets), which gives exact weight bytes per dtype
without touching the data. Multimodal wrappers keep the language model's numbers in a nested
`text_config`; those win over the top level.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qmgui.core.errors import ModelReadError
from qmgui.core.meta import (
    MAX_CONTEXT,
    MAX_EMBD,
    MAX_EXPERTS,
    MAX_EXPERTS_USED,
    MAX_HEAD_DIM,
    MAX_LAYERS,
    MAX_SMALL,
    MAX_VOCAB,
    MAX_WIDTH,
    ImplausibleValue,
    MlaDims,
    ModelClass,
    ModelMeta,
    SsmDims,
    TensorEntry,
    check_relations,
    checked_count,
    shown,
)
from qmgui.core.safeio import loads_json, open_regular, read_regular, read_upto

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # real config.json files are a few KiB
# The safetensors format allows a 100 MB header; real ones hold ~120 bytes per tensor (a few
# MiB for the largest single files), and a hostile one is parsed in memory: 16 MiB bounds it.
MAX_SAFETENSORS_HEADER = 16 * 1024 * 1024
MAX_TENSOR_DIMS = 8  # real tensors have 1 to 4 dimensions
MAX_DTYPE_LEN = 32  # "F8_E4M3"

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
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.([0-9]{1,9})\.")
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
    with open_regular(fspath) as f:  # a FIFO or device: ModelReadError, never opened
        try:
            size = os.fstat(f.fileno()).st_size
            head = read_upto(f, 8)
            if len(head) < 8:
                raise ModelReadError(fspath, f"only {size} bytes; not a safetensors file", offset=0)
            (n,) = struct.unpack("<Q", head)
            if 8 + n > size:
                raise ModelReadError(
                    fspath,
                    f"header claims {n} bytes but the file has {size}; truncated or not "
                    "safetensors: download it again",
                    offset=0,
                )
            if n > MAX_SAFETENSORS_HEADER:
                raise ModelReadError(
                    fspath,
                    f"header claims {n} bytes, over the limit of {MAX_SAFETENSORS_HEADER}",
                    offset=0,
                )
            raw = read_upto(f, n)
        except OSError as e:
            raise ModelReadError(fspath, f"could not be read ({e.strerror or e})") from e
    table = loads_json(raw, fspath, what="header is", offset=8)
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


def _whole(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _safetensors_entry(path: str, name: str, info: Any, data_size: int) -> TensorEntry:
    shown_name = shown(name)
    try:
        dtype, shape_raw, offsets = info["dtype"], info["shape"], info["data_offsets"]
    except (KeyError, TypeError, IndexError) as e:
        raise ModelReadError(path, f"tensor {shown_name} has a malformed header entry") from e
    if not isinstance(dtype, str) or not 0 < len(dtype) <= MAX_DTYPE_LEN:
        raise ModelReadError(path, f"tensor {shown_name} has dtype {shown(dtype)}")
    if (
        not isinstance(shape_raw, list)
        or len(shape_raw) > MAX_TENSOR_DIMS
        or not all(_whole(d) and 0 <= d < 1 << 63 for d in shape_raw)
    ):
        raise ModelReadError(path, f"tensor {shown_name} has shape {shown(shape_raw)}")
    shape = tuple(shape_raw)
    n = 1
    for d in shape:
        n *= d
    if n >= 1 << 63:
        raise ModelReadError(path, f"tensor {shown_name} shape {shape} overflows 63 bits")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_whole, offsets)):
        raise ModelReadError(path, f"tensor {shown_name} has data offsets {shown(offsets)}")
    start, end = offsets
    if not 0 <= start <= end <= data_size:
        raise ModelReadError(
            path,
            f"tensor {name!r} data ends at {end} but the file holds {data_size} data bytes; "
            "truncated: download it again",
        )
    return TensorEntry(name, dtype, shape, end - start)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """config.json as a dict; ModelReadError for anything else (not a regular file, too big,
    not JSON within safeio's limits, not an object)."""
    fspath = os.fspath(path)
    raw = read_regular(fspath, MAX_CONFIG_BYTES)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ModelReadError(fspath, f"larger than {MAX_CONFIG_BYTES} bytes; not a model config")
    cfg = loads_json(raw, fspath)
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


def _int(
    cfg: Mapping[str, Any], *keys: str, default: int | None = None, hi: int, unit: str
) -> int | None:
    """The first of `keys` that holds a number, checked to be a whole number from 0 to `hi`
    (ImplausibleValue naming the key otherwise); text, lists and null count as absent."""
    for key in keys:
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        return checked_count(key, v, hi, unit)
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
    interval = _int(c, "full_attention_interval", hi=MAX_LAYERS, unit="layers")
    if isinstance(layer_types, list) and len(layer_types) == n_layer:
        for il, lt in enumerate(layer_types):
            if not isinstance(lt, str):  # a list or an object: not a layer type (hashable)
                continue
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


def _head(c: Mapping[str, Any], *keys: str) -> int | None:
    return _int(c, *keys, hi=MAX_HEAD_DIM, unit="values per head")


def _width(c: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    return _int(c, *keys, default=default, hi=MAX_WIDTH, unit="values")


def _hf_mla(c: Mapping[str, Any]) -> MlaDims | None:
    kv_lora = _width(c, "kv_lora_rank")
    if not kv_lora:
        return None
    nope = _head(c, "qk_nope_head_dim")
    rope = _head(c, "qk_rope_head_dim")
    return MlaDims(
        kv_lora_rank=kv_lora,
        q_lora_rank=_width(c, "q_lora_rank"),
        rope_dim=rope,
        key_length_mla=(nope + rope) if nope is not None and rope is not None else None,
        value_length_mla=_head(c, "v_head_dim"),
    )


def _hf_ssm(c: Mapping[str, Any], n_embd: int) -> SsmDims | None:
    state = _width(c, "mamba_d_state", "state_size", "ssm_state_size", "d_state")
    if not state:
        return None
    expand = _int(c, "mamba_expand", "expand", default=2, hi=MAX_SMALL, unit="times") or 2
    kernel = _int(
        c, "mamba_d_conv", "conv_kernel", "d_conv", default=4, hi=MAX_SMALL, unit="values"
    )
    return SsmDims(
        conv_kernel=kernel or 4,
        inner_size=_width(c, "mamba_d_inner", "intermediate_size_ssm") or expand * n_embd,
        state_size=state,
        group_count=_width(c, "mamba_n_groups", "n_groups", default=1) or 1,
        time_step_rank=_width(c, "time_step_rank", "mamba_n_heads"),
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


# ModelMeta fields and the config.json keys that give them, first match wins
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "n_layer": ("num_hidden_layers", "n_layer", "num_layers"),
    "n_embd": ("hidden_size", "n_embd", "d_model"),
    "n_head": ("num_attention_heads", "n_head"),
    "n_head_kv": ("num_key_value_heads", "num_kv_heads"),
    "n_expert": ("n_routed_experts", "num_experts", "num_local_experts"),
    "n_expert_used": ("num_experts_per_tok", "moe_topk"),
    "n_expert_shared": ("n_shared_experts", "num_shared_experts"),
    "leading_dense_layers": ("first_k_dense_replace",),
    "nextn_layers": ("num_nextn_predict_layers",),
    "context_length": ("max_position_embeddings", "n_positions", "max_seq_len"),
    "sliding_window": ("sliding_window", "attention_chunk_size"),
    "n_ff": ("intermediate_size", "n_inner"),
}
MAX_ARCH_LEN = 128  # a display string here (HF architecture names are ~40 characters)


def meta_from_hf(
    cfg: Mapping[str, Any],
    shards: Sequence[SafetensorsHeader],
    *,
    name: str,
    model_class: ModelClass,
    path: str = "config.json",
) -> ModelMeta:
    """Map config.json (its language-model part) and safetensors headers onto ModelMeta.

    Element counts of packed quantised weights (AWQ/GPTQ int32) undercount parameters; the
    byte counts stay exact. Every count is checked before it sizes anything: an implausible
    or contradictory value raises ModelReadError naming `path`, the key and the value.
    """
    try:
        return _meta_from_hf(cfg, shards, name, model_class)
    except ImplausibleValue as e:
        raise ModelReadError(path, str(e)) from None


def _meta_from_hf(
    cfg: Mapping[str, Any],
    shards: Sequence[SafetensorsHeader],
    name: str,
    model_class: ModelClass,
) -> ModelMeta:
    text = cfg.get("text_config")
    c: Mapping[str, Any] = {**cfg, **text} if isinstance(text, dict) else cfg

    def count(field: str, hi: int, unit: str, default: int | None = 0) -> int | None:
        return _int(c, *_HF_KEYS[field], default=default, hi=hi, unit=unit)

    n_layer = count("n_layer", MAX_LAYERS, "layers") or 0
    n_embd = count("n_embd", MAX_EMBD, "values") or 0
    n_head = count("n_head", MAX_EMBD, "heads") or 0
    n_kv = count("n_head_kv", MAX_EMBD, "heads", default=n_head) or 0
    head_dim = _head(c, "head_dim") or (n_embd // n_head if n_head else None)
    layers = _hf_layers(c, n_layer, n_kv)
    tensors = tuple(t for s in shards for t in s.tensors)
    stats = _weight_stats(tensors, n_layer)
    ff = count("n_ff", MAX_WIDTH, "values") or 0
    n_expert = count("n_expert", MAX_EXPERTS, "experts") or 0
    arch = (architectures(cfg) or (str(cfg.get("model_type", "unknown")),))[0]
    meta = ModelMeta(
        format="hf",
        architecture=arch[:MAX_ARCH_LEN],
        name=name,
        model_class=model_class,
        quant=_quant_label(cfg, stats.dtypes),
        param_count=stats.params or None,
        weight_bytes=sum(t.nbytes for t in tensors),
        context_length=count("context_length", MAX_CONTEXT, "tokens", default=None),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=(n_head,) * n_layer,
        n_head_kv=layers.kv_heads,
        head_dim_k=head_dim,
        head_dim_v=_head(c, "v_head_dim") or head_dim,
        n_ff=(ff,) * n_layer,
        vocab_size=_int(c, "vocab_size", hi=MAX_VOCAB, unit="tokens"),
        sliding_window=count("sliding_window", MAX_CONTEXT, "tokens", default=None),
        swa_layers=layers.swa,
        mla=_hf_mla(c),
        n_expert=n_expert,
        # a dense config may still carry num_experts_per_tok: it means nothing without experts
        n_expert_used=(count("n_expert_used", MAX_EXPERTS_USED, "experts") or 0) if n_expert else 0,
        n_expert_shared=count("n_expert_shared", MAX_EXPERTS, "experts") or 0,
        leading_dense_layers=count("leading_dense_layers", MAX_LAYERS, "layers") or 0,
        nextn_layers=count("nextn_layers", MAX_LAYERS, "layers") or 0,
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

    def key(field: str) -> str:
        keys = _HF_KEYS.get(field, (field,))
        return next((k for k in keys if k in c), keys[0])

    check_relations(meta, key, needs_experts_used=False)
    return meta
