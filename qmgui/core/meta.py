"""Normalised model metadata: one `ModelMeta` for a GGUF header or a Hugging Face config.

Everything the sizing core needs is resolved here, per layer where models vary per layer (KV
heads, sliding-window layers, recurrent layers), so the sizing code never reads raw keys.
Per-architecture defaults mirror llama.cpp's `llama-model.cpp` (hparams loading); where a key
is missing and no default is known the field is None, never a guess. This module is the
façade: the common keys, the model class and the checks are here; the per-family readers
(sliding windows, recurrent layouts, MLA, SSM, linear attention, RWKV, indexers, PLE) and
the key lookup and limits are in core/hparams, and re-exported here where others import them.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_header import ArrayInfo, GGUFHeader, MetaValue, TensorInfo
from qmgui.core.gguf_tables import LLAMA_FILE_TYPES
from qmgui.core.hparams.indexer import DSV4_CSA_RATIO, DSV4_HCA_RATIO, compress_ratios, indexer
from qmgui.core.hparams.keys import (
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
    Keys,
    checked_count,
    shown,
)
from qmgui.core.hparams.linear_attn import LinearAttnDims, linear_attn_dims
from qmgui.core.hparams.mla import MlaDims, mla_dims
from qmgui.core.hparams.ple import ple_state
from qmgui.core.hparams.recurrent import recurrent_layers
from qmgui.core.hparams.rwkv import RwkvDims, rwkv_dims
from qmgui.core.hparams.ssm import SsmDims, ssm_dims
from qmgui.core.hparams.windows import sliding_window, swa_layers

# names other modules import from here (the readers and their types live in core/hparams)
__all__ = [
    "DSV4_CSA_RATIO",
    "DSV4_HCA_RATIO",
    "MAX_CONTEXT",
    "MAX_EMBD",
    "MAX_EXPERTS",
    "MAX_EXPERTS_USED",
    "MAX_HEAD_DIM",
    "MAX_LAYERS",
    "MAX_NAME_LEN",
    "MAX_SMALL",
    "MAX_VOCAB",
    "MAX_WIDTH",
    "ImplausibleValue",
    "LinearAttnDims",
    "MlaDims",
    "ModelClass",
    "ModelMeta",
    "Pooling",
    "RwkvDims",
    "SsmDims",
    "TensorEntry",
    "check_relations",
    "checked_count",
    "gguf_display_name",
    "gguf_quant_label",
    "meta_from_gguf",
    "shown",
]


# --- plausibility limits (the others: core/hparams/keys.py) -----------------------------------
MAX_NAME_LEN = 256  # a model's display name is cut here (general.name may hold 16 MiB)
_ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # "llama", "nemotron_h_moe"


class ModelClass(str, enum.Enum):
    """What a model is for; decides which engine kind serves it."""

    LLM = "llm"
    EMBEDDING = "embedding"
    RERANK = "rerank"
    IMAGE = "image"
    TTS = "tts"
    ASR = "asr"
    PROJECTOR = "projector"  # an attachment (mmproj), never listed as a model of its own


class Pooling(str, enum.Enum):
    NONE = "none"
    MEAN = "mean"
    CLS = "cls"
    LAST = "last"
    RANK = "rank"


_POOLING_BY_ID = {
    0: Pooling.NONE,
    1: Pooling.MEAN,
    2: Pooling.CLS,
    3: Pooling.LAST,
    4: Pooling.RANK,
}


@dataclass(frozen=True)
class TensorEntry:
    """One weight tensor: name, storage type label (Q4_K, BF16...), shape, bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int = 0  # absolute offset of the data in its file
    file_index: int = 0  # which shard of a split set holds it


