"""Normalised model metadata: one `ModelMeta` for a GGUF header or a Hugging Face config.

Everything the sizing core needs is resolved here, per layer where models vary per layer (KV
heads, sliding-window layers, recurrent layers), so the sizing code never reads raw keys.
Per-architecture defaults mirror llama.cpp's `llama-model.cpp` (hparams loading); where a key
is missing and no default is known the field is None, never a guess.
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
from qmgui.core.textsafe import printable

# --- plausibility limits ---------------------------------------------------------------------
# What a header (or config.json) may claim. Each count below sizes a loop, a per-layer tuple or
# a graph the sizing code builds, so each is checked before use; the limits sit far above any
# real model, and a value past one is a broken or hostile file: that file's row error, a
# sentence naming the key and the value (ModelReadError), never an exception from deeper down.
# llama.cpp's LLAMA_MAX_LAYERS (it loads no more); the deepest real models have ~130 layers
MAX_LAYERS = 512
MAX_EMBD = 1 << 20  # embedding width: 64x the widest real model (Llama 3.1 405B: 16,384)
MAX_WIDTH = 1 << 22  # feed-forward, SSM inner size, LoRA ranks: 80x the widest (405B: 53,248)
MAX_HEAD_DIM = 1 << 16  # values per K/V head: the largest real one is 576 (MLA 512 + 64 rope)
MAX_EXPERTS = 4096  # 8x llama.cpp's LLAMA_MAX_EXPERTS (512); Kimi K2 has 384
# experts used per token: each is a view per MoE layer in the replayed graph; real models use
# 1 to 16 (Qwen3-Next: 10 of 512)
MAX_EXPERTS_USED = 256
MAX_CONTEXT = 1 << 28  # tokens: 25x the longest trained context (Llama 4 Scout: 10,485,760)
MAX_VOCAB = 1 << 22  # 16x the largest vocabulary (Gemma 3: 262,208)
MAX_SMALL = 1024  # conv kernels, token-shift counts, short-conv caches (real ones: 2 to 4)
MAX_NAME_LEN = 256  # a model's display name is cut here (general.name may hold 16 MiB)
_ARCH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")  # "llama", "nemotron_h_moe"


class ImplausibleValue(Exception):
    """A metadata value no real model has (the sentence names the key and the value). Raised
    inside the readers only; `meta_from_gguf` and `meta_from_hf` turn it into a
    ModelReadError naming the file."""


def shown(v: object) -> str:
    """A metadata value as a short, printable phrase for an error sentence."""
    if isinstance(v, str):
        cut = printable(v[:40])
        return f'"{cut}..." ({len(v):,} characters)' if len(v) > 40 else f'"{cut}"'
    if isinstance(v, ArrayInfo):
        return f"an array of {v.count:,} values"
    if isinstance(v, (tuple, list)):
        head = ", ".join(shown(x) for x in v[:4])
        return f"[{head}, ...] ({len(v):,} values)" if len(v) > 4 else f"[{head}]"
    if isinstance(v, dict):
        return f"an object of {len(v):,} keys"
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} digits)"


def checked_count(key: str, v: object, hi: int, unit: str) -> int:
    """`v` as a whole number from 0 to `hi`; ImplausibleValue naming `key` and `v` otherwise
    (negative, too large, fractional, infinite, NaN, text or an array where a number goes)."""
    if isinstance(v, bool):
        n = int(v)
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float) and math.isfinite(v) and v.is_integer():
        n = int(v)
    elif isinstance(v, float):
        raise ImplausibleValue(f"{key} is {shown(v)}; a number of {unit} is a whole number")
    else:
        raise ImplausibleValue(f"{key} is {shown(v)}; expected a number of {unit}")
    if not 0 <= n <= hi:
        raise ImplausibleValue(f"{key} is {shown(n)}, outside 0 to {hi:,} {unit}")
    return n


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
class MlaDims:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi): the compressed KV dimensions."""

    kv_lora_rank: int
    q_lora_rank: int | None
    rope_dim: int | None  # qk_rope_head_dim
    key_length_mla: int | None  # per-head K size before compression (None on old GGUFs)
    value_length_mla: int | None


