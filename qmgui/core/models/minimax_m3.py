"""MiniMax-M3 (src/models/minimax-m3.cpp): MiniMax-M2 style attention with leading dense
FFN layers, then sigmoid-routed experts plus a shared expert, and MiniMax sparse attention
(MSA) in the expert layers where flash attention is on and each sequence has a KV stream of
its own (one sequence, or a non-unified cache)."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family

# llama_kv_cache_msa_context::get_n_pos pads the position axis to at least 256; at reserve
# time the cache is empty, so the axis is 256 positions, padded to whole blocks
_N_POS_MIN = 256

_FLOAT = frozenset({"f32", "f16", "bf16"})


def msa_enabled(b: Builder) -> bool:
    """minimax-m3.cpp's msa_enabled: flash attention on, and one sequence or a KV stream per
    sequence (a unified cache shared by several sequences falls back to dense attention)."""
    d = b.d
    return d.flash_attn and (b.s.n_seqs == 1 or not d.unified)


@dataclass(frozen=True)
class MsaInputs:
    """llm_graph_input_msa and the graph-wide MSA values: the local-block bias, the position
    mask, the position -> cell maps (I32; F32 at decode), the cell -> block map (batch) and
    the F32 copy of the KQ mask (batch), built once and shared by the sparse layers."""

    blk: int
    n_ps: int
    nblk: int
    ns: int
    n_tps: int
    decode: bool
    bias: Tensor
    pos_mask: Tensor
    pos_slot_i: Tensor
    pos_slot_f: Tensor | None
    cell_blk: Tensor | None
    mask_f32: Tensor | None
    k_idxs_idx: Tensor


def _msa_inputs(b: Builder) -> MsaInputs:
    d, g, n = b.d, b.g, b.n_tokens
    inp = b.kv_inputs(False)
    mask = inp.mask
    n_tps, ns = mask.ne[1], mask.ne[3]
    blk = max(1, d.indexer_block_size)
    n_ps = -(-_N_POS_MIN // blk) * blk
    nblk = n_ps // blk
    decode = n_tps == 1
    bias = g.input("f32", nblk, n)
    pos_mask = g.input("f32", n_ps, n)
    pos_slot_i = g.input("i32", n_ps, ns)
    pos_slot_f = g.input("f32", n_ps, ns) if decode else None
    cell_blk = None if decode else g.input("i32", d.n_kv, ns)
    mask_f32 = None if decode else g.op("cpy", mask, type_="f32")
    return MsaInputs(
        blk,
        n_ps,
        nblk,
        ns,
        n_tps,
        decode,
        bias,
        pos_mask,
        pos_slot_i,
        pos_slot_f,
        cell_blk,
        mask_f32,
        g.input("i64", n),
    )


@dataclass(frozen=True)
class _Operands:
    """One sparse layer's operands: the indexer's queries [n_idx, Hd, T] and its cached keys
    (a view of the indexer cache), Q [D, HQ, T] and the main cache's K and V views."""

    iq: Tensor
    ik_kv: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    hd: int


def _inplace(name: str, a: Tensor, *src: Tensor) -> Tensor:
    """An *_inplace op: a view of `a` that computes into it."""
    return Tensor(a.type, a.ne, op=name, src=(a, *src), view_src=a, nb=a.nb)


def graph_minimax_m3(b: Builder) -> None:
    """src/models/minimax-m3.cpp: per-head QK-norm, RoPE, attention (dense build_attn in the
    leading dense layers and whenever MSA is off, MSA otherwise), then a SwiGLU-OAI FFN
    (leading layers) or sigmoid-routed experts with selection bias plus a shared expert."""
    d, g = b.d, b.g
    moe = Moe(
        gating="sigmoid",
        norm_w=d.expert_weights_norm,
        scale=d.expert_weights_scale not in (0.0, 1.0),
        probs_bias=True,
    )
    inp = b.inp_embd()
    msa = _msa_inputs(b) if msa_enabled(b) else None
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        cur = b.norm(inp)
        sparse = msa is not None and il >= d.leading_dense and d.has(pre + "indexer.k_proj.weight")
        if msa is not None and sparse:
            cur = _msa_attn(b, il, cur, msa)
        else:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(pre + "ffn_gate_inp.weight"):
            cur = b.ffn(cur, d.n_ff[il])
        else:
            moe_out = moe_ffn(b, cur, il, moe)
            shexp = d.shape(pre + "ffn_up_shexp.weight")
            if shexp is not None:
                moe_out = g.op("add", moe_out, b.ffn(cur, shexp[1]))
            cur = moe_out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


