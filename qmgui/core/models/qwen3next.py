"""Qwen3-Next and Qwen 3.5: gated delta net and gated attention (src/models/qwen3next.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.delta_net import gdn_layer
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def _gated_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """qwen3next build_layer_attn: Q projection carries a per-head output gate; Q/K norms,
    RoPE, attention without wo, sigmoid(gate) * output, then wo."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq, hkv, hd = d.n_head[il], d.n_head_kv[il], d.head_k
    q_full = g.reshape(b.linear(x, 2 * hd * hq), 2 * hd, hq, n_tok, 1)
    k = g.reshape(b.linear(x, hd * hkv), hd, hkv, n_tok)
    v = g.reshape(b.linear(x, hd * hkv), hd, hkv, n_tok)
    strides = (q_full.nb[1], q_full.nb[2], q_full.nb[3])
    q = g.view(q_full, (hd, hq, n_tok, 1), strides)
    gate = g.view(q_full, (hd, hq, n_tok, 1), strides)
    q = b.rope(b.norm(q))
    k = b.rope(b.norm(k))
    cur = b.attn_kv(il, q, k, v, wo=False)
    gate = g.op("unary", g.cont(gate, hd * hq, n_tok))
    return b.linear(g.op("mul", cur, gate), d.n_embd)


def graph_qwen3next(b: Builder) -> None:
    """src/models/qwen3next.cpp: gated delta net layers with a gated full-attention layer
    every `full_attention_interval`; post-attention norm; softmax-routed experts plus a
    sigmoid-gated shared expert; the final norm is kept as an output (MTP input) and the
    output rows are selected after it."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = g.expand(b.norm(inp))
        cur = gdn_layer(b, il, cur) if b.is_recurrent(il) else _gated_attn(b, il, cur)
        residual = g.op("add", cur, inp)
        cur = b.norm(residual)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            out = moe_ffn(b, cur, il, Moe())
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                sh = b.ffn(cur, shexp[1])
                sh_gate = g.op("unary", b.linear(cur, 1))
                out = g.op("add", out, g.op("mul", sh, sh_gate))
        else:
            out = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", out, residual)
    b.output_head(inp, norm_is_output=True)


FAMILY = Family(graph_qwen3next, verified=("qwen3next",), relatives=("qwen35", "qwen35moe"))
