"""DeepSeek sparse attention (DSA) pieces: the absorbed multi-head latent attention (MLA)
projections, the lightning indexer's top-k selection and build_attn over a DSA cache
(src/llama-graph.cpp build_attn(llm_graph_input_attn_k_dsa), build_attn_inp_k_dsa_impl),
as src/models/dots3note.cpp and hy-v4.cpp use them (models/dots3note.py, models/hy_v4.py)."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.compile import CELLS, SYM_U
from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import AttnInputs, Builder


@dataclass(frozen=True)
class LidInputs:
    """The indexer cache's inputs (build_attn_inp_k_dsa_impl): its write indices, its KQ
    mask (f16: the CPU runs the fused lightning indexer, which wants one) and the Hadamard
    rotation where the cache has one."""

    k_idxs: Tensor
    mask: Tensor
    rot: Tensor | None


def lid_inputs(b: Builder, rot: int) -> LidInputs:
    """The indexer cache's inputs; `rot`: its Hadamard block (0: none)."""
    d, g, n = b.d, b.g, b.n_tokens
    streams = 1 if d.unified else b.s.n_seqs
    mask = g.input("f16", d.n_kv, n // streams, 1, streams)
    return LidInputs(g.input("i64", n), mask, g.input("f32", rot, rot) if rot else None)


def indexer_dims(b: Builder, il: int) -> tuple[int, int]:
    """(key width, heads) of layer il's lightning indexer, from its tensors."""
    d = b.d
    pre = f"blk.{il}.indexer."
    k = d.shape(pre + "attn_k.weight")
    width = k[1] if k and len(k) > 1 else 128
    q_b = d.shape(pre + "attn_q_b.weight")  # the queries: heads x width wide
    proj = d.shape(pre + "proj.weight")  # one weight per head; 1-D for a single head
    if q_b and len(q_b) > 1:
        heads = max(1, q_b[1] // width)
    elif proj:
        heads = proj[1] if len(proj) > 1 else 1
    else:
        heads = 64
    return width, heads


def n_top_k(b: Builder) -> int:
    """min(n_kv, indexer.top_k): the cells each query keeps.

    That is not affine in the cells, so in the symbolic build (core.ggml.compile, the cells
    as SYM_U) it is made a square of them: compile_walk then finds the walk not affine and
    every context is built and walked as it is."""
    d = b.d
    if d.n_kv >= CELLS * SYM_U:
        return d.n_kv * d.n_kv
    top = d.indexer_top_k or d.n_kv
    return min(d.n_kv, top)


def indexer_top_k(
    b: Builder,
    il: int,
    x: Tensor,
    qr: Tensor,
    lid: LidInputs,
    *,
    rotate: bool = True,
) -> Tensor:
    """The lightning indexer (fused on the CPU, cparams.fused_lid): its queries from the
    normed Q LoRA rows, one roped and layer-normed key per token stored in the indexer cache,
    per-head weights pre-scaled, the scores over the whole cache and the indices of the top
    k (made contiguous). `rotate`: the Hadamard rotation of q and k (deepseek32, dots3note;
    hy-v4 skips it)."""
    g = b.g
    n_tok = x.ne[1]
    width, heads = indexer_dims(b, il)
    iq = b.rope(g.reshape(b.linear(qr, width * heads), width, heads, n_tok))
    ik = b.norm(b.linear(x, width), kind="norm", bias=True)
    ik = b.rope(g.reshape(ik, width, 1, n_tok))
    if rotate and lid.rot is not None:
        iq = g.mul_mat(lid.rot, iq)
        ik = g.mul_mat(lid.rot, ik)
    return indexer_select(b, x, iq, ik, lid, width=width, heads=heads)


def indexer_select(
    b: Builder, x: Tensor, iq: Tensor, ik: Tensor, lid: LidInputs, *, width: int, heads: int
) -> Tensor:
    """The lightning indexer past its roped (and rotated) queries `iq` and key `ik`: the key
    stored in the indexer cache, the per-head weights (pre-scaled), the scores over the
    whole cache and the indices of the top k, made contiguous."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    ns = d.n_stream
    cache = g.cache(d.type_k, width, d.n_kv, ns)
    g.expand(b.store_k(cache, ik, lid.k_idxs))
    iw = b.linear(x, heads)
    tk = cache.type
    k = g.view(
        cache,
        (width, 1, d.n_kv, ns),
        (row_size(tk, width), row_size(tk, width), row_size(tk, width * d.n_kv)),
    )
    nt = n_tok // ns
    iq = g.view(iq, (width, heads, nt, ns), (iq.nb[1], iq.nb[2], iq.nb[3] // ns))
    iw = g.view(iw, (heads, nt, 1, ns), (iw.nb[1], iw.nb[2] // ns, iw.nb[3] // ns))
    iw = g.op("scale", iw)
    score = Tensor("f32", (d.n_kv, nt, 1, ns), op="lightning_indexer", src=(iq, k, iw, lid.mask))
    top = Tensor("i32", (n_top_k(b), nt, 1, ns), op="top_k", src=(score,))
    return g.cont(top)


def mla_q(b: Builder, il: int, x: Tensor, n_q: int) -> Tensor:
    """MLA's queries: one matmul (wq: DeepSeek-V2-Lite, Kimi) or a LoRA pair with an RMS
    norm between (wq_a, wq_b: DeepSeek-V3, Bailing-MoE3)."""
    pre = f"blk.{il}."
    if b.d.has(pre + "attn_q.weight"):
        return b.linear(x, n_q)
    q_a = b.d.shape(pre + "attn_q_a.weight")
    rank = q_a[1] if q_a else x.ne[0]
    return b.linear(b.norm(b.linear(x, rank)), n_q)


def mla_absorbed(
    b: Builder, il: int, x: Tensor, qr: Tensor, *, k_norm: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """MLA with the absorption optimization (deepseek2.cpp's path, per layer widths read
    from the layer's tensors): Q from the normed Q LoRA rows, its no-RoPE part absorbed into
    the compressed KV space (wk_b); K the normed compressed KV plus the roped shared key
    (`k_norm`: RMS-normed before RoPE, dots3note); V the compressed KV. (Q, K, V) as
    build_attn takes them."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_tok = x.ne[1]
    hq = d.n_head[il]
    rope = d.mla_rope
    kv_a = d.shape(pre + "attn_kv_a_mqa.weight")
    lora = kv_a[1] - rope if kv_a and len(kv_a) > 1 else d.mla_kv_lora
    k_b = d.shape(pre + "attn_k_b.weight")
    nope = k_b[0] if k_b else d.mla_head_k - rope
    head_k = nope + rope
    q = b.linear(qr, hq * head_k)
    head_row = row_size("f32", head_k)
    q_nope = g.view(q, (nope, hq, n_tok), (head_row, head_row * hq))
    q_pe = g.view(q, (rope, hq, n_tok), (head_row, head_row * hq))
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],))
    k_pe = g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1]))
    if k_norm:
        k_pe = b.norm(k_pe)
    q_pe = b.rope(q_pe)
    k_pe = b.rope(k_pe)
    kv_cmpr = b.norm(kv_cmpr)
    absorbed = g.mul_mat(g.weight(nope, lora, hq), g.permute(q_nope, 0, 2, 1, 3))
    q_cur = g.concat(g.permute(absorbed, 0, 2, 1, 3), q_pe, 0)
    v_cur = g.reshape(kv_cmpr, lora, 1, n_tok)
    k_cur = g.concat(v_cur, k_pe, 0)
    return q_cur, k_cur, v_cur