@dataclass(frozen=True)
class ModelMeta:
    """What one model is, read from its header only."""

    format: str  # "gguf" or "hf"
    architecture: str
    name: str
    model_class: ModelClass
    quant: str | None
    param_count: int | None
    weight_bytes: int
    context_length: int | None
    n_layer: int
    n_embd: int
    n_head: tuple[int, ...]  # per layer
    n_head_kv: tuple[int, ...]  # per layer; 0 where a layer has no attention KV
    head_dim_k: int | None
    head_dim_v: int | None
    n_ff: tuple[int, ...] = ()
    vocab_size: int | None = None
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()  # per layer: True where attention slides
    mla: MlaDims | None = None
    n_expert: int = 0
    n_expert_used: int = 0
    n_expert_shared: int = 0
    leading_dense_layers: int = 0
    nextn_layers: int = 0  # MTP / NextN blocks, counted inside n_layer
    ssm: SsmDims | None = None
    rwkv: RwkvDims | None = None
    linear_attn: LinearAttnDims | None = None
    # sparse-attention indexers (DeepSeek-V3.2 DSA, GLM-DSA, MiniMax-M3 MSA, k-pool indexers):
    # a key cache of `indexer_dim` values per cell (and a V row of `indexer_v_dim`) in each
    # layer flagged in `indexer_layers`, beside the attention KV
    indexer_dim: int = 0
    indexer_v_dim: int = 0
    indexer_layers: tuple[bool, ...] = ()
    # attention.indexer.top_k: the cache cells the indexer keeps per query (0: absent)
    indexer_top_k: int = 0
    # attention.indexer.block_size: MiniMax-M3 MSA's positions per selectable block (0: absent)
    indexer_block_size: int = 0
    # qwen4exp's PLE n-gram convolution history: floats per sequence, kept in the recurrent
    # state of the layers flagged here (llama_hparams::ple_conv_state, is_ple)
    ple_conv_floats: int = 0
    ple_layers: tuple[bool, ...] = ()
    # DeepSeek-V4: per layer, how many tokens one compressed KV entry stands for (0: none; 4:
    # CSA with a lightning indexer, 128: HCA), attention.compress_ratios
    compress_ratios: tuple[int, ...] = ()
    recurrent_layers: tuple[bool, ...] = ()  # per layer: True where the layer keeps a state
    shortconv_l_cache: int | None = None  # LFM2 short-convolution cache length
    shared_kv_layers: int = 0  # Gemma 3n: trailing layers that reuse earlier KV
    # build_moe_ffn's routing where the GGUF states it: expert_gating_func (1 softmax,
    # 2 sigmoid; 0 absent), expert_weights_norm, expert_weights_scale; and the per-layer
    # SwiGLU limits of the routed and shared experts (swiglu_clamp_exp/_shexp, 0: none)
    expert_gating: int = 0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0
    swiglu_clamp_exp: tuple[float, ...] = ()
    swiglu_clamp_shexp: tuple[float, ...] = ()
    # the k-pool indexer (glm5-next): attention.indexer.kpool tokens per pool (0: none) and
    # kpool_select_tail (the incomplete last pool is always attended; llama.cpp's default)
    indexer_kpool: int = 0
    indexer_kpool_tail: bool = True
    # rope.dimension_sections (M-RoPE; llama_hparams::use_mrope: the first two above zero)
    rope_sections: tuple[int, ...] = ()
    # attention.compress_ratios as the GGUF gives it, any architecture (qwen4exp: the QSA
    # layers, nonzero, and their k-pool size); compress_ratios above is DeepSeek-V4's only
    compress_ratios_raw: tuple[int, ...] = ()
    pooling: Pooling = Pooling.NONE
    causal: bool = True
    tied_embeddings: bool = False
    tensors: tuple[TensorEntry, ...] = ()
    bytes_per_layer: tuple[int, ...] = ()  # weights of blk.N / model.layers.N
    non_layer_bytes: int = 0  # embeddings, output, norms
    dtypes: Mapping[str, int] = field(default_factory=dict)  # dtype label -> bytes
    warnings: tuple[str, ...] = ()  # things a user should know (old MLA GGUF, unknown arch)
    # rope.scaling.finetuned: Granite's switch for RoPE (granite-hybrid.cpp ropes Q and K only
    # where it is true; llama.cpp defaults it to true when the key is absent)
    rope_finetuned: bool = True
    # attn_res.block_size: Kimi K3's cross-layer residual attention banks the layer input
    # every this many layers (models/kimi-k3.cpp res_push; 0: no residual attention)
    attn_res_block_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_recurrent(self) -> bool:
        return any(self.recurrent_layers)


