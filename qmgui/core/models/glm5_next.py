"""GLM-5 Next (glm5-next): Kimi delta attention layers and RoPE-less latent attention layers
with a k-pool sparse indexer, under DeepSeek-V4-style hyper-connections (four residual
streams mixed by Sinkhorn-normalized weights) (src/models/glm5-next.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.kda import kda_layer
from qmgui.core.graph.kpool import KpoolInputs, fill, kpool_inputs, scatter_mask
from qmgui.core.models.family import Family

# hparams.dsv4_hc_mult: glm5-next asserts four streams
HC = 4


def _hc_pre(b: Builder, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_hc_pre with the fused CPU ops: the streams flattened and RMS-normed, one matmul
    to the (2 + hc) * hc mixing logits; the pre weights (affine, sigmoid, +eps) collapse the
    streams (ggml_dsv4_hc_pre); the post weights (affine, sigmoid, x2) and the Sinkhorn comb
    (ggml_dsv4_hc_comb) are returned for build_hc_post."""
    g = b.g
    n_embd, hc, nt = x.ne[0], x.ne[1], x.ne[2]
    flat = g.reshape(x, n_embd * hc, nt)
    mixes = g.mul_mat(g.weight(n_embd * hc, (2 + hc) * hc), g.op("rms_norm", flat))
    scale_w, base_w = g.weight(3), g.weight((2 + hc) * hc)

    def affine(act_scale: bool) -> Tensor:
        v = g.view(mixes, (hc, nt), (mixes.nb[1],))
        v = g.op("add", g.op("mul", v, g.weight(1)), g.weight(hc))
        return g.op("scale", g.op("unary", v)) if act_scale else v

    pre = affine(True)
    post = affine(True)
    comb = Tensor("f32", (hc, hc, nt), op="dsv4_hc_comb", src=(mixes, scale_w, base_w))
    out = Tensor("f32", (n_embd, nt), op="dsv4_hc_pre", src=(x, pre))
    return out, post, comb