def top_k_mask(b: Builder, mask: Tensor, top_k: Tensor, *, zeros_type: str = "f32") -> Tensor:
    """The KQ mask of sparse attention (llama-graph.cpp's DSA path; deepseek4.cpp's
    build_top_k_mask, whose zeros take the mask's type under flash attention): the mask
    refilled with -inf, the top-k cells zeroed from a zero-filled tensor, the mask added."""
    g = b.g
    full = g.op("fill", mask)
    rows = g.view(
        full, (1, full.ne[0], full.ne[1], full.ne[3]), (full.nb[0], full.nb[1], full.nb[2])
    )
    top3 = g.view(
        top_k,
        (top_k.ne[0], top_k.ne[1], top_k.ne[3], 1),
        (top_k.nb[1], top_k.nb[2], top_k.ne[3] * top_k.nb[3]),
    )
    zeros = g.op("fill", g.input(zeros_type, 1, top3.ne[0], top3.ne[1], top3.ne[2]))
    kept = g.set_rows(rows, zeros, top3)
    kept = g.view(
        kept, (kept.ne[1], kept.ne[2], 1, kept.ne[3]), (kept.nb[2], kept.nb[3], kept.nb[3])
    )
    return g.op("add", kept, mask)


def mla_attn(
    b: Builder,
    il: int,
    qkv: tuple[Tensor, Tensor, Tensor],
    inp: AttnInputs,
    *,
    top_k: Tensor | None = None,
    sinks: bool = False,
) -> Tensor:
    """build_attn over an MLA cache (K only; V a view of it) without wo: with `top_k`, the
    DSA variant, whose KQ mask is rebuilt per layer (filled with -inf, the top-k cells set
    to zero through a zero-filled f32 tensor, the original mask added); wv_b decompresses
    the attention output (v_mla)."""
    d, g = b.d, b.g
    q_cur, k_cur, v_cur = qkv
    for t in (q_cur, v_cur, k_cur):
        g.expand(t)
    width = k_cur.ne[0]
    lora = v_cur.ne[0]
    n_kv, ns = inp.n_kv, d.n_stream
    kc = g.cache(d.type_k, width, n_kv, ns)
    g.expand(b.store_k(kc, k_cur, inp.k_idxs))
    mask = inp.mask if top_k is None else top_k_mask(b, inp.mask, top_k)
    tk = kc.type
    k = g.view(
        kc,
        (width, 1, n_kv, ns),
        (row_size(tk, width), row_size(tk, width), row_size(tk, width * n_kv)),
    )
    v = g.view(k, (lora, 1, n_kv, ns), (k.nb[1], k.nb[2], k.nb[3]))
    hq = d.n_head[il]
    v_b = d.shape(f"blk.{il}.attn_v_b.weight")
    head_v = v_b[1] if v_b and len(v_b) > 1 else d.mla_head_v
    v_mla = g.weight(lora, head_v, hq)
    return b.attn_mha(q_cur, k, v, mask, v_mla=v_mla, sinks=sinks)
