"""Launch settings for llama-server, as the user gives them and as the engine resolves them.

`LaunchSettings` holds what the user picked (None = the engine's default); `resolve()` turns it
into `Resolved`, the values llama-server really runs with (its `llama_context:` log lines), so
every sizing function works from the same numbers the engine uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.errors import SizingError
from qmgui.core.meta import MAX_CONTEXT, ModelMeta

# llama-server defaults (b9xxx-b11xxx): `--help` of the test engine
DEFAULT_BATCH = 2048  # -b
DEFAULT_UBATCH = 512  # -ub
AUTO_PARALLEL = 4  # -np -1 (auto) gives 4 slots with a unified KV cache
CTX_PAD = 256  # n_ctx and per-sequence context are padded to this many cells
MAX_SEQ = 256  # LLAMA_MAX_SEQ: the most sequences (slots) one llama.cpp context holds

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# bytes per block and elements per block of each KV cache type (ggml type traits)
CACHE_TYPE_BLOCK: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "iq4_nl": (18, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
}


def pad(n: int, to: int) -> int:
    return -(-n // to) * to


def row_bytes(cache_type: str, n_elements: int) -> int:
    """Bytes of one row of `n_elements` in a cache type (whole quantisation blocks)."""
    size, block = CACHE_TYPE_BLOCK[cache_type]
    return -(-n_elements // block) * size


@dataclass(frozen=True)
class LaunchSettings:
    """What the user asked for; None means "the engine's default"."""

    ctx_size: int | None = None  # -c: total cells across slots; 0 or None = trained context
    parallel: int | None = None  # -np; None = auto
    kv_unified: bool | None = None  # -kvu / -no-kvu; None = engine default
    batch_size: int = DEFAULT_BATCH
    ubatch_size: int = DEFAULT_UBATCH
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # on / off / auto
    n_gpu_layers: int | None = None  # -ngl; None = engine default (all layers that fit)
    n_cpu_moe: int = 0  # --n-cpu-moe
    cpu_moe: bool = False  # --cpu-moe
    swa_full: bool = False
    kv_offload: bool = True  # False = -nkvo
    tensor_split: tuple[float, ...] = ()
    mmap: bool = True
    repack: bool = True  # CPU weight repacking (AMX / CPU_REPACK copies)


@dataclass(frozen=True)
class Resolved:
    """The values the engine runs with (llama_context's log lines)."""

    n_ctx: int
    n_ctx_seq: int
    n_seq: int  # n_seq_max: slots
    kv_unified: bool
    n_stream: int  # KV streams: 1 when unified, else n_seq
    n_batch: int
    n_ubatch: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: bool
    swa_full: bool


def _check_cache_types(meta: ModelMeta, s: LaunchSettings, fa: bool) -> None:
    """The cache-type combinations llama.cpp refuses at load (measured on the test engine)."""
    for t in (s.cache_type_k, s.cache_type_v):
        if t not in CACHE_TYPE_BLOCK:
            raise SizingError(f"unknown KV cache type {t!r}; use one of {', '.join(CACHE_TYPES)}")
    if s.cache_type_v not in ("f32", "f16", "bf16") and not fa:
        raise SizingError(
            "a quantized V cache needs flash attention: set --flash-attn on or use an f16 V cache"
        )
    # llama_init_from_model: an absorbed-MLA cache (K and V widths of the latent: DeepSeek,
    # Kimi, GLM-DSA) or DeepSeek-V4's keeps one type; MiniCPM3 and pre-split DeepSeek GGUFs,
    # whose latent is decompressed per head, take different types
    mla_cache = meta.mla is not None and bool(meta.mla.key_length_mla and meta.mla.value_length_mla)
    if (mla_cache or meta.architecture == "deepseek4") and s.cache_type_k != s.cache_type_v:
        raise SizingError(
            "this model's latent-attention cache has one type: set the same --cache-type-k "
            "and --cache-type-v"
        )
    if fa:
        # flash attention reads whole quantisation blocks of each head
        for kind, t, dim in (
            ("K", s.cache_type_k, meta.head_dim_k),
            ("V", s.cache_type_v, meta.head_dim_v),
        ):
            block = CACHE_TYPE_BLOCK[t][1]
            if dim and dim % block:
                raise SizingError(
                    f"{t} {kind} cache blocks of {block} do not divide this "
                    f"model's {kind} head size {dim} with flash attention; use "
                    f"f16 or --flash-attn off"
                )


def _check_counts(s: LaunchSettings) -> None:
    """The ranges llama-server takes; SizingError with the range otherwise (settings reach
    here from the window and stored overrides as well as from the command line)."""
    if s.ctx_size is not None and not 0 <= s.ctx_size <= MAX_CONTEXT:
        raise SizingError(
            f"context size {s.ctx_size}: give 1 to {MAX_CONTEXT:,} tokens (0: the trained one)"
        )
    if s.parallel is not None and s.parallel > MAX_SEQ:
        raise SizingError(f"{s.parallel} slots: llama.cpp holds 1 to {MAX_SEQ} (-1: auto)")
    for what, n in (("batch", s.batch_size), ("micro-batch", s.ubatch_size)):
        if not 1 <= n <= MAX_CONTEXT:
            raise SizingError(f"{what} size {n}: give 1 to {MAX_CONTEXT:,} tokens")


def resolve(
    meta: ModelMeta, s: LaunchSettings, *, flash_attn_auto: bool = True, embeddings: bool = False
) -> Resolved:
    """Resolve user settings the way llama-server does; SizingError for what it refuses.

    `flash_attn_auto` is what "auto" becomes on the target backend (enabled on the CPU and
    recent GPUs); `embeddings` is the server's --embedding mode (pooled models).
    """
    if s.flash_attn not in ("on", "off", "auto"):
        raise SizingError(f"flash attention must be on, off or auto, not {s.flash_attn!r}")
    _check_counts(s)
    fa = s.flash_attn == "on" or (s.flash_attn == "auto" and flash_attn_auto)
    # a quantized V with "auto" turns flash attention on rather than failing
    if s.flash_attn == "auto" and s.cache_type_v not in ("f32", "f16", "bf16"):
        fa = True
    if meta.architecture == "grok":
        fa = False  # llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
    _check_cache_types(meta, s, fa)
    if s.parallel is None or s.parallel < 0:
        # slots "auto": 4 slots sharing one unified cache, whatever -kvu/-no-kvu says
        n_seq, unified = AUTO_PARALLEL, True
    else:
        n_seq, unified = max(1, s.parallel), bool(s.kv_unified)
    trained = meta.context_length or 4096
    ctx = s.ctx_size if s.ctx_size else trained
    n_ctx = pad(ctx, CTX_PAD)
    n_ctx_seq = n_ctx if unified else pad(n_ctx // n_seq, CTX_PAD)
    if not unified:
        n_ctx = n_ctx_seq * n_seq
    # embedding mode processes a whole input in one ubatch: the server caps -b at -ub
    b_eff = min(s.batch_size, s.ubatch_size) if embeddings else s.batch_size
    # the server caps the batch at the context it was given (before padding); encoders take
    # the batch as it is
    n_batch = min(ctx, b_eff) if meta.causal else b_eff
    n_ubatch = min(n_batch, s.ubatch_size)
    return Resolved(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_seq=n_seq,
        kv_unified=unified,
        n_stream=1 if unified else n_seq,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        cache_type_k=s.cache_type_k,
        cache_type_v=s.cache_type_v,
        flash_attn=fa,
        swa_full=s.swa_full,
    )
