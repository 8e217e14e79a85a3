"""DeepSeek-V4: hyper-connections (fused on the CPU), attention over a raw sliding-window
cache plus, per layer, a compressed cache: CSA (one entry per 4 tokens, with a lightning
indexer that keeps the top k of them) or HCA (one per 128), both fed by compressor states;
sqrt-softplus routed experts plus a shared expert (src/models/deepseek4.cpp,
src/llama-kv-cache-dsv4.cpp, build_inp_dsv4 in src/llama-graph.cpp)."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.compile import CELLS, SYM_U
from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dsa import top_k_mask
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family

CSA, HCA = 4, 128  # llama-kv-cache-dsv4.cpp: DSV4_CSA_RATIO, DSV4_HCA_RATIO


def _rot(head: int) -> int:
    n = 64
    while head % (2 * n) == 0:
        n *= 2
    return n


def _pad(n: int) -> int:
    return -(-n // 256) * 256


@dataclass
class _Comp:
    """One compressor's inputs (dsv4_build_comp_inputs, the reserve plan of
    dsv4_build_reserve_comp_plan) and its compressed cache's cells."""

    ratio: int
    n_kv: int
    state_pos: Tensor
    persist_src: Tensor
    persist_dst: Tensor
    read_idxs: Tensor
    write_idxs: Tensor
    write_pos: Tensor
    mask: Tensor
    rot: Tensor | None


@dataclass
class _Inputs:
    raw_idxs: Tensor
    raw_mask: Tensor
    raw_rot: Tensor | None
    csa: _Comp
    hca: _Comp
    lid: _Comp