@dataclass(frozen=True)
class SsmDims:
    """Mamba / gated-delta-net state dimensions."""

    conv_kernel: int
    inner_size: int
    state_size: int
    group_count: int
    time_step_rank: int | None


@dataclass(frozen=True)
class LinearAttnDims:
    """Kimi delta attention (KDA: kimi-linear, kimi-k3, bailingmoe3, glm5-next) or MiniMax-01
    lightning attention: a head_dim x head_dim state per head (llama-hparams.cpp n_embd_s)."""

    head_dim: int  # {arch}.kda.head_dim; MiniMax-01: the attention key length
    n_head: int  # llama.cpp sizes the state with n_head(), layer 0's head count
    conv_kernel: int  # KDA's Q, K and V short convolutions (ssm.conv_kernel); 0: none
    kda: bool  # KDA keeps conv states; lightning attention keeps none


@dataclass(frozen=True)
class RwkvDims:
    head_size: int
    token_shift_count: int


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
    pooling: Pooling = Pooling.NONE
    causal: bool = True
    tied_embeddings: bool = False
    tensors: tuple[TensorEntry, ...] = ()
    bytes_per_layer: tuple[int, ...] = ()  # weights of blk.N / model.layers.N
    non_layer_bytes: int = 0  # embeddings, output, norms
    dtypes: Mapping[str, int] = field(default_factory=dict)  # dtype label -> bytes
    warnings: tuple[str, ...] = ()  # things a user should know (old MLA GGUF, unknown arch)

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
PURE_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# hybrids whose attention layers are those with head_count_kv > 0
HYBRID_BY_KV_ARCHS = frozenset(
    {
        "jamba",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "plamo2",
        "nemotron_h",
        "nemotron_h_moe",
        "kimi-linear",
        "kimi-k3",
        "bailingmoe3",
        "glm5-next",
    }
)
INTERVAL_HYBRID_ARCHS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "minimax-01"})
# architectures whose recurrent layers are Kimi delta attention ({arch}.kda.head_dim)
KDA_ARCHS = frozenset({"kimi-linear", "kimi-k3", "bailingmoe3", "glm5-next"})
MLA_ARCHS = frozenset(
    {"deepseek2", "deepseek2ocr", "kimi-linear", "minicpm3", "glm-dsa", "mistral4"}
)
# llama.cpp's sliding-window layout per architecture when the GGUF carries no per-layer
# sliding_window_pattern array (models/<arch>.cpp, load_swa_pattern / set_swa_pattern):
# arch -> (period, dense_first, window used when the GGUF has none). With period p, layer il
# slides when il % p < p - 1 (the last of each group is full attention); dense_first flips it
# to il % p != 0. Period 0 means every layer slides, 1 that none does. An architecture not
# listed here gets no sliding layers: charging full attention never under-estimates.
SWA_RULES: dict[str, tuple[int, bool, int | None]] = {
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, None),
    "gemma3n": (5, False, None),
    "gemma-embedding": (6, False, None),
    "cohere2": (4, False, None),
    "cohere2moe": (4, True, None),
    "gpt-oss": (2, False, None),
    "llama4": (4, False, 8192),
    "exaone4": (4, False, None),
    "exaone-moe": (4, False, None),
    "olmo2": (4, False, None),
    "afmoe": (4, False, None),
    "smallthinker": (4, True, None),
    "laguna": (4, True, None),
    "mellum": (4, False, None),
    "muse-glimmer": (4, False, None),
    "plamo3": (8, False, None),
    "modern-bert": (3, True, None),
    "phi3": (1, False, None),
    "deepseek4": (0, False, None),
}

# ASCII digits, at most 9: "blk.<5,000 digits>." is no layer (and int() would refuse it)
_BLK = re.compile(r"^blk\.([0-9]{1,9})\.")
_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


