"""Ling/Ring 2.5 (bailingmoe3): Kimi delta attention layers with MLA full-attention layers
between them, sigmoid-routed experts (src/models/bailingmoe3.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.delta_net import gated_delta_net
from qmgui.core.graph.dsa import mla_attn, mla_q
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def _limited_ffn(b: Builder, x: Tensor, n_ff: int, limit: float) -> Tensor:
    """build_ffn (SiLU, parallel gate) with the layer's swiglu_clamp_shexp: above zero the
    GLU is unfused (silu(gate) clamped times the clamped up rows)."""
    if limit <= 1e-6:
        return b.ffn(x, n_ff)
    g = b.g
    up = b.linear(x, n_ff)
    gate = g.op("clamp", g.op("unary", b.linear(x, n_ff)))
    return b.linear(g.op("mul", gate, g.op("clamp", up)), x.ne[0])


def _kda_conv(b: Builder, x: Tensor, states: Tensor, *, d_conv: int, head: int) -> Tensor:
    """bailingmoe3_causal_conv1d: one of Q, K, V projected, its cached columns prepended
    (a view of the layer's gathered conv states), the newest columns written back, the
    depthwise conv, SiLU."""
    g = b.g
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    d_inner = states.ne[0] // (3 * (d_conv - 1))
    part = (d_conv - 1) * d_inner
    col = row_size("f32", d_conv - 1)
    state = g.view(states, (d_conv - 1, d_inner, n_seqs), (col, states.nb[1]))
    proj = g.reshape(b.linear(x, d_inner), d_inner, n_t, n_seqs)
    conv_x = g.concat(state, g.transpose(proj), 0)
    cache = g.cache("f32", 3 * part, max(1, n_seqs))
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    dst = g.view(cache, (d_conv - 1, d_inner, n_seqs), (row_size("f32", d_conv - 1), cache.nb[1]))
    g.expand(g.cpy(last, dst))
    conv = Tensor(
        "f32", (d_inner, n_t, n_seqs), op="ssm_conv", src=(conv_x, g.weight(d_conv, d_inner))
    )
    out = g.op("unary", g.reshape(conv, d_inner, n_t * n_seqs))
    return g.reshape(out, head, d_inner // head, n_t, n_seqs)


def _l2(b: Builder, x: Tensor) -> Tensor:
    """build_gdn_l2_norm: rms_norm then scale."""
    return b.g.op("scale", b.g.op("rms_norm", x))


def _kda_layer(b: Builder, il: int, x: Tensor) -> Tensor:
    """bailingmoe3.cpp's recurrent branch: Q, K, V each through a short causal conv, a
    per-channel decay gate (f_a + dt bias, times A, sigmoid, scaled), beta, the gated delta
    net over the layer's state, an RMS norm gated by sigmoid(g_a x), out-projection."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_seqs = b.s.n_seqs
    n_tok = x.ne[1]
    n_t = n_tok // n_seqs
    conv_w = d.shape(pre + "ssm_conv1d_q.weight") or (4, 1, d.n_embd)
    d_conv, d_inner = conv_w[0], conv_w[-1]
    n_head = d.n_head[0] or 1  # hparams.n_head(): layer 0's
    head = d_inner // n_head
    states = b.rs(3 * (d_conv - 1) * d_inner)
    q = _kda_conv(b, x, states, d_conv=d_conv, head=head)
    k = _kda_conv(b, x, states, d_conv=d_conv, head=head)
    v = _kda_conv(b, x, states, d_conv=d_conv, head=head)
    gate = g.op("add", b.linear(x, d_inner), g.weight(d_inner))
    gate = g.op("mul", g.reshape(gate, head, n_head, n_tok), g.weight(1, n_head, 1))
    gate = g.reshape(g.op("scale", g.op("unary", gate)), head, n_head, n_t, n_seqs)
    beta = g.op("unary", g.reshape(b.linear(x, n_head), 1, n_head, n_t, n_seqs))
    q, k = _l2(b, q), _l2(b, k)
    state = g.reshape(b.rs(head * head * n_head), head, head, n_head, n_seqs)
    out = gated_delta_net(b, (q, k, v), gate, beta, state)
    out = g.reshape(g.cont(out), head, n_head, n_tok)
    out = b.norm(out)
    out_gate = g.reshape(b.linear(x, d_inner), head, n_head, n_tok)
    out = g.op("mul", out, g.op("unary", out_gate))
    return b.linear(g.cont(out, d_inner, n_tok), d.n_embd)


def _mla_layer(b: Builder, il: int, x: Tensor) -> Tensor:
    """bailingmoe3.cpp's attention branch: DeepSeek-style MLA with absorption (Q through a
    LoRA pair or one matmul, the no-RoPE part absorbed by wk_b, K the normed compressed KV
    plus the roped key, V a view of the K cache, wv_b after the attention), then a per-head
    sigmoid gate from the layer input, wo."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope = d.mla_kv_lora, d.mla_rope
    head_k = d.mla_head_k
    nope = head_k - rope
    q = mla_q(b, il, x, hq * head_k)
    head_row = row_size("f32", head_k)
    q_nope = g.view(q, (nope, hq, n_tok), (head_row, head_row * hq))
    q_pe = g.view(q, (rope, hq, n_tok), (head_row, head_row * hq))
    kv_all = b.linear(x, lora + rope)
    kv = g.view(kv_all, (lora, n_tok), (kv_all.nb[1],))
    k_pe = g.view(kv_all, (rope, 1, n_tok), (kv_all.nb[1], kv_all.nb[1]))
    q_pe = b.rope(q_pe)
    k_pe = b.rope(k_pe)
    kv = b.norm(kv)
    q_nope = g.permute(q_nope, 0, 2, 1, 3)
    q_nope = g.permute(g.mul_mat(g.weight(nope, lora, hq), q_nope), 0, 2, 1, 3)
    q_cur = g.concat(q_nope, q_pe, 0)
    v_cur = g.reshape(kv, lora, 1, n_tok)
    k_cur = g.concat(v_cur, k_pe, 0)
    cur = mla_attn(b, il, (q_cur, k_cur, v_cur), b.kv_inputs(False))
    gate = g.op("unary", g.reshape(b.linear(x, hq), 1, hq, n_tok))
    cur = g.op("mul", g.reshape(cur, d.mla_head_v, hq, n_tok), gate)
    return b.linear(g.cont(cur, d.mla_head_v * hq, n_tok), d.n_embd)


def graph_bailingmoe3(b: Builder) -> None:
    """src/models/bailingmoe3.cpp: KDA layers (no attention heads) and MLA layers, leading
    dense FFN layers then routed experts (the GGUF's gating, bias, norm and scale) plus a
    shared expert, both with optional SwiGLU limits; the final norm is a graph output
    (t_h_nextn) and the output rows are selected after it."""
    d, g = b.d, b.g
    probs_bias = any(n.endswith("exp_probs_b.bias") for n in d.names)
    inp = b.inp_embd()
    b.inp_pos(4 if d.use_mrope else 1)  # VL files rope with M-RoPE: four positions a token
    for il in b.each_layer():
        cur = b.norm(inp)
        cur = _kda_layer(b, il, cur) if b.is_recurrent(il) else _mla_layer(b, il, cur)
        ffn_inp = g.op("add", cur, inp)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = _limited_ffn(b, cur, d.n_ff[il], d.clamp_shexp(il))
        else:
            moe = Moe(
                gating="sigmoid" if d.expert_gating == 2 else "softmax",
                norm_w=d.expert_weights_norm,
                scale=d.expert_weights_scale not in (0.0, 1.0),
                probs_bias=probs_bias,
                limit=d.clamp_exp(il),
            )
            out = moe_ffn(b, cur, il, moe)
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                out = g.op("add", out, _limited_ffn(b, cur, shexp[1], d.clamp_shexp(il)))
            cur = out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp, norm_is_output=True)


FAMILY = Family(graph_bailingmoe3, laid_out=("bailingmoe3",))
