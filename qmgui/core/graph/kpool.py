"""The k-pool sparse-attention indexer shared by glm5-next and qwen4exp's QSA: the inputs
(build_inp_kpool), the reserve's pool counts (llama-memory-hybrid-idx.cpp) and the scatter
of the selected cells into an additive KQ mask (src/models/glm5-next.cpp
build_kpool_select, src/models/qwen4exp.cpp build_qsa_sel)."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.compile import CELLS, SYM_U
from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def scratch(type_: str, *ne: int) -> Tensor:
    """ggml_new_tensor that is no graph input (a ggml_fill target): a leaf, which ggml-alloc
    allocates with the inputs before the first node (its fill then reuses it in place)."""
    return Tensor(type_, ne)


def fill(b: Builder, type_: str, *ne: int) -> Tensor:
    """ggml_fill of a fresh tensor."""
    return b.g.op("fill", scratch(type_, *ne))


def kpool_pad(n_pool: int) -> int:
    """kpool_pad (llama-memory-hybrid-idx.cpp): one more than the pools, padded to 64."""
    return max(64, -(-(n_pool + 1) // 64) * 64)


@dataclass
class KpoolInputs:
    """build_inp_kpool's inputs and the reserve's counts: kpool tokens a pool, n_pool pools
    (padded), n_new pools re-pooled, n_top pools selected, n_sel selected cells (their
    members plus the tail). The glm5-next slot mask and qwen4exp's M-RoPE positions of the
    new pools are each one model's."""

    kpool: int
    n_pool: int
    n_new: int
    n_top: int
    n_sel: int
    k_idxs: Tensor
    pool_cells: Tensor
    pool_idxs: Tensor
    pool_mask: Tensor
    tail_idxs: Tensor
    new_pool_idxs: Tensor
    new_pool_rep: Tensor
    gather_mask: Tensor | None = None
    new_pool_pos: Tensor | None = None


def kpool_inputs(
    b: Builder, kpool: int, top_k: int, *, tail: bool, gather_mask: bool, pool_pos: bool
) -> KpoolInputs:
    """build_inp_kpool at graph reserve: the full-cache context counts every pool the cache
    can hold as real and new (llama_memory_hybrid_idx_context: cells / kpool pools per
    sequence slot), n_pool their padded count. The pool mask is f16 (the CPU runs the fused
    lightning indexer)."""
    d, g = b.d, b.g
    n = b.n_tokens
    n_real = (d.n_kv // kpool) * max(1, b.s.n_seqs)
    n_pool = kpool_pad(n_real)
    n_new = max(n_real, 1)
    # min(pools, top_k / kpool) is not affine in the cells: in the symbolic build (the cells
    # as SYM_U) it is made a square, so compile_walk finds the walk not affine and every
    # context is built and walked as it is (a context below the selection keeps every pool)
    n_top = n_pool * n_pool if d.n_kv >= CELLS * SYM_U else min(n_pool, top_k // kpool)
    n_sel = kpool * n_top + (kpool - 1 if tail else 0)
    k_idxs = g.input("i64", n)
    pool_cells = g.input("i32", n_pool)
    pool_idxs = g.input("i32", kpool, n_pool)
    pool_mask = g.input("f16", n_pool, n)
    tail_idxs = g.input("i32", kpool - 1, n)
    for t in (pool_cells, pool_idxs, pool_mask, tail_idxs):
        g.expand(t)
    slots = g.expand(g.input("f32", n_sel, 1, 1, n)) if gather_mask else None
    new_pool_idxs = g.input("i32", kpool, n_new)
    new_pool_rep = g.input("i64", n_new)
    new_pool_pos = g.input("i32", 4 * n_new) if pool_pos else None
    return KpoolInputs(
        kpool,
        n_pool,
        n_new,
        n_top,
        n_sel,
        k_idxs,
        pool_cells,
        pool_idxs,
        pool_mask,
        tail_idxs,
        new_pool_idxs,
        new_pool_rep,
        slots,
        new_pool_pos,
    )


def scatter_mask(
    b: Builder,
    kp: KpoolInputs,
    sel_idx: Tensor,
    *,
    live: Tensor,
    dump: Tensor,
    mask: Tensor,
    n_kv: int,
) -> Tensor:
    """The scatter half of the selection: an all -inf row of n_kv + n_sel per token (fill,
    repeat), zeros set at the selected cells, each dead slot sent to its own dump row
    (idx = dump + live * (idx - dump) in f32, cast back), the first n_kv columns viewed and
    the KQ mask added (the model's KQ mask type)."""
    g = b.g
    n = b.n_tokens
    n_sel = kp.n_sel
    zeros = g.op("repeat", fill(b, mask.type, n_sel), ne=(n_sel, n))
    zeros = g.reshape(zeros, 1, n_sel, n)
    idx_f = g.op("cpy", sel_idx, type_="f32")
    idx_f = g.op("add", g.op("mul", g.op("sub", idx_f, dump), live), dump)
    idx = g.op("cpy", idx_f, type_="i32")
    mask_all = g.op("repeat", fill(b, mask.type, n_kv + n_sel), ne=(n_kv + n_sel, n))
    mask_all = g.reshape(mask_all, 1, n_kv + n_sel, n)
    sel = g.set_rows(mask_all, zeros, g.reshape(idx, n_sel, n, 1))
    sel = g.view(sel, (n_kv, n), (sel.nb[2],))
    return g.op("add", sel, g.reshape(mask, n_kv, n))