def _comp_cells(b: Builder, ratio: int) -> int:
    """Cells of a compressed cache: one per `ratio` context cells, padded to 256. Not affine
    in the cells, so the symbolic build (core.ggml.compile) gets a square of them instead:
    its walk is then never compiled, each context is built and walked as it is."""
    d = b.d
    if d.n_kv >= CELLS * SYM_U:
        return d.n_kv * d.n_kv
    return _pad(max(1, -(-d.n_kv // ratio)))


def _comp_inputs(b: Builder, ratio: int, overlap: bool, state_size: int, lid: bool) -> _Comp:
    d, g = b.d, b.g
    t, s = b.n_tokens, max(1, b.s.n_seqs)
    n_blocks = t // ratio + s
    n_persist = min(t, state_size * s)
    n_kv = _comp_cells(b, ratio)
    fa = d.flash_attn or lid  # the indexer's mask is f16 for the fused lightning indexer
    rot = _rot(_indexer_head(b)) if lid else d.rot_k
    return _Comp(
        ratio=ratio,
        n_kv=n_kv,
        state_pos=g.input("i32", t),
        persist_src=g.input("i32", n_persist),
        persist_dst=g.input("i32", n_persist),
        read_idxs=g.input("i32", (2 if overlap else 1) * ratio * n_blocks),
        write_idxs=g.input("i64", n_blocks),
        write_pos=g.input("i32", n_blocks),
        mask=g.input("f16" if fa else "f32", n_kv, t // s, 1, s),
        rot=g.input("f32", rot, rot) if rot else None,
    )


def _indexer_head(b: Builder) -> int:
    for il in b.d.layers:
        shape = b.d.shape(f"blk.{il}.indexer_compressor_norm.weight")
        if shape:
            return shape[0]
    return 128


def _inputs(b: Builder) -> _Inputs:
    """build_inp_dsv4: the raw cache's write indices, KQ mask and rotation, and the CSA, HCA
    and indexer compressors' inputs. The caches keep one stream per sequence."""
    d, g = b.d, b.g
    t, s = b.n_tokens, max(1, b.s.n_seqs)
    return _Inputs(
        raw_idxs=g.input("i64", t),
        raw_mask=g.input("f16" if d.flash_attn else "f32", d.n_kv_swa, t // s, 1, s),
        raw_rot=g.input("f32", d.rot_k, d.rot_k) if d.rot_k else None,
        csa=_comp_inputs(b, CSA, True, 2 * CSA, False),
        hca=_comp_inputs(b, HCA, False, HCA, False),
        lid=_comp_inputs(b, CSA, True, 2 * CSA, True),
    )


def _cache_view(b: Builder, cache: Tensor, n_kv: int) -> Tensor:
    """get_k of a K-only cache with one head: [width, 1, n_kv, streams]."""
    w, cells, ns = cache.ne[0], cache.ne[1], cache.ne[2]
    tk = cache.type
    return b.g.view(
        cache, (w, 1, n_kv, ns), (row_size(tk, w), row_size(tk, w), row_size(tk, w * cells))
    )


def _rotated(b: Builder, x: Tensor, rot: Tensor | None) -> Tensor:
    return b.hadamard(x, rot) if rot is not None else x


def _zero_row(b: Builder, t: Tensor) -> Tensor:
    """dsv4_append_zero_row: t's first row scaled to zero (or -inf), appended as a row."""
    g = b.g
    row = g.op("scale", g.view(t, (t.ne[0],)))
    return g.concat(t, g.reshape(row, t.ne[0], 1), 1)


def _pool(b: Builder, values: Tensor, scores: Tensor, pos: Tensor) -> Tensor:
    """Softmax-weighted sum over each block's rows, back to [head, 1, n_blocks], normed
    (the compressor's weight) and roped at the blocks' positions."""
    g = b.g
    values = g.cont(g.permute(values, 1, 0, 2, 3))
    scores = g.cont(g.permute(scores, 1, 0, 2, 3))
    comp = g.op("mul", values, g.op("soft_max", scores))
    comp = g.op("sum_rows", comp, ne=(1, *comp.ne[1:]))
    comp = g.cont(g.permute(comp, 1, 0, 2, 3))
    return g.op("rope", b.norm(comp), pos)


def _overlap_compress(
    b: Builder, src_kv: Tensor, src_score: Tensor, c: _Comp, *, head: int, n_blocks: int
) -> Tensor:
    """build_overlap_compressed_kv_from_state: each block pools its previous and current
    `ratio` rows (two halves of the state rows)."""
    g = b.g
    kv_rows = g.get_rows(_zero_row(b, src_kv), c.read_idxs)
    score_rows = g.get_rows(_zero_row(b, src_score), c.read_idxs)
    n_read = c.ratio * n_blocks

    def half(rows: Tensor) -> Tensor:
        part = g.cont(g.view(rows, (head, n_read), (rows.nb[1],)))
        return g.reshape(part, head, c.ratio, n_blocks)

    values = g.concat(half(kv_rows), half(kv_rows), 1)
    scores = g.concat(half(score_rows), half(score_rows), 1)
    return _pool(b, values, scores, c.write_pos)


def _compressor(b: Builder, x: Tensor, c: _Comp, head: int, *, overlap: bool) -> None:
    """One compressor of a layer: the kv and score rows, the pooled blocks written to the
    compressed cache, the last rows kept in the state (persist)."""
    d, g = b.d, b.g
    s = max(1, b.s.n_seqs)
    t = b.n_tokens
    width = 2 * head if overlap else head
    state_rows = (2 * c.ratio if overlap else c.ratio) * s
    n_blocks = t // c.ratio + s
    kv = b.linear(x, width)
    score = g.op("add", b.linear(x, width), g.get_rows(g.weight(width, c.ratio), c.state_pos))
    state_kv = g.cache("f32", width, state_rows)
    state_score = g.cache("f32", width, state_rows)
    src_kv = g.concat(g.view(state_kv, (width, state_rows)), kv, 1)
    src_score = g.concat(g.view(state_score, (width, state_rows)), score, 1)
    if overlap:
        comp = _overlap_compress(b, src_kv, src_score, c, head=head, n_blocks=n_blocks)
    else:
        kv_rows = g.reshape(g.get_rows(src_kv, c.read_idxs), head, c.ratio, n_blocks)
        score_rows = g.reshape(g.get_rows(src_score, c.read_idxs), head, c.ratio, n_blocks)
        comp = _pool(b, kv_rows, score_rows, c.write_pos)
    comp = _rotated(b, comp, c.rot)
    cache = g.cache(d.type_k, head, c.n_kv, s)
    g.expand(b.store_k(cache, comp, c.write_idxs))
    g.expand(g.set_rows(state_kv, g.get_rows(kv, c.persist_src), c.persist_dst))
    g.expand(g.set_rows(state_score, g.get_rows(score, c.persist_src), c.persist_dst))


def _lid_top_k(b: Builder, il: int, x: Tensor, qr: Tensor, inp: _Inputs) -> Tensor:
    """build_lid_top_k: indexer queries (roped, rotated), weights pre-scaled, scores over
    the indexer cache (fused lightning indexer), the top k made contiguous."""
    d, g = b.d, b.g
    t, s = b.n_tokens, max(1, b.s.n_seqs)
    lid = inp.lid
    head = _indexer_head(b)
    proj = d.shape(f"blk.{il}.indexer.proj.weight")
    heads = proj[1] if proj and len(proj) > 1 else 64
    iq = b.rope(g.reshape(b.linear(qr, head * heads), head, heads, t))
    iq = _rotated(b, iq, lid.rot)
    iw = g.op("scale", b.linear(x, heads))
    cache = g.cache(d.type_k, head, lid.n_kv, s)
    ik = _cache_view(b, cache, lid.n_kv)
    nt = t // s
    iq = g.view(iq, (head, heads, nt, s), (iq.nb[1], iq.nb[2], iq.nb[3] // s))
    iw = g.view(iw, (heads, nt, 1, s), (iw.nb[1], iw.nb[2] // s, iw.nb[3] // s))
    score = Tensor("f32", (lid.n_kv, nt, 1, s), op="lightning_indexer", src=(iq, ik, iw, lid.mask))
    # min(cells, top_k): the symbolic build's cells are a square already (_comp_cells)
    symbolic = d.n_kv >= CELLS * SYM_U
    n_top = lid.n_kv if symbolic else min(lid.n_kv, d.indexer_top_k or lid.n_kv)
    return g.cont(Tensor("i32", (n_top, nt, 1, s), op="top_k", src=(score,)))


def _attention(b: Builder, il: int, x: Tensor, inp: _Inputs) -> Tensor:
    """build_attention_impl: Q LoRA, Q heads RMS-normed and roped, one shared KV head
    normed and roped; the layer's compressors; attention over the raw cache (and the
    compressed one: CSA through the indexer's top-k mask, HCA whole) with sinks; de-rope,
    the grouped low-rank output (wo_a per group, wo_b)."""
    d, g = b.d, b.g
    t = b.n_tokens
    s = max(1, b.s.n_seqs)
    head = d.head_k
    hq = d.n_head[il]
    pre = f"blk.{il}."
    ratio = d.compress_ratios[il] if il < len(d.compress_ratios) else 0
    q_a = d.shape(pre + "attn_q_a.weight")
    qr = b.norm(b.linear(x, q_a[1] if q_a and len(q_a) > 1 else x.ne[0]))
    q = b.rope(g.op("rms_norm", g.reshape(b.linear(qr, hq * head), head, hq, t)))
    kv = b.rope(g.reshape(b.norm(b.linear(x, head)), head, 1, t))
    if ratio == HCA:
        _compressor(b, x, inp.hca, head, overlap=False)
    if ratio == CSA:
        _compressor(b, x, inp.csa, head, overlap=True)
        _compressor(b, x, inp.lid, _indexer_head(b), overlap=True)
    top = _lid_top_k(b, il, x, qr, inp) if ratio == CSA else None
    q = _rotated(b, q, inp.raw_rot)
    kv = _rotated(b, kv, inp.raw_rot)
    g.expand(q)
    g.expand(kv)
    raw = g.cache(d.type_k, head, d.n_kv_swa, s)
    g.expand(b.store_k(raw, kv, inp.raw_idxs))
    k = _cache_view(b, raw, d.n_kv_swa)
    mask = inp.raw_mask
    if ratio in (CSA, HCA):
        c = inp.csa if ratio == CSA else inp.hca
        comp = _cache_view(b, g.cache(d.type_k, head, c.n_kv, s), c.n_kv)
        k = g.concat(k, comp, 2)
        ztype = "f16" if d.flash_attn else "f32"  # build_top_k_mask: the mask's type
        cmask = c.mask if top is None else top_k_mask(b, c.mask, top, zeros_type=ztype)
        mask = g.concat(mask, cmask, 0)
    out = b.attn_mha(q, k, k, mask, sinks=True)
    out = _rotated(b, out, inp.raw_rot)
    out = b.rope(g.reshape(out, head, hq, t))
    wo_a = d.shape(pre + "attn_output_a.weight")
    group_dim, o_lora, groups = wo_a if wo_a and len(wo_a) == 3 else (head, head, hq)
    out = g.permute(g.reshape(out, group_dim, groups, t), 0, 2, 1, 3)
    oa = g.permute(g.mul_mat(g.weight(group_dim, o_lora, groups), out), 0, 2, 1, 3)
    return b.linear(g.cont(oa, o_lora * groups, t), d.n_embd)


def _hc_pre(b: Builder, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_hc_pre with the fused ops: mixes from the RMS-normed flattened streams; the
    pre and post gates; the Sinkhorn comb (ggml_dsv4_hc_comb); the streams reduced by the
    pre gate (ggml_dsv4_hc_pre)."""
    g = b.g
    n_embd, hc, t = x.ne[0], x.ne[1], x.ne[2]
    mixes = b.linear(g.op("rms_norm", g.reshape(x, n_embd * hc, t)), (2 + hc) * hc)

    def gate(post: bool) -> Tensor:
        cur = g.view(mixes, (hc, t), (mixes.nb[1],))
        cur = g.op("unary", g.op("add", g.op("mul", cur, g.weight(1)), g.weight(hc)))
        return g.op("scale", cur)

    pre = gate(False)
    post = gate(True)
    comb = Tensor(
        "f32", (hc, hc, t), op="dsv4_hc_comb", src=(mixes, g.weight(3), g.weight((2 + hc) * hc))
    )
    out = Tensor("f32", (n_embd, t), op="dsv4_hc_pre", src=(x, pre))
    return out, post, comb


def _hc_post(x: Tensor, residual: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """ggml_dsv4_hc_post: the block's output spread back over the streams."""
    return Tensor("f32", residual.ne, op="dsv4_hc_post", src=(x, residual, post, comb))


def graph_deepseek4(b: Builder) -> None:
    """src/models/deepseek4.cpp (b11434; every HC op fused, as the CPU resolves them): the
    raw cache's mask expanded first, the embedding repeated into hc streams; per layer
    hc_pre, norm, attention, hc_post, hc_pre (residual, post gate and comb expanded), norm,
    routed (sqrt-softplus scores: two in-place ops, as sigmoid's one) plus shared experts,
    hc_post; the output rows, the hc head (unfused: the streams weighted and summed),
    norm and logits. Hash-routed layers (hash_layer_count) are laid out as routed ones."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    b.inp_pos()
    attn_inp = _inputs(b)
    g.expand(attn_inp.raw_mask)
    hc_fn = d.shape("blk.0.hc_attn_fn.weight")
    hc = 4
    if hc_fn and len(hc_fn) > 1 and d.n_embd:
        hc = hc_fn[0] // d.n_embd
    t = b.n_tokens
    cur = g.op("repeat", g.reshape(inp, d.n_embd, 1, t), ne=(d.n_embd, hc, t))
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = cur
        x, post, comb = _hc_pre(b, cur)
        attn = _attention(b, il, b.norm(x), attn_inp)
        cur = _hc_post(attn, residual, post, comb)
        residual = cur
        x, post, comb = _hc_pre(b, cur)
        for t_ in (residual, post, comb):
            g.expand(t_)
        x = b.norm(x)
        moe = Moe(
            gating="sigmoid",
            norm_w=d.expert_weights_norm,
            scale=d.expert_weights_scale not in (0.0, 1.0),
            probs_bias=d.has(pre + "exp_probs_b.bias"),
        )
        ffn = moe_ffn(b, x, il, moe)
        sh = d.shape(pre + "ffn_up_shexp.weight")
        if sh and len(sh) > 1:
            ffn = g.op("add", ffn, b.ffn(x, sh[1]))
        cur = _hc_post(ffn, residual, post, comb)
    flat = g.get_rows(g.reshape(cur, d.n_embd * hc, t), b.out_ids())
    cur = g.reshape(flat, d.n_embd, hc, b.s.n_outputs)
    n_out = cur.ne[2]
    mixes = b.linear(g.op("rms_norm", g.reshape(cur, d.n_embd * hc, n_out)), hc)
    w = g.op("scale", g.op("unary", g.op("add", g.op("mul", mixes, g.weight(1)), g.weight(hc))))
    out: Tensor | None = None
    for _ in range(hc):
        xh = g.view(cur, (d.n_embd, n_out), (cur.nb[2],))
        wh = g.view(w, (1, n_out), (w.nb[1],))
        term = g.op("mul", xh, wh)
        out = term if out is None else g.op("add", out, term)
    assert out is not None
    b.output_head(out)


FAMILY = Family(graph_deepseek4, laid_out=("deepseek4",))
