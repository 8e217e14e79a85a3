"""MiniMax-01's lightning attention: linear attention over one ubatch with per-head decays
and a [head, head] state per head (src/models/minimax-01.cpp, llm_graph_input_la)."""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


@dataclass(frozen=True)
class LightningInputs:
    """llm_graph_input_la: the ALiBi-like slopes and the exponents of the decays."""

    slopes: Tensor  # [n_head]
    q_decay: Tensor  # [1, n_head, n_seq_tokens, n_seqs]
    k_decay: Tensor
    diag_decay: Tensor  # [n_seq_tokens, n_seq_tokens, n_head, n_seqs]

    @staticmethod
    def build(b: Builder) -> LightningInputs:
        g = b.g
        n_head = b.d.n_head[0]
        n_seqs = b.s.n_seqs
        n_t = b.n_tokens // n_seqs
        return LightningInputs(
            g.input("f32", n_head),
            g.input("f32", 1, n_head, n_t, n_seqs),
            g.input("f32", 1, n_head, n_t, n_seqs),
            g.input("f32", n_t, n_t, n_head, n_seqs),
        )


def lightning_attn(b: Builder, il: int, x: Tensor, la: LightningInputs) -> Tensor:
    """minimax-01.cpp's linear-attention branch: the (empty) conv state and the [head, head,
    n_head] state read by build_rs; fused QKV with SiLU, split by views; the output is the
    decayed state applied to Q plus the diagonal block (QK^T times the diagonal decay, times
    V); the new state (decayed old state plus K^T V) is copied back; the output is RMS-normed
    over all heads, gated by sigmoid(wg x), projected by wo."""
    d, g = b.d, b.g
    n_seqs = b.s.n_seqs
    n_tok = x.ne[1]
    n_t = n_tok // n_seqs
    n_head = d.n_head[il] or d.n_head[0]
    hd = d.head_k
    g.expand(b.rs(0))  # n_embd_r is 0: no conv state, but build_rs still runs
    x4 = g.reshape(x, x.ne[0], n_t, 1, n_seqs)
    qkv = g.op("unary", b.linear(x4, 3 * hd * n_head))
    qkv = g.reshape(qkv, 3 * hd, n_head, n_t, n_seqs)
    strides = (qkv.nb[1], qkv.nb[2], qkv.nb[3])
    q = g.view(qkv, (hd, n_head, n_t, n_seqs), strides)
    k = g.view(qkv, (hd, n_head, n_t, n_seqs), strides)
    v = g.view(qkv, (hd, n_head, n_t, n_seqs), strides)
    n_s = hd * hd * n_head
    kv_old = g.reshape(b.rs(n_s), hd, hd, n_head, n_seqs)
    q_decay = g.op("unary", g.op("scale", la.q_decay))
    k_decay = g.op("unary", g.op("scale", la.k_decay))
    diag_decay = g.op("unary", g.op("scale", la.diag_decay))
    q_s = g.op("mul", q, q_decay, ne=q.ne)
    none_diag = g.mul_mat(kv_old, g.permute(q_s, 0, 2, 1, 3))
    qk = g.mul_mat(g.permute(k, 0, 2, 1, 3), g.permute(q, 0, 2, 1, 3))
    qk = g.op("mul", qk, diag_decay)
    v_trans = g.cont(g.permute(v, 1, 2, 0, 3))
    diag = g.mul_mat(v_trans, qk)
    out = g.expand(g.op("add", none_diag, diag))
    slope_rate = g.op("scale", la.slopes)
    block_decay = g.op("unary", g.op("scale", slope_rate))
    kv_old_s = g.op("mul", kv_old, g.reshape(block_decay, 1, 1, n_head), ne=kv_old.ne)
    k_dec = g.op("mul", k, k_decay, ne=k.ne)
    k_dec_t = g.cont(g.permute(k_dec, 1, 2, 0, 3))
    kv_new = g.op("add", kv_old_s, g.mul_mat(k_dec_t, v_trans))
    s_cache = g.cache("f32", n_s, max(1, n_seqs))
    g.expand(g.cpy(kv_new, g.view(s_cache, (n_s * n_seqs,))))
    out = g.cont(g.permute(out, 0, 2, 1, 3))
    out = g.reshape(out, hd * n_head, n_t, 1, n_seqs)
    normed = b.norm(out)
    gate = g.op("unary", b.linear(x4, hd * n_head))
    cur = b.linear(g.op("mul", gate, normed), d.n_embd)
    return g.reshape(cur, d.n_embd, n_tok)
