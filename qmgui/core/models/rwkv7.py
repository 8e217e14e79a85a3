"""RWKV-7 (src/models/rwkv7.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.rwkv import rwkv7_time_mix
from qmgui.core.models.family import Family


def graph_rwkv7(b: Builder) -> None:
    """src/models/rwkv7.cpp: layer-normed embeddings; per layer the token shift (recurrent
    state r) feeds the time mix and the channel mix (squared-ReLU FFN); state s is the WKV
    matrix; shifts are written back with one copy per layer."""
    d, g = b.d, b.g
    n_embd = d.n_embd
    n_seqs = b.s.n_seqs
    n_t = b.n_tokens // n_seqs
    inp = b.norm(b.inp_embd(), kind="norm", bias=True)
    first_v: list[Tensor] = []
    for il in b.each_layer():
        inp = g.reshape(inp, n_embd, n_t, n_seqs)
        shift = g.reshape(b.rs(n_embd * 2), n_embd, 2, n_seqs)
        att_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]))
        ffn_shift = g.view(shift, (n_embd, 1, n_seqs), (shift.nb[1], shift.nb[2]))
        att_norm = b.norm(inp, kind="norm", bias=True)
        head = (att_norm.nb[1], att_norm.nb[2])
        x_prev = g.concat(att_shift, g.view(att_norm, (n_embd, n_t - 1, n_seqs), head), 1)
        cur = rwkv7_time_mix(b, il, att_norm, x_prev, first_v)
        ffn_inp = g.op("add", cur, inp)
        ffn_norm = b.norm(ffn_inp, kind="norm", bias=True)
        x_prev = g.concat(ffn_shift, g.view(ffn_norm, (n_embd, n_t - 1, n_seqs), head), 1)
        new_shift = g.concat(
            g.view(att_norm, (n_embd, 1, n_seqs), head),
            g.view(ffn_norm, (n_embd, 1, n_seqs), head),
            1,
        )
        r_cache = g.cache("f32", n_embd * 2, max(1, n_seqs))
        g.expand(
            g.cpy(
                g.view(new_shift, (n_embd * n_seqs * 2,)), g.view(r_cache, (n_embd * 2 * n_seqs,))
            )
        )
        ffn_inp, ffn_norm, x_prev = b.last_rows(
            il, *(g.reshape(t, n_embd, n_t * n_seqs) for t in (ffn_inp, ffn_norm, x_prev))
        )
        sx = g.op("sub", x_prev, ffn_norm)
        xk = g.op("add", g.op("mul", sx, g.weight(n_embd, 1, 1)), ffn_norm)
        key = g.op("sqr", g.op("unary", b.linear(xk, d.n_ff[il])))
        inp = g.op("add", b.linear(key, n_embd), ffn_inp)
    b.output_head(inp, kind="norm")


FAMILY = Family(graph_rwkv7, verified=("rwkv7",))