class _Keys:
    """Typed, checked access to `{arch}.*` keys of one header: every count is a whole number
    within its limit before anything is sized by it (ImplausibleValue otherwise)."""

    def __init__(self, md: Mapping[str, MetaValue], arch: str) -> None:
        self.md = md
        self.arch = arch

    def name(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def raw(self, key: str) -> MetaValue | None:
        return self.md.get(f"{self.arch}.{key}")

    def get_int(self, key: str, default: int | None = None, *, hi: int, unit: str) -> int | None:
        """A count; an array of counts gives its largest element."""
        v = self.raw(key)
        if v is None:
            return default
        if isinstance(v, tuple):
            if not v:
                return default
            return max(self.element(key, i, x, hi, unit) for i, x in enumerate(v))
        return checked_count(self.name(key), v, hi, unit)

    def element(self, key: str, i: int, x: object, hi: int, unit: str) -> int:
        return checked_count(f"{self.name(key)}[{i}]", x, hi, unit)

    def per_layer(
        self, key: str, n_layer: int, default: int = 0, *, hi: int, unit: str
    ) -> tuple[int, ...]:
        """A scalar repeated per layer, or a per-layer array read element by element (a short
        array repeats its last element; `n_layer` is already bounded by MAX_LAYERS)."""
        v = self.raw(key)
        if v is None:
            return (default,) * n_layer
        if isinstance(v, tuple):
            if len(v) > MAX_LAYERS:
                raise ImplausibleValue(
                    f"{self.name(key)} is {shown(v)}: more values than a model has layers "
                    f"(at most {MAX_LAYERS})"
                )
            vals = tuple(self.element(key, i, x, hi, unit) for i, x in enumerate(v))
            if len(vals) >= n_layer:
                return vals[:n_layer]
            return vals + (vals[-1] if vals else default,) * (n_layer - len(vals))
        return (checked_count(self.name(key), v, hi, unit),) * n_layer


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


def _swa_layers(
    k: _Keys, arch: str, n_layer: int, n_swa: int | None, kv: tuple[int, ...]
) -> tuple[bool, ...]:
    if not n_swa or (arch == "exaone4" and n_layer != 64):
        # exaone4: llama.cpp slides only in the 32B (64 layers; models/exaone4.cpp), the
        # others keep full attention whatever their sliding_window says
        return (False,) * n_layer
    pattern = k.raw("attention.sliding_window_pattern")
    if isinstance(pattern, tuple) and pattern:
        flags = tuple(bool(x) for x in pattern)
        return (flags + (False,) * n_layer)[:n_layer]
    if arch in ("lfm2", "lfm2moe"):
        return tuple(h > 0 for h in kv)
    rule = SWA_RULES.get(arch)
    if rule is None:
        return (False,) * n_layer
    period, dense_first = rule[0], rule[1]
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        period = checked_count(
            k.name("attention.sliding_window_pattern"), pattern, MAX_LAYERS, "layers"
        )
    if period == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layer))
    return tuple(il % period < period - 1 for il in range(n_layer))


def _recurrent_layers(
    k: _Keys, arch: str, n_layer: int, kv: tuple[int, ...], ff: tuple[int, ...]
) -> tuple[bool, ...]:
    if arch in PURE_RECURRENT_ARCHS:
        return (True,) * n_layer
    if arch in INTERVAL_HYBRID_ARCHS:
        # llama.cpp reads {arch}.attention.recurrent_layers (models/qwen35.cpp: get_key_or_arr
        # LLM_KV_ATTENTION_RECURRENT_LAYERS), else full_attention_interval
        arr = k.raw("attention.recurrent_layers")
        if isinstance(arr, tuple) and arr:
            flags = tuple(bool(x) for x in arr)
            return (flags + (False,) * n_layer)[:n_layer]
        if isinstance(arr, (bool, int)):
            return (bool(arr),) * n_layer  # one value for every layer
        default = 8 if arch == "minimax-01" else 4  # models/minimax-01.cpp: 8
        interval = (
            k.get_int("full_attention_interval", default, hi=MAX_LAYERS, unit="layers") or default
        )
        return tuple((il + 1) % interval != 0 for il in range(n_layer))
    if arch in ("nemotron_h", "nemotron_h_moe"):
        # attention layers have KV heads, MLP-only layers have a feed-forward, the rest are SSM
        return tuple(kv[il] == 0 and ff[il] == 0 for il in range(n_layer))
    if arch == "falcon-h1":
        return (True,) * n_layer  # every layer has both an SSM and attention
    if arch in HYBRID_BY_KV_ARCHS:
        return tuple(h == 0 for h in kv)  # llama.cpp: is_recr = n_head_kv(il) == 0
    return (False,) * n_layer


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


