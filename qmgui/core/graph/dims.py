"""What a compute graph depends on: the model's hyper-parameters and the launch's values
(Dims), one reserve pass's token counts (Shape), and the layers worth replaying."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qmgui.core.launch import Resolved
from qmgui.core.meta import ModelMeta, Pooling, name_parts


@dataclass(frozen=True)
class Shape:
    """One reserve pass: tokens in the ubatch, sequences, rows that reach the output head."""

    n_tokens: int
    n_seqs: int
    n_outputs: int


@dataclass(frozen=True)
class Dims:
    """Model hyper-parameters and launch values the graph is built from."""

    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    head_k: int
    head_v: int
    n_ff: tuple[int, ...]
    names: frozenset[str]  # tensor names: optional tensors decide optional ops
    shapes: dict[str, tuple[int, ...]]
    # launch
    n_kv: int  # cells per KV stream
    n_kv_swa: int
    n_stream: int
    unified: bool
    flash_attn: bool
    type_k: str
    type_v: str
    rot_k: int  # Hadamard rotation block of a quantized K cache (0: none)
    rot_v: int
    n_expert: int
    n_expert_used: int
    leading_dense: int
    recurrent_layers: tuple[bool, ...]
    ssm: tuple[int, int, int, int, int]  # d_conv, d_inner, d_state, n_group, dt_rank (zeros: none)
    shortconv: int  # LFM2 short-convolution cache length (0: none)
    n_ctx_train: int
    pooling: str
    rwkv_head: int
    mla_kv_lora: int  # DeepSeek MLA compressed KV width (0: no MLA)
    mla_rope: int
    mla_head_k: int  # per-head Q/K width before absorption (nope + rope)
    mla_head_v: int
    swa_layers: tuple[bool, ...]
    layers: tuple[int, ...] = ()  # the layers replayed (see replay_layers)
    attn_res_block_size: int = 0  # ModelMeta.attn_res_block_size (Kimi K3)
    indexer_top_k: int = 0  # ModelMeta.indexer_top_k (DSA lightning indexers)
    indexer_block_size: int = 0  # ModelMeta.indexer_block_size (MiniMax-M3 MSA)
    # build_moe_ffn routing as the GGUF states it and the SwiGLU limits (ModelMeta's)
    expert_gating: int = 0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0
    swiglu_clamp_exp: tuple[float, ...] = ()
    swiglu_clamp_shexp: tuple[float, ...] = ()
    indexer_kpool: int = 0  # ModelMeta.indexer_kpool (glm5-next's k-pool indexer)
    indexer_kpool_tail: bool = True
    rope_sections: tuple[int, ...] = ()  # ModelMeta.rope_sections (M-RoPE)
    compress_ratios: tuple[int, ...] = ()  # ModelMeta.compress_ratios_raw (qwen4exp's QSA)
    ple_conv_floats: int = 0  # ModelMeta.ple_conv_floats (qwen4exp's PLE conv history)
    n_ubatch: int = 0  # the launch's physical batch (glm5-next gathers at 16 and under)
    rope_finetuned: bool = True  # ModelMeta.rope_finetuned (Granite hybrids rope where true)

    @property
    def iswa(self) -> bool:
        """The model has sliding-window layers and so a two-part KV cache."""
        return any(self.swa_layers)

    @property
    def use_mrope(self) -> bool:
        """llama_hparams::use_mrope: the first two rope sections are set."""
        r = self.rope_sections
        return len(r) > 1 and r[0] > 0 and r[1] > 0

    def clamp_exp(self, il: int) -> float:
        return self.swiglu_clamp_exp[il] if il < len(self.swiglu_clamp_exp) else 0.0

    def clamp_shexp(self, il: int) -> float:
        return self.swiglu_clamp_shexp[il] if il < len(self.swiglu_clamp_shexp) else 0.0

    def is_swa(self, il: int) -> bool:
        return il < len(self.swa_layers) and self.swa_layers[il]

    @property
    def n_embd_v_gqa_max(self) -> int:
        return max((self.head_v * h for h in self.n_head_kv), default=0)

    def has(self, name: str) -> bool:
        return name in self.names

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)


_QUANTIZED = frozenset({"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"})


def _rot(cache_type: str, head: int, *, grow: bool) -> int:
    """llama_kv_cache: a quantized cache whose heads are multiples of 64 rotates them with a
    Hadamard matrix of 64 (K: doubled while it divides the head)."""
    if cache_type not in _QUANTIZED or head <= 0 or head % 64:
        return 0
    n = 64
    while grow and head % (2 * n) == 0:
        n *= 2
    return n


def swa_cells(meta: ModelMeta, r: Resolved) -> int:
    """Cells per stream of the sliding-window KV cache (llama_kv_cache_iswa)."""
    if not meta.sliding_window or r.swa_full:
        return r.n_ctx_seq
    per_stream = meta.sliding_window * (r.n_seq if r.kv_unified else 1) + r.n_ubatch
    if meta.architecture == "deepseek4":
        # llama-kv-cache-dsv4.cpp: the raw cache keeps one stream per sequence, unified or not
        per_stream = meta.sliding_window + r.n_ubatch
    return min(r.n_ctx_seq, -(-per_stream // 256) * 256)


def tensor_names(meta: ModelMeta) -> frozenset[str]:
    """The model's tensor names: one set per model (its hash kept: graph keys hash it)."""
    return _named(meta)[0]


