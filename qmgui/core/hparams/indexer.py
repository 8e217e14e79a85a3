"""Sparse-attention indexers (DeepSeek-V3.2 DSA, GLM-DSA, MiniMax-M3 MSA, k-pool indexers)
and DeepSeek-V4's compressed caches: the key cache kept beside the attention KV, and where."""

from __future__ import annotations

from collections.abc import Sequence

from qmgui.core.hparams.keys import MAX_CONTEXT, MAX_HEAD_DIM, MAX_LAYERS, Keys
from qmgui.core.hparams.mla import MlaDims

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
ARCHS = INDEXER_ARCHS


def indexer_types(k: Keys, n_layer: int, default: Sequence[bool]) -> tuple[bool, ...]:
    """{arch}.attention.indexer.types: which layers own an indexer ("full"), a scalar or a
    per-layer array (get_key_or_arr), else `default`."""
    v = k.raw("attention.indexer.types")
    if isinstance(v, tuple) and v:
        flags = tuple(bool(x) for x in v)
        return (flags + (False,) * n_layer)[:n_layer]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (bool(v),) * n_layer
    return tuple(default)


def indexer(
    k: Keys,
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
    layers = indexer_layers(k, arch, n_layer, recurrent) if head else None
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


def indexer_layers(
    k: Keys, arch: str, n_layer: int, recurrent: tuple[bool, ...]
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
    types = indexer_types(k, n_layer, default)
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


def compress_ratios(k: Keys, arch: str, n_layer: int) -> tuple[int, ...]:
    """DeepSeek-V4: per layer, how many tokens one compressed KV entry stands for."""
    if arch == "deepseek4" and k.raw("attention.compress_ratios") is not None:
        return k.per_layer("attention.compress_ratios", n_layer, hi=MAX_CONTEXT, unit="tokens")
    return ()