def _msa_attn(b: Builder, il: int, x: Tensor, m: MsaInputs) -> Tensor:
    """One sparse layer (minimax-m3.cpp, is_sparse): the indexer's queries and its one key
    per token (normed, roped; the key stored in the indexer cache), Q/K/V stored in the main
    cache, then block selection and attention (_msa_decode, _msa_batch), and wo."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    pre = f"blk.{il}."
    kshape = d.shape(pre + "indexer.k_proj.weight")
    qshape = d.shape(pre + "indexer.q_proj.weight")
    n_idx = kshape[1] if kshape and len(kshape) > 1 else 128
    hd = (qshape[1] if qshape and len(qshape) > 1 else n_idx * d.n_head_kv[il]) // n_idx
    iq = g.reshape(b.linear(x, n_idx * hd), n_idx, hd, n_tok)
    ik = g.reshape(b.linear(x, n_idx), n_idx, 1, n_tok)
    iq = b.rope(b.norm(iq))
    ik = b.rope(b.norm(ik))
    inp = b.kv_inputs(False)
    # the indexer cache: one key head of n_idx values per cell, the main cache's K type
    ikc = g.cache(d.type_k, n_idx, inp.n_kv, d.n_stream)
    g.expand(b.store_k(ikc, ik, m.k_idxs_idx))
    tk = ikc.type
    ik_kv = g.view(
        ikc,
        (n_idx, 1, inp.n_kv, d.n_stream),
        (row_size(tk, n_idx), row_size(tk, n_idx), row_size(tk, n_idx * inp.n_kv)),
    )
    q, k, v = build_qkv(b, il, x)
    q, k = b.rope(q), b.rope(k)
    if inp.rot_k is not None:
        q = b.hadamard(q, inp.rot_k)
        k = b.hadamard(k, inp.rot_k)
    if inp.rot_v is not None:
        v = b.hadamard(v, inp.rot_v)
    for t in (q, k, v):
        g.expand(t)
    kc, vc = b._cache_tensors(il, inp.n_kv)
    g.expand(b.store_k(kc, k, inp.k_idxs))
    g.expand(b._store_v(vc, v, inp.v_idxs))
    kview, vview = b.cache_views(il, kc, vc, inp.n_kv)
    ops = _Operands(iq, ik_kv, q, kview, vview, hd)
    cur = _msa_decode(b, ops, m) if m.decode else _msa_batch(b, ops, m)
    if inp.rot_v is not None:
        cur = b.hadamard(cur, inp.rot_v)
    return b.linear(cur, d.n_embd)


def _top_k(b: Builder, bsf: Tensor, m: MsaInputs) -> Tensor:
    """ggml_top_k over the position blocks: I32 indices of the min(top_k, nblk) best."""
    k = min(b.d.indexer_top_k, m.nblk) if b.d.indexer_top_k > 0 else m.nblk
    return b.g.op("top_k", bsf, ne=(k, *bsf.ne[1:]), type_="i32")


def _pool(b: Builder, sc: Tensor, m: MsaInputs) -> Tensor:
    """ggml_pool_2d (max) over blocks of `blk` positions: [nblk, ...] F32."""
    return b.g.op("pool_2d", sc, ne=(m.nblk, *sc.ne[1:]), type_="f32")


def _msa_fa(b: Builder, q_cur: Tensor, k: Tensor, v: Tensor, mask: Tensor, *, gp: int) -> Tensor:
    """build_attn_msa_fa: Q [D, HQ, T] folded to [D, R, Gp, C], one flash attention over
    the C channels, the result permuted back (a copy unless R is 1) to [D * HQ, T]."""
    g = b.g
    dim, hq, t = q_cur.ne[0], q_cur.ne[1], q_cur.ne[2]
    c = k.ne[3]
    r = hq * t // (gp * c)
    q = g.permute(g.reshape(q_cur, dim, gp, c, r), 0, 2, 3, 1)
    o = Tensor(
        "f32", (v.ne[0], q.ne[2], q.ne[1], q.ne[3]), op="flash_attn_ext", src=(q, k, v, mask)
    )
    o = g.permute(o, 0, 1, 3, 2)
    if r != 1:
        o = g.cont(o)
    return g.reshape(o, dim * hq, t)


def _msa_batch(b: Builder, ops: _Operands, m: MsaInputs) -> Tensor:
    """minimax-m3.cpp's batch branch, per stream: indexer scores over the positions
    (gathered keys x queries, masked in place), max-pooled into blocks, biased, top-k; the
    block mask (-inf rows with zeros set at the chosen blocks) expanded to cells through the
    cell -> block map and added in place to the F32 KQ mask, cast to F16; then one flash
    attention over the stream's cache with the GQA groups as channels. Streams concatenate."""
    g = b.g
    assert m.cell_blk is not None
    assert m.mask_f32 is not None
    iq, ik_kv, q, k, v, hd = ops.iq, ops.ik_kv, ops.q, ops.k, ops.v, ops.hd
    n_kv = k.ne[2]
    n_idx = iq.ne[0]
    n_tps, ns, nblk, n_ps = m.n_tps, m.ns, m.nblk, m.n_ps
    dim, hkv = k.ne[0], k.ne[1]
    n_head = q.ne[1]
    gp = n_head // hkv
    outs: list[Tensor] = []
    for _st in range(ns):  # the streams' views differ in offset only
        iq_s = g.view(iq, (n_idx, hd, n_tps), (iq.nb[1], iq.nb[2]))
        ik_s = g.view(ik_kv, (n_idx, n_kv), (ik_kv.nb[2],))
        psl_s = g.view(m.pos_slot_i, (n_ps,))
        pm_nb = m.pos_mask.nb[1]
        pm_s = g.view(m.pos_mask, (n_ps, 1, n_tps), (pm_nb, pm_nb))
        cb_s = g.view(m.cell_blk, (n_kv,))
        mf = m.mask_f32
        mf_s = g.view(mf, (n_kv, n_tps, 1), (mf.nb[1], mf.nb[3]))
        bnb = m.bias.nb[1]
        bias_s = g.view(m.bias, (nblk, 1, n_tps), (bnb, bnb))
        q_s = g.view(q, (dim, n_head, n_tps), (q.nb[1], q.nb[2]))
        k_s = g.view(k, (dim, hkv, n_kv, 1), (k.nb[1], k.nb[2], k.nb[3]))
        v_s = g.view(v, (dim, hkv, n_kv, 1), (v.nb[1], v.nb[2], v.nb[3]))
        ikp = g.get_rows(ik_s, psl_s)
        sc = g.mul_mat(ikp, g.reshape(iq_s, n_idx, hd * n_tps))
        sc = g.reshape(sc, n_ps, hd, n_tps)
        sc = _inplace("add", sc, pm_s)
        bs = _pool(b, sc, m)
        bsf = g.op("add", bs, bias_s)
        idx = _top_k(b, bsf, m)
        kk = idx.ne[0]
        ninf = g.op("cpy", g.op("scale", bias_s, ne=bias_s.ne), type_="f16")
        ninf = g.op("repeat", ninf, ne=(nblk, hd, n_tps, 1))
        zero = g.op("scale", g.op("cpy", idx, type_="f32"))
        bm = g.set_rows(
            g.reshape(ninf, 1, nblk, hd * n_tps),
            g.reshape(zero, 1, kk, hd * n_tps),
            g.reshape(idx, kk, hd * n_tps),
        )
        bm = g.reshape(bm, nblk, hd, n_tps)
        bm = g.cont(g.permute(bm, 0, 2, 1, 3))
        bm2 = g.cont(g.transpose(g.reshape(bm, nblk, n_tps * hd)))
        bmc = g.get_rows(bm2, cb_s)
        bmx = g.reshape(g.cont(g.transpose(bmc)), n_kv, n_tps, hd)
        mask4 = _inplace("add", bmx, mf_s)
        mask4 = g.op("cpy", g.reshape(mask4, n_kv, n_tps, 1, hd), type_="f16")
        kfa = g.permute(k_s, 0, 3, 1, 2)
        vfa = g.permute(v_s, 0, 3, 1, 2)
        outs.append(_msa_fa(b, q_s, kfa, vfa, mask4, gp=gp))
    cur = outs[0]
    for o in outs[1:]:
        cur = g.concat(cur, o, 1)
    g.expand(cur)
    return cur


