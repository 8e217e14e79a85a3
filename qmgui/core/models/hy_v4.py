"""Hunyuan V4 (hy_v4): DeepSeek-V4-style independent hyper-connections (hc parallel residual
streams, reduced before and redistributed after each block) around gated MLA attention, with
an optional DSA lightning indexer, leading dense FFN layers then routed plus shared experts
(src/models/hy-v4.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dsa import LidInputs, indexer_top_k, lid_inputs, mla_absorbed, mla_attn
from qmgui.core.graph.ffn import moe_ffn
from qmgui.core.models.dots3note import routing, shexp_width
from qmgui.core.models.family import Family


def _cast(b: Builder, x: Tensor) -> Tensor:
    """ggml_cast (to f32 here, as every stream is): a copy, never in place."""
    return b.g.op("cpy", x, type_="f32")


def _hc_reduce(b: Builder, x: Tensor, w: Tensor) -> Tensor:
    """hy_v4_hc_reduce: the streams x[:, i, :] (of an f32 copy) weighted by w[i, :] and
    summed, then copied back to x's type."""
    g = b.g
    n_embd, hc, nt = x.ne[0], x.ne[1], x.ne[2]
    xf = _cast(b, x)
    out: Tensor | None = None
    for _ in range(hc):
        xh = g.view(xf, (n_embd, nt), (xf.nb[2],))
        wh = g.view(w, (1, nt), (w.nb[1],))
        cur = g.op("mul", xh, wh)
        out = cur if out is None else g.op("add", out, cur)
    assert out is not None
    return _cast(b, out)


def _hc_mixes(b: Builder, x: Tensor, n_mix: int) -> Tensor:
    """The streams flattened, RMS-normed (no weight) and projected to n_mix coefficients."""
    g = b.g
    flat = g.reshape(x, x.ne[0] * x.ne[1], x.ne[2])
    return b.linear(g.op("rms_norm", flat), n_mix)


def _hc_gate(b: Builder, mixes: Tensor, first: int, hc: int, *, magnitude: bool) -> Tensor:
    """sigmoid(mixes[first:first+hc] * scale + base) (times the magnitude) + eps."""
    g = b.g
    cur = g.view(mixes, (hc, mixes.ne[1]), (mixes.nb[1],))
    cur = g.op("unary", g.op("add", g.op("mul", cur, g.weight(1)), g.weight(hc)))
    if magnitude:
        cur = g.op("scale", cur)
    return g.op("scale", cur)


def _hc_pre(b: Builder, x: Tensor) -> tuple[Tensor, Tensor]:
    """build_hc_pre: the block's input (the streams reduced by the pre gate) and the post
    gate for build_hc_post."""
    hc = x.ne[1]
    mixes = _hc_mixes(b, x, 2 * hc)
    pre = _hc_gate(b, mixes, 0, hc, magnitude=False)
    post = _hc_gate(b, mixes, hc, hc, magnitude=True)
    return _hc_reduce(b, x, pre), post


def _hc_post(b: Builder, x: Tensor, residual: Tensor, post: Tensor) -> Tensor:
    """build_hc_post, in f32 copies: stream i = residual[:, i, :] + x * post[i, :], the
    streams concatenated back to [n_embd, hc, n_tokens] and copied to the residual's type."""
    g = b.g
    n_embd, hc, nt = residual.ne[0], residual.ne[1], residual.ne[2]
    xf = _cast(b, x)
    pf = _cast(b, post)
    rf = _cast(b, residual)
    out: Tensor | None = None
    for _ in range(hc):
        res_i = g.view(rf, (n_embd, nt), (rf.nb[2],))
        post_i = g.view(pf, (1, nt), (pf.nb[1],))
        cur = g.op("add", res_i, g.op("mul", xf, post_i))
        cur = g.reshape(cur, n_embd, 1, nt)
        out = cur if out is None else g.concat(out, cur, 1)
    assert out is not None
    return _cast(b, out)


def _attention(
    b: Builder, il: int, x: Tensor, lid: LidInputs | None, last_top_k: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """build_attention(_dsa): Q LoRA; on DSA checkpoints the lightning indexer's top k on
    layers that own an indexer (no Hadamard rotation), reused by the following ones; MLA
    with absorption and attention sinks; the elementwise sigmoid gate; wo."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    q_a = d.shape(pre + "attn_q_a.weight")
    qr = b.norm(b.linear(x, q_a[1] if q_a and len(q_a) > 1 else x.ne[0]))
    top = last_top_k
    if lid is not None and (d.has(pre + "indexer.attn_q_b.weight") or top is None):
        top = indexer_top_k(b, il, x, qr, lid, rotate=False)
    qkv = mla_absorbed(b, il, x, qr)
    attn = mla_attn(b, il, qkv, b.kv_inputs(False), top_k=top, sinks=True)
    gate = g.op("unary", b.linear(x, attn.ne[0]))
    attn = g.op("mul", attn, gate)
    return b.linear(attn, d.n_embd), top


def graph_hy_v4(b: Builder) -> None:
    """src/models/hy-v4.cpp (b11434): the embedding repeated into hc streams; per layer
    hc_pre, RMS norm, attention, hc_post, hc_pre, RMS norm, the dense or routed + shared
    FFN, hc_post; the output rows picked once after the last layer, the hc head (the
    streams reduced by their own gate), the output norm and head."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    hc_fn = d.shape("blk.0.hc_attn_fn.weight")
    hc = hc_fn[1] // 2 if hc_fn and len(hc_fn) > 1 else 4
    n_tok = inp.ne[1]
    lid = lid_inputs(b, 0) if d.indexer_top_k > 0 else None
    top: Tensor | None = None
    cur = g.op("repeat", g.reshape(inp, d.n_embd, 1, n_tok), ne=(d.n_embd, hc, n_tok))
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = cur
        x, post = _hc_pre(b, cur)
        attn, top = _attention(b, il, b.norm(x), lid, top)
        cur = _hc_post(b, attn, residual, post)
        residual = cur
        x, post = _hc_pre(b, cur)
        x = b.norm(x)
        if il < d.leading_dense or not d.has(pre + "ffn_gate_inp.weight"):
            ffn = b.ffn(x, d.n_ff[il])
        else:
            m = routing(b, il)
            m.scaled = False  # hy-v4.cpp passes no expert scales
            ffn = moe_ffn(b, x, il, m)
            n_sh = shexp_width(b, il)
            if n_sh:
                ffn = g.op("add", ffn, b.ffn(x, n_sh))
        cur = _hc_post(b, ffn, residual, post)
    flat = g.get_rows(g.reshape(cur, d.n_embd * hc, n_tok), b.out_ids())
    cur = g.reshape(flat, d.n_embd, hc, b.s.n_outputs)
    mixes = _hc_mixes(b, cur, hc)
    head = g.op("scale", g.op("unary", g.op("add", g.op("mul", mixes, g.weight(1)), g.weight(hc))))
    b.output_head(_hc_reduce(b, cur, head))


FAMILY = Family(graph_hy_v4, laid_out=("hy_v4",))