def check_relations(
    meta: ModelMeta, key: Callable[[str], str], *, needs_experts_used: bool = True
) -> None:
    """Contradictions between the counts of one model (more KV heads than heads, experts used
    out of none, more heads than the embedding is wide...). `key(field)` names a ModelMeta
    field as the file spells it. `needs_experts_used`: a mixture of experts must say how many
    it uses (llama.cpp asserts it; config.json spells it too many ways to require). Raises
    ImplausibleValue."""
    _check_heads(meta, key)
    if meta.n_expert_used > meta.n_expert:
        raise ImplausibleValue(
            f"{key('n_expert_used')} is {meta.n_expert_used} but {key('n_expert')} is "
            f"{meta.n_expert}: more experts used per token than the model has"
        )
    if needs_experts_used and meta.n_expert and not meta.n_expert_used:
        raise ImplausibleValue(
            f"{key('n_expert_used')} is 0 with {meta.n_expert} experts ({key('n_expert')}): "
            "a mixture of experts uses at least one per token"
        )
    for name in ("leading_dense_layers", "nextn_layers", "shared_kv_layers"):
        n = getattr(meta, name)
        if n > meta.n_layer:
            raise ImplausibleValue(
                f"{key(name)} is {n} but {key('n_layer')} is {meta.n_layer}: more than the "
                "model's layers"
            )


def _check_heads(meta: ModelMeta, key: Callable[[str], str]) -> None:
    seen: set[tuple[int, int]] = set()
    for il, (h, kv) in enumerate(zip(meta.n_head, meta.n_head_kv, strict=False)):
        if (h, kv) in seen:
            continue
        seen.add((h, kv))
        where = f" (layer {il})" if len(set(meta.n_head) | set(meta.n_head_kv)) > 2 else ""
        if meta.n_embd and h > meta.n_embd:
            raise ImplausibleValue(
                f"{key('n_head')} is {h}{where} but {key('n_embd')} is {meta.n_embd}: more "
                "attention heads than the embedding has values"
            )
        if kv > h:
            raise ImplausibleValue(
                f"{key('n_head_kv')} is {kv}{where} but {key('n_head')} is {h}: more KV "
                "heads than attention heads"
            )
        if kv and h % kv:
            raise ImplausibleValue(
                f"{key('n_head')} is {h}{where}, not a multiple of {key('n_head_kv')} {kv}: "
                "each KV head serves a whole group of attention heads"
            )


# --- GGUF ------------------------------------------------------------------------------------

EMBEDDING_ARCHS = frozenset(
    {
        "bert",
        "modern-bert",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "eurobert",
        "t5encoder",
        "gemma-embedding",
        "llama-embed",
        "pangu-embedded",
    }
)
# city96's ComfyUI-GGUF and stable-diffusion.cpp write these for diffusion models
IMAGE_ARCHS = frozenset(
    {
        "flux",
        "sd1",
        "sdxl",
        "sd3",
        "aura",
        "hidream",
        "cosmos",
        "ltxv",
        "hyvid",
        "wan",
        "lumina2",
        "qwen_image",
        "chroma",
        "hunyuan",
        "mochi",
    }
)
TTS_ARCHS = frozenset({"wavtokenizer-dec", "outetts", "orpheus", "kokoro"})

# ASCII digits, at most 9: "blk.<5,000 digits>." is no layer (and int() would refuse it)
_BLK = re.compile(r"^blk\.([0-9]{1,9})\.")
_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


def _str(md: Mapping[str, MetaValue], key: str) -> str | None:
    v = md.get(key)
    return v if isinstance(v, str) and v else None


def gguf_display_name(header: GGUFHeader, fallback: str) -> str:
    name = _str(header.metadata, "general.name")
    if name:
        return name if len(name) <= MAX_NAME_LEN else name[: MAX_NAME_LEN - 3] + "..."
    return _SPLIT_SUFFIX.sub("", fallback)


