"""The gated delta net layer (src/models/qwen3next.cpp, delta-net-base.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def _gdn_qkv(b: Builder, il: int, x: Tensor) -> tuple[Tensor, Tensor]:
    """qwen3next build_qkvz: fused QKV and gate projections, or the legacy mixed one."""
    d, g = b.d, b.g
    _, d_inner, head_k, num_k, num_v = d.ssm
    head_v = d_inner // num_v
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * num_k * head_k
    if d.has(f"blk.{il}.attn_qkv.weight"):
        qkv = g.reshape(b.linear(x, channels), channels, n_t, n_seqs)
        return qkv, b.linear(x, head_v * num_v)
    per_k = 2 * head_k + 2 * head_v * (num_v // num_k)
    mixed = g.reshape(b.linear(x, per_k * num_k), per_k, num_k, n_t, n_seqs)
    strides = (mixed.nb[1], mixed.nb[2], mixed.nb[3])
    width_v = head_v * num_v // num_k
    z = g.cont(g.view(mixed, (width_v, num_k, n_t, n_seqs), strides))
    q = g.cont(g.view(mixed, (head_k, num_k, n_t, n_seqs), strides), head_k * num_k, n_t, n_seqs)
    k = g.cont(g.view(mixed, (head_k, num_k, n_t, n_seqs), strides), head_k * num_k, n_t, n_seqs)
    v = g.cont(g.view(mixed, (width_v, num_k, n_t, n_seqs), strides), head_v * num_v, n_t, n_seqs)
    return g.concat(g.concat(q, k, 0), v, 0), z


def gdn_layer(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/qwen3next.cpp build_layer_attn_linear (+ delta-net-base): QKV through a
    causal conv over cached tokens, L2-normed Q/K (repeated to the value heads), decay and
    beta from a small projection, the fused gated delta net (output + new state in one
    tensor), a gated RMS norm with z, out-projection."""
    d, g = b.d, b.g
    d_conv, d_inner, head_k, num_k, num_v = d.ssm
    head_v = d_inner // num_v
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * num_k * head_k
    qkv, z = _gdn_qkv(b, il, x)
    ba = g.reshape(b.linear(x, 2 * num_v), 2 * num_v // num_k, num_k, n_t, n_seqs)
    ba_strides = (ba.nb[1], ba.nb[2], ba.nb[3])
    beta = g.op("unary", g.cont(g.view(ba, (num_v // num_k, num_k, n_t, n_seqs), ba_strides)))
    alpha = g.cont(g.view(ba, (num_v // num_k, num_k, n_t, n_seqs), ba_strides), num_v, n_t, n_seqs)
    alpha = g.op("unary", g.op("add", alpha, g.weight(num_v)))
    decay = g.reshape(g.op("mul", alpha, g.weight(num_v)), 1, num_v, n_t, n_seqs)
    beta = g.reshape(beta, 1, num_v, n_t, n_seqs)
    conv_states = g.reshape(b.rs((d_conv - 1) * channels), d_conv - 1, channels, n_seqs)
    conv_input = g.concat(conv_states, g.transpose(qkv), 0)
    last = g.view(conv_input, (d_conv - 1, channels, n_seqs), (conv_input.nb[1], conv_input.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * channels, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * channels, n_seqs))))
    state = g.reshape(b.rs(head_v * head_v * num_v), head_v, head_v, num_v, n_seqs)
    conv = Tensor(
        "f32", (channels, n_t, n_seqs), op="ssm_conv", src=(conv_input, g.weight(d_conv, channels))
    )
    conv = g.op("unary", conv)
    cs = (conv.nb[1], conv.nb[1] * n_t)
    q = g.op("l2_norm", g.view(conv, (head_k, num_k, n_t, n_seqs), (head_k * 4, *cs)))
    k = g.op("l2_norm", g.view(conv, (head_k, num_k, n_t, n_seqs), (head_k * 4, *cs)))
    v = g.view(conv, (head_v, num_v, n_t, n_seqs), (head_v * 4, *cs))
    if num_k != num_v:
        rep = num_v // num_k
        q = g.reshape(
            g.op(
                "repeat",
                g.reshape(q, head_k, 1, num_k, n_t * n_seqs),
                ne=(head_k, rep, num_k, n_t * n_seqs),
            ),
            head_k,
            num_v,
            n_t,
            n_seqs,
        )
        k = g.reshape(
            g.op(
                "repeat",
                g.reshape(k, head_k, 1, num_k, n_t * n_seqs),
                ne=(head_k, rep, num_k, n_t * n_seqs),
            ),
            head_k,
            num_v,
            n_t,
            n_seqs,
        )
    out = gated_delta_net(b, (q, k, v), decay, beta, state)
    gate = g.op("unary", g.reshape(z, head_v, num_v, n_t, n_seqs))
    normed = g.op("mul", b.norm(out), gate)
    cur = b.linear(g.reshape(normed, head_v * num_v, n_t, n_seqs), d.n_embd)
    return g.reshape(cur, d.n_embd, n_t * n_seqs)


def gated_delta_net(
    b: Builder, qkv: tuple[Tensor, Tensor, Tensor], decay: Tensor, beta: Tensor, state: Tensor
) -> Tensor:
    """ggml_gated_delta_net over the layer's state, the new state stored back into the state
    cache; returns the output rows [head_v, n_v_heads, tokens, sequences] (a view of the
    op's result, which holds them and then the states). V: [head_v, n_v_heads, tokens,
    sequences]."""
    g = b.g
    v = qkv[2]
    head_v, num_v, n_t, n_seqs = v.ne[0], v.ne[1], v.ne[2], v.ne[3]
    gdn = Tensor(
        "f32",
        (head_v * num_v, n_t * n_seqs + head_v * n_seqs),
        op="gated_delta_net",
        src=(*qkv, decay, beta, state),
    )
    out = g.view(gdn, (head_v, num_v, n_t, n_seqs))
    new_state = g.view(gdn, (head_v, head_v, num_v, n_seqs))
    n_s = head_v * head_v * num_v
    s_cache = g.cache("f32", n_s, max(1, n_seqs))
    g.expand(g.cpy(new_state, g.view(s_cache, (n_s, n_seqs))))
    return out