def _msa_decode(b: Builder, ops: _Operands, m: MsaInputs) -> Tensor:
    """minimax-m3.cpp's decode branch (one token per stream), batched over the streams:
    indexer keys gathered through the position -> cell map, scored, masked, pooled, biased,
    top-k; the chosen blocks' positions and cells computed (scale, arange, add, cast), K, V
    and the mask rows gathered (cast to F16) and one flash attention over all groups and
    streams."""
    d, g = b.d, b.g
    assert m.pos_slot_f is not None
    iq, ik_kv, q, k, v, hd = ops.iq, ops.ik_kv, ops.q, ops.k, ops.v, ops.hd
    n_idx = iq.ne[0]
    ns, nblk, n_ps, blk = m.ns, m.nblk, m.n_ps, m.blk
    dim, hkv, n_kv = k.ne[0], k.ne[1], k.ne[2]
    gp = q.ne[1] // hkv
    ik3 = g.view(ik_kv, (n_idx, n_kv, ns), (ik_kv.nb[2], ik_kv.nb[3]))
    ikp = g.get_rows(ik3, m.pos_slot_i)
    iq4 = g.reshape(iq, n_idx, hd, 1, ns)
    sc = g.mul_mat(g.reshape(ikp, n_idx, n_ps, 1, ns), iq4)
    sc = _inplace("add", sc, g.reshape(m.pos_mask, n_ps, 1, 1, ns))
    bs = _pool(b, sc, m)
    bsf = g.op("add", bs, g.reshape(m.bias, nblk, 1, 1, ns))
    idx = _top_k(b, bsf, m)
    kk = idx.ne[0]
    a = g.op("scale", g.op("cpy", idx, type_="f32"))
    a = g.reshape(a, 1, kk, hd, ns)
    n_sel = blk * kk * hd
    tj = g.op(
        "add",
        g.op("repeat", a, ne=(blk, kk, hd, ns)),
        g.reshape(Tensor("f32", (blk,), op="arange"), blk, 1, 1),
    )
    tokj = g.op("cpy", g.reshape(tj, n_sel, ns), type_="i32")
    cs = g.get_rows(g.reshape(m.pos_slot_f, 1, n_ps, ns), tokj)
    cs = g.reshape(cs, blk, kk, hd, ns)
    tr = g.op(
        "add",
        g.op("scale", cs),
        g.reshape(Tensor("f32", (hkv,), op="arange"), 1, 1, hd),
    )
    tokr = g.op("cpy", g.reshape(tr, n_sel, ns), type_="i32")
    k3 = g.view(k, (dim, hkv * n_kv, ns), (k.nb[1], k.nb[3]))
    v3 = g.view(v, (dim, hkv * n_kv, ns), (v.nb[1], v.nb[3]))
    mp = g.reshape(m.pos_mask, 1, n_ps, ns)
    kg = g.get_rows(k3, tokr)
    vg = g.get_rows(v3, tokr)
    mg = g.get_rows(mp, tokj)
    # a quantized cache's rows are gathered to F32 and cast to F16 (so is a plain one's)
    kt = d.type_k if d.type_k in _FLOAT else "f16"
    vt = d.type_v if d.type_v in _FLOAT else "f16"
    kfa = g.reshape(kg, dim, blk * kk, 1, hd * ns)
    vfa = g.reshape(vg, dim, blk * kk, 1, hd * ns)
    if kfa.type != kt:
        kfa = g.op("cpy", kfa, type_=kt)
    if vfa.type != vt:
        vfa = g.op("cpy", vfa, type_=vt)
    mfa = g.op("cpy", g.reshape(mg, blk * kk, 1, 1, hd * ns), type_="f16")
    cur = _msa_fa(b, q, kfa, vfa, mfa, gp=gp)
    g.expand(cur)
    return cur


FAMILY = Family(graph_minimax_m3, laid_out=("minimax-m3",))