def gguf_quant_label(header: GGUFHeader) -> str | None:
    ft = header.metadata.get("general.file_type")
    if isinstance(ft, int) and not isinstance(ft, bool):
        name = LLAMA_FILE_TYPES.get(ft, "")
        if name and name != "GUESSED":
            return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    # no file_type: the storage type holding most of the weight bytes
    by_type: dict[str, int] = {}
    for t in header.tensors:
        by_type[t.type_name] = by_type.get(t.type_name, 0) + t.nbytes
    return max(by_type, key=lambda k: by_type[k]) if by_type else None


# tensors of llama.cpp's input layer (LLM_TENSOR_LAYER_INPUT): always on the CPU
INPUT_TENSORS = frozenset({"token_embd.weight", "position_embd.weight", "token_types.weight"})
# expert weights that --cpu-moe / --n-cpu-moe keep on the CPU (common/arg.cpp's pattern)
_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch)?exps")


# a tensor name as "blk.<index>." and the rest: (index or "", rest); the whole name is the rest
# of a name outside the blocks. One line of the names joined by line breaks (name_parts), or
# one name whole (a name with a line break in it)
_PARTS_LINES = re.compile(r"^(?:blk\.([0-9]{1,9})\.)?(.*)$", re.MULTILINE)
_PARTS_ONE = re.compile(r"(?:blk\.([0-9]{1,9})\.)?(.*)", re.DOTALL)


def name_parts(meta: ModelMeta) -> Sequence[tuple[str, str]]:
    """Per tensor of meta.tensors, its block index as written (ASCII digits, at most 9, as
    _BLK reads it; "" outside the blocks) and the rest of its name. Read once per model
    (tensor_places and core.graph.dims' layer signatures ask), by one regular expression
    over every name: a model has hundreds of tensors, and taking each name apart with string
    methods cost more than all else the first estimate of a model reads from its header."""
    hit = _NAME_PARTS.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    names = [t.name for t in meta.tensors]
    parts: list[tuple[str, str]] = _PARTS_LINES.findall("\n".join(names))
    if len(parts) != len(names):  # a name with a line break in it: each name alone
        parts = [(m[1] or "", m[2]) for m in map(_PARTS_ONE.fullmatch, names) if m is not None]
    if len(_NAME_PARTS) >= _PLACES_KEPT:
        _NAME_PARTS.clear()
    _NAME_PARTS[id(meta)] = (meta, parts)
    return parts


_NAME_PARTS: dict[int, tuple[ModelMeta, Sequence[tuple[str, str]]]] = {}


def tensor_places(meta: ModelMeta) -> tuple[tuple[int, bool], ...]:
    """Per tensor of meta.tensors, as llama.cpp's loader places it: its layer (-1: the input
    layer's embeddings; meta.n_layer: the output layer, and blocks beyond the model's layers)
    and whether its name is an expert tensor's. Read once per model (core.footprint's
    placement table and core.sched's weight sizes both ask)."""
    hit = _PLACES.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    n = meta.n_layer
    out = []
    for t, (idx, rest) in zip(meta.tensors, name_parts(meta), strict=True):
        if idx:
            layer = int(idx)
            if layer > n:  # noqa: PLR1730 - min() costs a call per tensor
                layer = n
        else:
            layer = -1 if rest in INPUT_TENSORS else n  # the output layer, and no block's
        # the pattern's "exps" first, as a substring: most names have none
        out.append((layer, "exps" in rest and _EXPERTS.search(t.name) is not None))
    places = tuple(out)
    if len(_PLACES) >= _PLACES_KEPT:
        _PLACES.clear()
    _PLACES[id(meta)] = (meta, places)
    return places


_PLACES: dict[int, tuple[ModelMeta, tuple[tuple[int, bool], ...]]] = {}
_PLACES_KEPT = 32  # models whose places are kept (keyed by identity, checked as others are)