def tensor_shapes(meta: ModelMeta) -> dict[str, tuple[int, ...]]:
    """The model's tensor shapes by name: one dict per model, shared by every Dims built
    for it (never changed), so that a graph key can name it by its model
    (core.compute.built_key)."""
    return _named(meta)[1]


def _named(meta: ModelMeta) -> tuple[frozenset[str], dict[str, tuple[int, ...]]]:
    hit = _NAMED.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    named = (frozenset(t.name for t in meta.tensors), {t.name: t.shape for t in meta.tensors})
    if len(_NAMED) >= CACHE_KEPT:
        _NAMED.clear()
    _NAMED[id(meta)] = (meta, named)
    return named


_NAMED: dict[int, tuple[ModelMeta, tuple[frozenset[str], dict[str, tuple[int, ...]]]]] = {}


def dims(meta: ModelMeta, r: Resolved, embeddings: bool) -> Dims:
    n_layer = meta.n_layer
    n_head = meta.n_head or (0,) * n_layer
    head0 = next((h for h in n_head if h), 1)
    head_k = meta.head_dim_k or meta.n_embd // head0
    head_v = meta.head_dim_v or meta.n_embd // head0
    n_kv_swa = swa_cells(meta, r)
    # build_inp_mem_hybrid_iswa (src/llama-graph.cpp) builds no Hadamard inputs: a
    # recurrent hybrid with sliding-window attention (LFM2 with SWA) never rotates
    rotates = not (meta.sliding_window and any(meta.recurrent_layers))
    return Dims(
        arch=meta.architecture,
        n_layer=n_layer,
        n_embd=meta.n_embd,
        n_vocab=meta.vocab_size or 0,
        n_head=tuple(n_head),
        n_head_kv=tuple(meta.n_head_kv or n_head),
        head_k=head_k,
        head_v=head_v,
        n_ff=tuple(meta.n_ff or (0,) * n_layer),
        names=tensor_names(meta),
        shapes=tensor_shapes(meta),
        n_kv=r.n_ctx_seq,
        n_kv_swa=n_kv_swa,
        n_stream=r.n_stream,
        unified=r.kv_unified,
        # llama_init_from_model: "flash_attn is not compatible with Grok - forcing off"
        flash_attn=r.flash_attn and meta.architecture != "grok",
        type_k=r.cache_type_k,
        type_v=r.cache_type_v,
        rot_k=_rot(r.cache_type_k, head_k, grow=True) if rotates else 0,
        rot_v=_rot(r.cache_type_v, head_v, grow=False) if rotates else 0,
        n_expert=meta.n_expert,
        n_expert_used=meta.n_expert_used,
        swa_layers=tuple(meta.swa_layers) if meta.sliding_window else (),
        leading_dense=meta.leading_dense_layers,
        recurrent_layers=tuple(meta.recurrent_layers),
        ssm=(
            (
                meta.ssm.conv_kernel,
                meta.ssm.inner_size,
                meta.ssm.state_size,
                meta.ssm.group_count,
                meta.ssm.time_step_rank or 1,
            )
            if meta.ssm
            else (0, 0, 0, 0, 0)
        ),
        shortconv=meta.shortconv_l_cache or 0,
        n_ctx_train=meta.context_length or 0,
        pooling=meta.pooling.value if embeddings else Pooling.NONE.value,
        rwkv_head=meta.rwkv.head_size if meta.rwkv else 0,
        mla_kv_lora=meta.mla.kv_lora_rank if meta.mla else 0,
        mla_rope=(meta.mla.rope_dim or 0) if meta.mla else 0,
        mla_head_k=(meta.mla.key_length_mla or 0) if meta.mla else 0,
        mla_head_v=(meta.mla.value_length_mla or 0) if meta.mla else 0,
        layers=replay_layers(meta),
        attn_res_block_size=meta.attn_res_block_size,
        indexer_top_k=meta.indexer_top_k,
        indexer_block_size=meta.indexer_block_size,
        expert_gating=meta.expert_gating,
        expert_weights_norm=meta.expert_weights_norm,
        expert_weights_scale=meta.expert_weights_scale,
        swiglu_clamp_exp=meta.swiglu_clamp_exp,
        swiglu_clamp_shexp=meta.swiglu_clamp_shexp,
        indexer_kpool=meta.indexer_kpool,
        indexer_kpool_tail=meta.indexer_kpool_tail,
        rope_sections=meta.rope_sections,
        compress_ratios=meta.compress_ratios_raw,
        ple_conv_floats=meta.ple_conv_floats,
        n_ubatch=r.n_ubatch,
        rope_finetuned=meta.rope_finetuned,
    )