def _mla_dims(k: _Keys, arch: str, warnings: list[str]) -> MlaDims | None:
    kv_lora = k.get_int("attention.kv_lora_rank", hi=MAX_WIDTH, unit="values")
    if not kv_lora:
        return None

    def head(key: str) -> int | None:
        # a key written as 0 is no value: llama.cpp's is_mla() needs key_length_mla and
        # value_length_mla both non-zero, else it caches full K and V (llama-hparams.cpp)
        return k.get_int(key, hi=MAX_HEAD_DIM, unit="values per head") or None

    mla = MlaDims(
        kv_lora_rank=kv_lora,
        q_lora_rank=k.get_int("attention.q_lora_rank", hi=MAX_WIDTH, unit="values"),
        rope_dim=head("rope.dimension_count"),
        key_length_mla=head("attention.key_length_mla"),
        value_length_mla=head("attention.value_length_mla"),
    )
    if mla.key_length_mla is None and arch in MLA_ARCHS:
        warnings.append(
            "old MLA GGUF (no key_length_mla): llama.cpp caches full K and V "
            "for it, far more memory than a re-converted file"
        )
    return mla


def _ssm_dims(k: _Keys) -> SsmDims | None:
    def width(key: str) -> int:
        return k.get_int(key, 0, hi=MAX_WIDTH, unit="values") or 0

    if not width("ssm.state_size"):
        return None
    return SsmDims(
        conv_kernel=k.get_int("ssm.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0,
        inner_size=width("ssm.inner_size"),
        state_size=width("ssm.state_size"),
        group_count=width("ssm.group_count"),
        time_step_rank=k.get_int("ssm.time_step_rank", hi=MAX_WIDTH, unit="values"),
    )


def _linear_attn_dims(
    k: _Keys, arch: str, n_head: tuple[int, ...], head_dim_k: int | None
) -> LinearAttnDims | None:
    """KDA (models/kimi-linear.cpp: get_key LLM_KV_KDA_HEAD_DIM) or MiniMax-01 lightning
    attention (models/minimax-01.cpp: n_embd_head_la = n_embd_head_k_full)."""
    heads = n_head[0] if n_head else 0
    if arch in KDA_ARCHS:
        head = k.get_int("kda.head_dim", 0, hi=MAX_HEAD_DIM, unit="values per head") or 0
        conv = k.get_int("ssm.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0
        return LinearAttnDims(head, heads, conv, kda=True) if head else None
    if arch == "minimax-01" and head_dim_k:
        return LinearAttnDims(head_dim_k, heads, 0, kda=False)
    return None


INDEXER_ARCHS = frozenset(
    {
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "dots3note",
        "hy_v4",
        "minimax-m3",
        "glm5-next",
        "qwen4exp",
    }
)
DSV4_CSA_RATIO = 4  # llama-kv-cache-dsv4.cpp: compressed sparse attention (with an indexer)
DSV4_HCA_RATIO = 128  # heavily compressed attention


def _indexer_types(k: _Keys, n_layer: int, default: Sequence[bool]) -> tuple[bool, ...]:
    """{arch}.attention.indexer.types: which layers own an indexer ("full"), a scalar or a
    per-layer array (get_key_or_arr), else `default`."""
    v = k.raw("attention.indexer.types")
    if isinstance(v, tuple) and v:
        flags = tuple(bool(x) for x in v)
        return (flags + (False,) * n_layer)[:n_layer]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (bool(v),) * n_layer
    return tuple(default)


def _indexer(
    k: _Keys,
    arch: str,
    n_layer: int,
    *,
    recurrent: tuple[bool, ...],
    mla: MlaDims | None,
    head_dim_v: int | None,
) -> tuple[int, int, tuple[bool, ...]]:
    """(key values per cell, V values per cell, layers) of the indexer cache llama.cpp keeps
    beside the attention KV (llama_model::create_memory; llama-kv-cache-dsa.cpp,
    llama-kv-cache-msa.cpp, llama-memory-hybrid-idx.cpp): one key head of
    indexer.key_length per layer (a k-pool indexer keeps kpool_row of them side by side)."""
    head = k.get_int("attention.indexer.key_length", 0, hi=MAX_HEAD_DIM, unit="values") or 0
    layers = _indexer_layers(k, arch, n_layer, recurrent) if head else None
    if layers is None:
        return 0, 0, ()
    if arch == "glm5-next":
        # key | gate | pooled key side by side (indexer_kpool_row 3)
        kpool = k.get_int("attention.indexer.kpool", 0, hi=MAX_CONTEXT, unit="tokens") or 0
        return head * (3 if kpool > 0 else 1), 0, layers
    if arch == "qwen4exp":
        # raw key | pooled key (kpool_row 2) when a layer compresses
        ratios = k.raw("attention.compress_ratios")
        vals = ratios if isinstance(ratios, tuple) else (ratios,)
        kpool = any(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in vals)
        return head * (2 if kpool else 1), 0, layers
    # an MLA model's caches keep no V (is_mla: key_length_mla and value_length_mla set)
    is_mla = mla is not None and bool(mla.key_length_mla) and bool(mla.value_length_mla)
    return head, 0 if is_mla else (head_dim_v or 0), layers


def _indexer_layers(
    k: _Keys, arch: str, n_layer: int, recurrent: tuple[bool, ...]
) -> tuple[bool, ...] | None:
    """The layers create_memory's indexer filter keeps (None: no indexer cache)."""
    if arch not in INDEXER_ARCHS:
        return None
    trunk = n_layer - (k.get_int("nextn_predict_layers", 0, hi=MAX_LAYERS, unit="layers") or 0)
    rec = recurrent or (False,) * n_layer
    if arch == "glm-dsa":
        # models/glm-dsa.cpp: every layer before GLM 5.2 (trained context < 1M), else its
        # pattern (layers 0, 1, then every fourth from 2, over 78 layers)
        ctx = k.get_int("context_length", 0, hi=MAX_CONTEXT, unit="tokens") or 0
        default = tuple(
            ctx < 1048576 or (il < 78 and (il < 2 or (il - 2) % 4 == 0)) for il in range(n_layer)
        )
    else:
        default = (arch == "glm5-next",) * n_layer
    types = _indexer_types(k, n_layer, default)
    if arch == "hy_v4":
        # a full-attention checkpoint (no top_k) has no indexer cache
        top_k = k.get_int("attention.indexer.top_k", 0, hi=MAX_CONTEXT, unit="tokens")
        return types if top_k else None
    if arch == "minimax-m3":
        lead = k.get_int("leading_dense_block_count", 0, hi=MAX_LAYERS, unit="layers") or 0
        return tuple(il >= lead for il in range(n_layer))
    if arch == "deepseek4":
        # llama-kv-cache-dsv4.cpp: the lightning indexer's cache sits on the CSA layers
        ratios = k.per_layer("attention.compress_ratios", n_layer, hi=MAX_CONTEXT, unit="tokens")
        return tuple(x == DSV4_CSA_RATIO for x in ratios)
    if arch in ("deepseek32", "qwen4exp"):
        types = (True,) * n_layer
    # glm5-next, qwen4exp: the attention layers only (recurrent ones keep none)
    return tuple(il < trunk and types[il] and not rec[il] for il in range(n_layer))


def _ple_state(k: _Keys, arch: str, n_layer: int, n_embd: int) -> tuple[int, tuple[bool, ...]]:
    """models/qwen4exp.cpp: ple.layers lists the PLE layer; its conv history holds
    (ple.conv_kernel - 1) x ple.ngram_size x hyper_connection.count x n_embd floats."""
    layers = k.raw("ple.layers")
    if arch != "qwen4exp" or not isinstance(layers, tuple) or not layers:
        return 0, ()
    flags = [False] * n_layer
    for i, x in enumerate(layers):
        il = k.element("ple.layers", i, x, MAX_LAYERS, "layers")
        if il < n_layer:
            flags[il] = True
    kernel = k.get_int("ple.conv_kernel", 0, hi=MAX_SMALL, unit="values") or 0
    ngram = k.get_int("ple.ngram_size", 0, hi=MAX_SMALL, unit="tokens") or 0
    hc = k.get_int("hyper_connection.count", 0, hi=MAX_SMALL, unit="streams") or 0
    if not (kernel and ngram and hc):
        return 0, ()
    return (kernel - 1) * ngram * hc * n_embd, tuple(flags)


def _rwkv_dims(k: _Keys) -> RwkvDims | None:
    head = k.get_int("wkv.head_size", 0, hi=MAX_HEAD_DIM, unit="values per head") or 0
    if not head:
        return None
    return RwkvDims(
        head_size=head,
        token_shift_count=k.get_int("token_shift_count", 2, hi=MAX_SMALL, unit="states") or 2,
    )


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


def _check_blocks(k: _Keys, n_layer: int, tensors: Sequence[TensorInfo]) -> None:
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
    k = _Keys(md, arch)
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

    mla = _mla_dims(k, arch, warnings)
    ssm = _ssm_dims(k)
    rwkv = _rwkv_dims(k)

    pooling_id = k.raw("pooling_type")
    pooling = _POOLING_BY_ID.get(pooling_id if isinstance(pooling_id, int) else 0, Pooling.NONE)
    causal_raw = k.raw("attention.causal")
    causal = bool(causal_raw) if isinstance(causal_raw, bool) else arch not in EMBEDDING_ARCHS
    n_swa = k.get_int("attention.sliding_window", hi=MAX_CONTEXT, unit="tokens")
    if n_swa is None and arch in SWA_RULES:
        n_swa = SWA_RULES[arch][2]  # the engine's default window for this architecture
    n_swa = n_swa or None

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

    recurrent_layers = _recurrent_layers(k, arch, n_layer, n_head_kv, n_ff)
    indexer = _indexer(k, arch, n_layer, recurrent=recurrent_layers, mla=mla, head_dim_v=head_dim_v)
    ple = _ple_state(k, arch, n_layer, n_embd)

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
        swa_layers=_swa_layers(k, arch, n_layer, n_swa, n_head_kv),
        mla=mla,
        n_expert=count("expert_count", MAX_EXPERTS, "experts"),
        n_expert_used=count("expert_used_count", MAX_EXPERTS_USED, "experts"),
        n_expert_shared=count("expert_shared_count", MAX_EXPERTS, "experts"),
        leading_dense_layers=count("leading_dense_block_count", MAX_LAYERS, "layers"),
        nextn_layers=count("nextn_predict_layers", MAX_LAYERS, "layers"),
        ssm=ssm,
        rwkv=rwkv,
        linear_attn=_linear_attn_dims(k, arch, n_head, head_dim_k),
        indexer_dim=indexer[0],
        indexer_v_dim=indexer[1],
        indexer_layers=indexer[2],
        ple_conv_floats=ple[0],
        ple_layers=ple[1],
        compress_ratios=k.per_layer(
            "attention.compress_ratios", n_layer, hi=MAX_CONTEXT, unit="tokens"
        )
        if arch == "deepseek4" and k.raw("attention.compress_ratios") is not None
        else (),
        recurrent_layers=recurrent_layers,
        shortconv_l_cache=k.get_int("shortconv.l_cache", hi=MAX_SMALL, unit="tokens"),
        shared_kv_layers=count("attention.shared_kv_layers", MAX_LAYERS, "layers"),
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
    )
    check_relations(meta, lambda f: k.name(_GGUF_KEYS.get(f, f)))
    return meta