def _layer_bytes(tensors: Sequence[TensorInfo], n_layer: int) -> tuple[tuple[int, ...], int]:
    per = [0] * n_layer
    other = 0
    for t in tensors:
        m = _BLK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            per[int(m.group(1))] += t.nbytes
        else:
            other += t.nbytes
    return tuple(per), other


def _classify_gguf(
    header: GGUFHeader, arch: str, pooling: Pooling, causal: bool, name: str
) -> ModelClass:
    md = header.metadata
    gtype = _str(md, "general.type")
    if arch == "clip" or gtype == "mmproj":
        return ModelClass.PROJECTOR
    if pooling == Pooling.RANK:
        return ModelClass.RERANK
    if arch in EMBEDDING_ARCHS or (pooling != Pooling.NONE and not causal):
        return ModelClass.EMBEDDING
    if pooling in (Pooling.MEAN, Pooling.CLS, Pooling.LAST):
        return ModelClass.EMBEDDING  # e.g. Qwen3-Embedding: a causal LM with last-token pooling
    if arch in IMAGE_ARCHS or any(
        t.name.startswith(("model.diffusion_model.", "double_blocks.")) for t in header.tensors[:8]
    ):
        return ModelClass.IMAGE
    if arch in TTS_ARCHS or re.search(r"\b(?:oute)?tts\b", name, re.IGNORECASE):
        return ModelClass.TTS
    if arch == "whisper":
        return ModelClass.ASR
    return ModelClass.LLM


# ModelMeta fields as GGUF keys (after "{arch}."), for error sentences
_GGUF_KEYS = {
    "n_layer": "block_count",
    "n_embd": "embedding_length",
    "n_head": "attention.head_count",
    "n_head_kv": "attention.head_count_kv",
    "n_expert": "expert_count",
    "n_expert_used": "expert_used_count",
    "leading_dense_layers": "leading_dense_block_count",
    "nextn_layers": "nextn_predict_layers",
    "shared_kv_layers": "attention.shared_kv_layers",
}


def _gguf_arch(md: Mapping[str, MetaValue]) -> str:
    arch = md.get("general.architecture")
    if arch is None or arch == "":
        return "unknown"
    if not isinstance(arch, str) or not _ARCH_NAME.fullmatch(arch):
        raise ImplausibleValue(f"general.architecture is {shown(arch)}; not an architecture name")
    return arch


def _check_blocks(k: Keys, n_layer: int, tensors: Sequence[TensorInfo]) -> None:
    """llama.cpp loads blk.0 .. blk.{n_layer-1}: a block count beyond the tensor table's
    blocks names layers that are not there."""
    top = -1
    for t in tensors:
        m = _BLK.match(t.name)
        if m:
            top = max(top, int(m.group(1)))
    if top >= 0 and n_layer > top + 1:
        raise ImplausibleValue(
            f"{k.name('block_count')} is {n_layer} but the tensor table holds blocks 0 to "
            f"{top} ({top + 1} layers)"
        )


def _check_unknown(md: Mapping[str, MetaValue], n_tensors: int) -> None:
    """A file with no architecture that would be listed as a chat model: llama.cpp cannot load
    it, and nothing in it can be sized."""
    if not md and not n_tensors:
        raise ImplausibleValue("has no metadata keys and no tensors: an empty GGUF, not a model")
    raise ImplausibleValue(
        f"has no general.architecture key ({len(md)} keys, {n_tensors} tensors): not a model "
        "llama.cpp can load"
    )


def _float(v: object) -> float:
    """A float key's value (0.0 where absent or not a finite number)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return 0.0
    f = float(v)
    return f if math.isfinite(f) else 0.0


def _ints(v: object) -> tuple[int, ...]:
    """An int array key's values (non-ints read as 0); empty where absent."""
    if isinstance(v, tuple):
        return tuple(x if isinstance(x, int) and not isinstance(x, bool) else 0 for x in v[:16])
    return ()


def _floats_per_layer(v: object, n_layer: int) -> tuple[float, ...]:
    """A float per layer from a scalar or an array key (get_key_or_arr; a short array leaves
    zeros); empty where absent."""
    if v is None:
        return ()
    if isinstance(v, tuple):
        vals = tuple(_float(x) for x in v[:n_layer])
        return vals + (0.0,) * (n_layer - len(vals))
    return (_float(v),) * n_layer