def _layer_signature(
    meta: ModelMeta, il: int, blocks: dict[int, list[tuple[str, tuple[int, ...]]]]
) -> tuple[object, ...]:
    """What makes one layer's part of the graph differ from another's."""

    def at(xs: Sequence[object], default: object = None) -> object:
        return xs[il] if il < len(xs) else default

    return (
        at(meta.n_head),
        at(meta.n_head_kv),
        at(meta.n_ff),
        at(meta.swa_layers, False),
        at(meta.recurrent_layers, False),
        il < meta.leading_dense_layers,
        tuple(sorted(blocks.get(il, []))),
    )


def replay_layers(meta: ModelMeta) -> tuple[int, ...]:
    """The layers whose graph the allocator replays: an irregular head of the stack, two
    periods (at least three layers) of its repeating part, and the last layer (which keeps
    only the output rows).

    ggml-alloc's state after a layer depends only on the layers before it, so once the
    repeating part has settled (best-fit placement can alternate between two layouts, hence
    more than one period) the high-water mark stops growing: replaying 94 layers gives the
    bytes replaying ~4 does. Two layers were not enough (qwen3next, period 1); two periods of
    at least three layers matched the full replay on all 5,099 measured launches, as did three
    and four periods. tests/core/test_compute.py checks the shortcut against the full replay.
    Cached per model: a fit search asks dozens of times.
    """
    return _replay_plan(meta)[0]


def replay_period(meta: ModelMeta) -> int:
    """The period of the repeating part replay_layers found (0: none, every layer kept)."""
    return _replay_plan(meta)[1]


def _replay_plan(meta: ModelMeta) -> tuple[tuple[int, ...], int]:
    hit = _REPLAY_CACHE.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    plan = _replay_plan_uncached(meta)
    if len(_REPLAY_CACHE) >= CACHE_KEPT:
        _REPLAY_CACHE.clear()
    _REPLAY_CACHE[id(meta)] = (meta, plan)
    return plan


CACHE_KEPT = 32  # models whose derived values are kept (the UI plans a handful at a time)


_REPLAY_CACHE: dict[int, tuple[ModelMeta, tuple[tuple[int, ...], int]]] = {}


def layer_signatures(meta: ModelMeta) -> tuple[int, ...]:
    """Per layer, a number that two layers share when their parts of the graph are built
    alike (_layer_signature). Cached per model."""
    hit = _SIGNATURES.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    blocks: dict[int, list[tuple[str, tuple[int, ...]]]] = {}
    for t, (idx, rest) in zip(meta.tensors, name_parts(meta), strict=True):
        if idx:
            blocks.setdefault(int(idx), []).append((rest, t.shape))
    ids: dict[tuple[object, ...], int] = {}
    sig = tuple(
        ids.setdefault(_layer_signature(meta, il, blocks), len(ids)) for il in range(meta.n_layer)
    )
    if len(_SIGNATURES) >= CACHE_KEPT:
        _SIGNATURES.clear()
    _SIGNATURES[id(meta)] = (meta, sig)
    return sig


_SIGNATURES: dict[int, tuple[ModelMeta, tuple[int, ...]]] = {}


def _replay_plan_uncached(meta: ModelMeta) -> tuple[tuple[int, ...], int]:
    """(replay_layers, replay_period)."""
    n = meta.n_layer
    if n <= 3:
        return tuple(range(n)), 0
    sig = layer_signatures(meta)[: n - 1]
    best: tuple[int, int, int] | None = None  # (kept layers, start, period)
    for start in range(len(sig)):
        if best is not None and start >= best[0]:
            break
        for period in range(1, (len(sig) - start) // 2 + 1):
            if all(sig[i] == sig[i - period] for i in range(start + period, len(sig))):
                kept = start + max(2 * period, 3)
                if best is None or kept < best[0]:
                    best = (kept, start, period)
                break
    if best is None or best[0] >= n - 1:
        return tuple(range(n)), 0
    return (*range(best[0]), n - 1), best[2]