def _hc_post(b: Builder, x: Tensor, residual: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    """build_hc_post, fused (ggml_dsv4_hc_post): the block output spread over the streams by
    the post weights plus the residual streams mixed by the comb."""
    del b
    return Tensor("f32", residual.ne, op="dsv4_hc_post", src=(x, residual, post, comb))


def _kpool_select(b: Builder, il: int, x: Tensor, qr: Tensor, kp: KpoolInputs) -> Tensor:
    """build_kpool_select (scatter path): indexer Q from the Q LoRA rank, per-token key
    (layer norm) and pool gate cached with a zeroed pooled slot; the pools of this ubatch
    re-pooled (gate soft-max over each pool's members, weighted sum) and scattered to their
    pooled slots; every pooled key gathered and scored by the fused lightning indexer; top-k
    pools ordered by score, expanded to their members plus the tail; the selection turned
    into an additive mask."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n = b.n_tokens
    q_shape = d.shape(pre + "indexer.attn_q_b.weight")
    k_shape = d.shape(pre + "indexer.attn_k.weight")
    p_shape = d.shape(pre + "indexer.proj.weight")
    head = k_shape[1] if k_shape else 128
    n_ih = p_shape[1] if p_shape and len(p_shape) > 1 else 1
    q_width = q_shape[1] if q_shape else head * n_ih
    kpool, n_new, n_pool = kp.kpool, kp.n_new, kp.n_pool
    iq = g.reshape(b.linear(qr, q_width), head, n_ih, n)
    ik = b.norm(b.linear(x, head), kind="norm", bias=True)
    ig = b.linear(x, head)
    packed = g.concat(g.concat(ik, ig, 0), fill(b, "f32", head, n), 0)
    packed = g.reshape(packed, 3 * head, 1, n)
    idx_cache = g.cache(d.type_k, 3 * head, d.n_kv, d.n_stream)
    g.expand(b.store_k(idx_cache, packed, kp.k_idxs))
    cells = d.n_kv * d.n_stream
    row = idx_cache.nb[1]
    key_gate = g.view(idx_cache, (2 * head, cells), (row,))
    pooled_slot = g.view(idx_cache, (head, cells), (row,))
    rows = g.get_rows(key_gate, g.reshape(kp.new_pool_idxs, kpool * n_new))
    rows = g.reshape(rows, 2 * head, kpool, n_new)
    pk = g.view(rows, (head, kpool, n_new), (rows.nb[1], rows.nb[2]))
    pg = g.view(rows, (head, kpool, n_new), (rows.nb[1], rows.nb[2]))
    logits = g.op("add", pg, g.weight(head, kpool))
    logits = g.cont(g.permute(logits, 1, 0, 2, 3))
    probs = g.op("soft_max", g.reshape(logits, kpool, head * n_new))
    probs = g.reshape(probs, kpool, head, n_new)
    pk = g.cont(g.permute(pk, 1, 0, 2, 3))
    pooled_new = g.op("sum_rows", g.op("mul", probs, pk), ne=(1, head, n_new))
    pooled_new = g.reshape(pooled_new, head, n_new)
    g.expand(g.set_rows(pooled_slot, pooled_new, kp.new_pool_rep))
    pooled = g.reshape(g.get_rows(pooled_slot, kp.pool_cells), head, 1, n_pool)
    weights = g.op("scale", b.linear(x, n_ih))
    score = Tensor(
        "f32", (n_pool, n), op="lightning_indexer", src=(iq, pooled, weights, kp.pool_mask)
    )
    return _top_pools(b, kp, score)


def _top_pools(b: Builder, kp: KpoolInputs, score: Tensor) -> Tensor:
    """The top pools by score (ggml_top_k, unordered), sorted by their score (get_rows,
    argsort, get_rows over an f32 copy, cont, cast back), expanded to their member cells
    (get_rows of pool_idxs) with the tail cells appended: the selected cell indices."""
    g = b.g
    n = b.n_tokens
    n_top = kp.n_top
    top = Tensor("i32", (n_top, n), op="top_k", src=(score,))
    sel_score = g.get_rows(g.reshape(score, 1, kp.n_pool, n), top)
    order = g.op("argsort", g.reshape(sel_score, n_top, n), type_="i32")
    top_f = g.reshape(g.op("cpy", top, type_="f32"), 1, n_top, n)
    top = g.get_rows(top_f, order)
    top = g.op("cpy", g.cont(g.reshape(top, n_top, n)), type_="i32")
    sel_idx = g.get_rows(kp.pool_idxs, g.reshape(top, n_top * n))
    sel_idx = g.reshape(sel_idx, kp.kpool * n_top, n)
    if kp.n_sel > kp.kpool * n_top:
        sel_idx = g.concat(sel_idx, kp.tail_idxs, 0)
    return sel_idx


def _gathers(b: Builder, kp: KpoolInputs) -> bool:
    """build_inp_kpool's `gather`: small ubatches (16 tokens or fewer) attend over the
    gathered selected latents when the context exceeds the selection."""
    d = b.d
    top_k = d.indexer_top_k
    return 0 < d.n_ubatch <= 16 and d.n_kv * d.n_stream > top_k + kp.kpool - 1


def _dsa_layer(b: Builder, il: int, x: Tensor, kp: KpoolInputs, prev: list[Tensor]) -> Tensor:
    """build_dsa_layer: RoPE-less MLA (Q through a normed LoRA pair, wk_b absorbed, the
    normed compressed KV cached), attention over the cache under the k-pool selection mask
    (a full-indexer layer builds it, the others reuse the previous one), wv_b, wo. In the
    gather mode the selected latents are gathered per token and attended with plain ops
    under the slot mask."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n = b.n_tokens
    hq = d.n_head[il] or d.n_head[0]
    lora = d.mla_kv_lora
    nope = d.mla_head_k - d.mla_rope
    gather = _gathers(b, kp)
    q_a = d.shape(pre + "attn_q_a.weight")
    qr = b.norm(b.linear(x, q_a[1] if q_a else x.ne[0]))
    q = g.reshape(b.linear(qr, hq * nope), nope, hq, n)
    kv = g.reshape(b.norm(b.linear(x, lora)), lora, 1, n)
    absorbed = g.permute(g.mul_mat(g.weight(nope, lora, hq), g.permute(q, 0, 2, 1, 3)), 0, 2, 1, 3)
    inp = b.kv_inputs(False)
    if d.has(pre + "indexer.attn_k.weight") or not prev:
        sel = _kpool_select(b, il, x, qr, kp)
        if not gather:
            g.expand(sel)
            assert kp.gather_mask is not None
            live = g.op("unary", g.reshape(kp.gather_mask, kp.n_sel, n))  # exp(slot mask)
            dump = Tensor("f32", (kp.n_sel,), op="arange")
            sel = scatter_mask(b, kp, sel, live=live, dump=dump, mask=inp.mask, n_kv=inp.n_kv)
        prev[:] = [sel]
    sel = prev[0]
    g.expand(absorbed)
    g.expand(kv)
    kc = g.cache(d.type_k, lora, inp.n_kv, d.n_stream)
    g.expand(b.store_k(kc, kv, inp.k_idxs))
    if gather:
        assert kp.gather_mask is not None
        g.expand(inp.mask)
        n_sel = sel.ne[0]
        rows = g.view(kc, (lora, inp.n_kv * d.n_stream), (kc.nb[1],))
        k_g = g.reshape(g.get_rows(rows, g.reshape(sel, n_sel * n)), lora, n_sel, 1, n)
        kq = g.mul_mat(k_g, g.permute(absorbed, 0, 2, 3, 1))
        kq = g.op("soft_max", kq, kp.gather_mask)
        kqv = g.mul_mat(g.cont(g.transpose(k_g)), kq)
        kqv = g.mul_mat(g.weight(lora, d.mla_head_v, hq), kqv)
        cur = g.cont(g.permute(kqv, 0, 2, 1, 3))
        cur = g.reshape(cur, d.mla_head_v * hq, n)
        return b.linear(cur, d.n_embd)
    kview = g.view(
        kc,
        (lora, 1, inp.n_kv, d.n_stream),
        (row_size(kc.type, lora), row_size(kc.type, lora), row_size(kc.type, lora * inp.n_kv)),
    )
    vview = g.view(kview, (lora, 1, inp.n_kv, d.n_stream), kview.nb[1:])
    mask = g.reshape(sel, *inp.mask.ne)
    cur = b.attn_mha(absorbed, kview, vview, mask, v_mla=g.weight(lora, d.mla_head_v, hq))
    return b.linear(cur, d.n_embd)


def graph_glm5_next(b: Builder) -> None:
    """src/models/glm5-next.cpp: the embedding repeated into four streams; per layer a
    hyper-connection pre (collapse), attn norm, a KDA layer (no KV heads) or a k-pool DSA
    layer, hyper-connection post; the same around the FFN (leading dense layers, then
    sigmoid-routed experts plus a shared expert); the output rows selected, the streams
    averaged, the final norm (result_norm, also t_h_nextn), the output head."""
    d, g = b.d, b.g
    probs_bias = any(n.endswith("exp_probs_b.bias") for n in d.names)
    inp = b.inp_embd()
    kp = kpool_inputs(
        b,
        d.indexer_kpool,
        d.indexer_top_k,
        tail=d.indexer_kpool_tail,
        gather_mask=True,
        pool_pos=False,
    )
    n = b.n_tokens
    cur_hc = g.op("repeat", g.reshape(inp, d.n_embd, 1, n), ne=(d.n_embd, HC, n))
    prev: list[Tensor] = []
    for il in b.each_layer():
        residual = cur_hc
        cur, post, comb = _hc_pre(b, cur_hc)
        cur = g.expand(b.norm(cur))
        recurrent = b.is_recurrent(il)
        cur = kda_layer(b, il, cur) if recurrent else _dsa_layer(b, il, cur, kp, prev)
        cur_hc = _hc_post(b, cur, residual, post, comb)
        residual = cur_hc
        cur, post, comb = _hc_pre(b, cur_hc)
        cur = b.norm(cur)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = b.ffn(cur, d.n_ff[il])
        else:
            moe = Moe(
                gating="softmax" if d.expert_gating == 1 else "sigmoid",
                norm_w=d.expert_weights_norm,
                scale=d.expert_weights_scale not in (0.0, 1.0),
                probs_bias=probs_bias,
            )
            out = moe_ffn(b, cur, il, moe)
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                out = g.op("add", out, b.ffn(cur, shexp[1]))
            cur = out
        cur_hc = _hc_post(b, cur, residual, post, comb)
    flat = g.get_rows(g.reshape(cur_hc, d.n_embd * HC, n), b.out_ids())
    cur_hc = g.reshape(flat, d.n_embd, HC, flat.ne[1])
    b.output_head(hc_mean(b, cur_hc))


def hc_mean(b: Builder, x: Tensor) -> Tensor:
    """build_hc_mean: the streams summed (views, adds) and scaled."""
    g = b.g
    acc = g.view(x, (x.ne[0], x.ne[2]), (x.nb[2],))
    for _ in range(1, x.ne[1]):
        acc = g.op("add", acc, g.view(x, (x.ne[0], x.ne[2]), (x.nb[2],)))
    return g.op("scale", acc)


FAMILY = Family(graph_glm5_next, laid_out=("glm5-next",))