def meta_from_gguf(
    header: GGUFHeader,
    *,
    file_name: str,
    more_shards: Sequence[GGUFHeader] = (),
    partial: bool = False,
) -> ModelMeta:
    """Normalise one GGUF header; for a split set, `header` is the first shard's and the
    tensor tables of `more_shards` are added to it (`partial`: some shards are missing, so the
    block count is not checked against the tensor table).

    Every count is checked before it sizes anything (see MAX_LAYERS and the limits beside
    it): an implausible or contradictory value raises ModelReadError naming the file, the key
    and the value."""
    try:
        return _meta_from_gguf(header, file_name, more_shards, partial)
    except ImplausibleValue as e:
        raise ModelReadError(header.path, str(e)) from None


def _meta_from_gguf(
    header: GGUFHeader, file_name: str, more_shards: Sequence[GGUFHeader], partial: bool
) -> ModelMeta:
    md = header.metadata
    headers = (header, *more_shards)
    all_tensors = [t for h in headers for t in h.tensors]
    arch = _gguf_arch(md)
    k = Keys(md, arch)
    warnings: list[str] = []
    n_layer = k.get_int("block_count", 0, hi=MAX_LAYERS, unit="layers") or 0
    if not partial:
        _check_blocks(k, n_layer, all_tensors)
    n_embd = k.get_int("embedding_length", 0, hi=MAX_EMBD, unit="values") or 0
    n_head = k.per_layer("attention.head_count", n_layer, hi=MAX_EMBD, unit="heads")
    n_head_kv = (
        k.per_layer("attention.head_count_kv", n_layer, hi=MAX_EMBD, unit="heads")
        if k.raw("attention.head_count_kv") is not None
        else n_head
    )
    n_ff = k.per_layer("feed_forward_length", n_layer, hi=MAX_WIDTH, unit="values")
    head0 = next((h for h in n_head if h), 0)
    head_dim_k = k.get_int("attention.key_length", hi=MAX_HEAD_DIM, unit="values per head") or (
        n_embd // head0 if head0 else None
    )
    head_dim_v = k.get_int("attention.value_length", hi=MAX_HEAD_DIM, unit="values per head") or (
        n_embd // head0 if head0 else None
    )

    mla = mla_dims(k, arch, warnings)
    ssm = ssm_dims(k)
    rwkv = rwkv_dims(k)

    pooling_id = k.raw("pooling_type")
    pooling = _POOLING_BY_ID.get(pooling_id if isinstance(pooling_id, int) else 0, Pooling.NONE)
    causal_raw = k.raw("attention.causal")
    causal = bool(causal_raw) if isinstance(causal_raw, bool) else arch not in EMBEDDING_ARCHS
    n_swa = sliding_window(k, arch)

    names = {t.name for t in all_tensors}
    vocab = k.get_int("vocab_size", hi=MAX_VOCAB, unit="tokens")
    if vocab is None:
        tokens = md.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayInfo):
            vocab = tokens.count
        elif isinstance(tokens, tuple):
            vocab = len(tokens)
    per_layer, other = _layer_bytes(all_tensors, n_layer)
    dtypes: dict[str, int] = {}
    for t in all_tensors:
        dtypes[t.type_name] = dtypes.get(t.type_name, 0) + t.nbytes
    name = gguf_display_name(header, file_name)
    # "tied": a decoder without output.weight computes logits with token_embd (llama.cpp
    # duplicates it as the output matrix); encoders (BERT family) have no output head at all
    model_class = _classify_gguf(header, arch, pooling, causal, name)
    if arch == "unknown":
        if model_class == ModelClass.LLM:
            _check_unknown(md, len(all_tensors))
        warnings.append("no general.architecture key; not a model llama.cpp can load")

    def count(key: str, hi: int, unit: str) -> int:
        return k.get_int(key, 0, hi=hi, unit=unit) or 0

    recurrent = recurrent_layers(k, arch, n_layer, n_head_kv, n_ff)
    index = indexer(k, arch, n_layer, recurrent=recurrent, mla=mla, head_dim_v=head_dim_v)
    ple = ple_state(k, arch, n_layer, n_embd)

    meta = ModelMeta(
        format="gguf",
        architecture=arch,
        name=name,
        model_class=model_class,
        quant=gguf_quant_label(header),
        param_count=sum(t.n_elements for t in all_tensors) or None,
        weight_bytes=sum(t.nbytes for t in all_tensors),
        context_length=k.get_int("context_length", hi=MAX_CONTEXT, unit="tokens"),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        n_ff=n_ff,
        vocab_size=vocab,
        sliding_window=n_swa,
        swa_layers=swa_layers(k, arch, n_layer, n_swa, n_head_kv),
        mla=mla,
        n_expert=count("expert_count", MAX_EXPERTS, "experts"),
        n_expert_used=count("expert_used_count", MAX_EXPERTS_USED, "experts"),
        n_expert_shared=count("expert_shared_count", MAX_EXPERTS, "experts"),
        leading_dense_layers=count("leading_dense_block_count", MAX_LAYERS, "layers"),
        nextn_layers=count("nextn_predict_layers", MAX_LAYERS, "layers"),
        ssm=ssm,
        rwkv=rwkv,
        linear_attn=linear_attn_dims(k, arch, n_head, head_dim_k),
        indexer_dim=index[0],
        indexer_v_dim=index[1],
        indexer_layers=index[2],
        indexer_top_k=k.get_int("attention.indexer.top_k", 0, hi=MAX_CONTEXT, unit="tokens") or 0,
        indexer_block_size=k.get_int(
            "attention.indexer.block_size", 0, hi=MAX_CONTEXT, unit="tokens"
        )
        or 0,
        ple_conv_floats=ple[0],
        ple_layers=ple[1],
        compress_ratios=compress_ratios(k, arch, n_layer),
        recurrent_layers=recurrent,
        shortconv_l_cache=k.get_int("shortconv.l_cache", hi=MAX_SMALL, unit="tokens"),
        shared_kv_layers=count("attention.shared_kv_layers", MAX_LAYERS, "layers"),
        expert_gating=count("expert_gating_func", MAX_SMALL, "kind"),
        expert_weights_norm=k.raw("expert_weights_norm") is True,
        expert_weights_scale=_float(k.raw("expert_weights_scale")),
        swiglu_clamp_exp=_floats_per_layer(k.raw("swiglu_clamp_exp"), n_layer),
        swiglu_clamp_shexp=_floats_per_layer(k.raw("swiglu_clamp_shexp"), n_layer),
        indexer_kpool=k.get_int("attention.indexer.kpool", 0, hi=MAX_CONTEXT, unit="tokens") or 0,
        indexer_kpool_tail=k.raw("attention.indexer.kpool_select_tail") is not False,
        rope_sections=_ints(k.raw("rope.dimension_sections")),
        compress_ratios_raw=(
            k.per_layer("attention.compress_ratios", n_layer, hi=MAX_CONTEXT, unit="tokens")
            if k.raw("attention.compress_ratios") is not None
            else ()
        ),
        pooling=pooling,
        causal=causal,
        tied_embeddings=arch not in EMBEDDING_ARCHS
        and model_class != ModelClass.PROJECTOR
        and "output.weight" not in names
        and "token_embd.weight" in names,
        tensors=tuple(
            TensorEntry(t.name, t.type_name, t.shape, t.nbytes, h.data_offset + t.offset, i)
            for i, h in enumerate(headers)
            for t in h.tensors
        ),
        bytes_per_layer=per_layer,
        non_layer_bytes=other,
        dtypes=dtypes,
        warnings=tuple(warnings),
        rope_finetuned=k.raw("rope.scaling.finetuned") is not False,
        attn_res_block_size=count("attn_res.block_size", MAX_LAYERS, "layers"),
    )
    check_relations(meta, lambda f: k.name(_GGUF_KEYS.get(f, f)))
    return meta
