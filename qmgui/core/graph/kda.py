"""Kimi Delta Attention (src/models/kimi-linear.cpp, kimi-k3.cpp; the fused delta net of
delta-net-base.cpp) and the RoPE-less latent attention the Kimi hybrids pair it with."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.delta_net import gated_delta_net
from qmgui.core.graph.dsa import mla_attn, mla_q


@dataclass(frozen=True)
class KdaDims:
    """The KDA layer's widths, read from its tensors: conv kernel, head width, heads."""

    d_conv: int
    head_dim: int
    n_head: int

    @property
    def d_inner(self) -> int:
        return self.head_dim * self.n_head


def kda_dims(b: Builder, il: int) -> KdaDims:
    """ssm_conv1d_q is [d_conv, 1, d_inner(, 1)], ssm_norm [head_dim]."""
    d = b.d
    conv = d.shape(f"blk.{il}.ssm_conv1d_q.weight")
    norm = d.shape(f"blk.{il}.ssm_norm.weight")
    if not conv or not norm:
        raise ValueError(f"layer {il}: no KDA conv or norm tensor")
    d_inner = conv[2] if len(conv) > 2 else conv[1]
    head_dim = norm[0]
    return KdaDims(conv[0], head_dim, d_inner // head_dim)


def _conv1d(b: Builder, k: KdaDims, conv_all: Tensor, x: Tensor) -> Tensor:
    """causal_conv1d (kimi-linear.cpp) up to the convolution: this projection's third of the
    conv state, the projected tokens (transposed) appended, the last d_conv - 1 columns
    copied back to the state cache. Returns the concatenated input."""
    g = b.g
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    n_r = 3 * (k.d_conv - 1) * k.d_inner
    state = g.view(conv_all, (k.d_conv - 1, k.d_inner, n_seqs), ((k.d_conv - 1) * 4, n_r * 4))
    x3 = g.reshape(x, k.d_inner, n_t, n_seqs)
    conv_x = g.concat(state, g.transpose(x3), 0)
    last = g.view(conv_x, (k.d_conv - 1, k.d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    cache = g.cache("f32", n_r, max(1, n_seqs))
    dst = g.view(cache, (k.d_conv - 1, k.d_inner, n_seqs), ((k.d_conv - 1) * 4, n_r * 4))
    g.expand(g.cpy(last, dst))
    return conv_x


def _conv_out(b: Builder, k: KdaDims, conv_x: Tensor) -> Tensor:
    """ggml_ssm_conv over the concatenated input, SiLU, as [head_dim, n_head, n_t, n_seqs]."""
    g = b.g
    n_seqs = conv_x.ne[2]
    n_t = conv_x.ne[0] - (k.d_conv - 1)
    conv = Tensor(
        "f32",
        (k.d_inner, n_t, n_seqs),
        op="ssm_conv",
        src=(conv_x, g.reshape(g.weight(k.d_conv, 1, k.d_inner), k.d_conv, k.d_inner)),
    )
    cur = g.op("unary", g.reshape(conv, k.d_inner, n_t * n_seqs))
    return g.reshape(cur, k.head_dim, k.n_head, n_t, n_seqs)


def kda_layer(b: Builder, il: int, x: Tensor, *, full_gate: bool = False) -> Tensor:
    """kimi-linear.cpp's KDA branch (kimi-k3.cpp build_kda_layer with `full_gate`): Q, K, V
    each through its own causal conv (one state tensor, three thirds), a per-channel decay
    from the f_a/f_b pair, beta from a small projection, L2-normed Q and K (build_gdn_l2_norm:
    rms_norm then scale; b10435's l2_norm allocates alike), the fused gated delta net
    (output + new state in one tensor, the state copied back), an RMS norm gated by
    sigmoid(g_b(g_a(x))) (K3: one full-rank g), out-projection."""
    d, g = b.d, b.g
    k = kda_dims(b, il)
    n_seqs = b.s.n_seqs
    n_tok = x.ne[1]
    n_t = n_tok // n_seqs
    n_r = 3 * (k.d_conv - 1) * k.d_inner
    n_s = k.head_dim * k.head_dim * k.n_head
    conv_all = b.rs(n_r)
    pre = f"blk.{il}."
    if d.has(pre + "attn_qkv.weight"):
        qkv = b.linear(x, 3 * k.d_inner)
        ins = [
            g.cont(g.view(qkv, (k.d_inner, n_tok), (qkv.nb[1],)), k.d_inner, n_tok)
            for _ in range(3)
        ]
    else:
        ins = [b.linear(x, k.d_inner) for _ in range(3)]
    convs = [_conv1d(b, k, conv_all, t) for t in ins]
    # decay gate
    g1 = b.linear(b.linear(x, k.head_dim), k.d_inner)
    g1 = g.op("add", g1, g.weight(k.d_inner))
    # kimi-linear: softplus, then times -exp(A_log); K3 (kda.gate_lower_bound set): times
    # A, then scale, sigmoid, scale, all in place
    a_log = g.reshape(g.weight(1, k.n_head), 1, k.n_head, 1)
    if full_gate:
        g1 = g.op("mul", g.reshape(g1, k.head_dim, k.n_head, n_tok), a_log)
        g1 = g.op("scale", g.op("unary", g.op("scale", g1)))
    else:
        g1 = g.op("unary", g1)
        g1 = g.op("mul", g.reshape(g1, k.head_dim, k.n_head, n_tok), a_log)
    g1 = g.reshape(g1, k.head_dim, k.n_head, n_t, n_seqs)
    beta = g.reshape(b.linear(x, k.n_head), 1, k.n_head, n_t, n_seqs)
    beta = g.op("unary", beta)
    state = g.reshape(b.rs(n_s), k.head_dim, k.head_dim, k.n_head, n_seqs)
    q, kk, v = (_conv_out(b, k, c) for c in convs)
    q = g.op("scale", g.op("rms_norm", q))
    kk = g.op("scale", g.op("rms_norm", kk))
    out = gated_delta_net(b, (q, kk, v), g1, beta, state)
    out = g.cont(out)
    x2 = g.reshape(g.reshape(x, x.ne[0], n_t, n_seqs), x.ne[0], n_tok)  # cur_3d, cur_2d
    g_in = x2 if full_gate else b.linear(x2, k.head_dim)  # K3: one full-rank gate
    g2 = b.linear(g_in, k.d_inner)
    g2 = g.reshape(g2, k.head_dim, k.n_head, n_tok)
    normed = b.norm(g.reshape(out, k.head_dim, k.n_head, n_tok))
    gated = g.op("mul", normed, g.op("unary", g2))
    gated = g.cont(gated, k.d_inner, n_tok)
    return b.linear(gated, d.n_embd)


def mla_nope_attn(b: Builder, il: int, x: Tensor, *, gate: bool = False) -> Tensor:
    """The Kimi MLA branch (kimi-linear.cpp; kimi-k3.cpp build_mla_layer with `gate`): as
    DeepSeek's absorbed latent attention (models/deepseek2.py) but without RoPE; Q from
    one matmul or a normed LoRA pair; build_attn over the K-only cache with wv_b
    decompressing. K3 gates the attention output with sigmoid(attn_gate(x)) before wo; the
    output projection's scale tensor (wo_s) multiplies in place where the GGUF has one."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    if not d.has(pre + "attn_k_b.weight"):
        raise ValueError(f"layer {il}: a Kimi MLA layer without the split wk_b/wv_b")
    n_tok = x.ne[1]
    hq = d.n_head[il] or d.n_head[0]
    lora, rope = d.mla_kv_lora, d.mla_rope
    nope = d.mla_head_k - rope
    n_q = hq * d.mla_head_k
    q = mla_q(b, il, x, n_q)
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],))
    k_pe = g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1]))
    kv_cmpr = b.norm(kv_cmpr)
    head_row = row_size("f32", d.mla_head_k)
    q_nope = g.permute(g.view(q, (nope, hq, n_tok), (head_row, head_row * hq)), 0, 2, 1, 3)
    q_pe = g.view(q, (rope, hq, n_tok), (head_row, head_row * hq))
    absorbed = g.permute(g.mul_mat(g.weight(nope, lora, hq), q_nope), 0, 2, 1, 3)
    q_cur = g.concat(absorbed, q_pe, 0)
    v_cur = g.reshape(kv_cmpr, lora, 1, n_tok)
    k_cur = g.concat(v_cur, k_pe, 0)
    cur = mla_attn(b, il, (q_cur, k_cur, v_cur), b.kv_inputs(False))
    if gate and d.has(pre + "attn_gate.weight"):
        cur = g.op("mul", cur, g.op("unary", b.linear(x, cur.ne[0])))
    cur = b.linear(cur, d.n_embd)
    if not gate and d.has(pre + "attn_output.scale"):  # build_attn's wo_s (K3 has none)
        cur = g.op("mul", cur, g.weight(1))
    return cur
