"""Talkie (src/models/talkie.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.models.family import Family


def graph_talkie(b: Builder) -> None:
    """src/models/talkie.cpp: RMS-normed embeddings (weightless norms throughout) kept for
    the whole stack: every layer adds them back scaled (a mul that cannot run in place, its
    parent living on), after the usual attention (Q/K normed after RoPE) and SwiGLU FFN."""
    d, g = b.d, b.g
    inp = b.norm(b.inp_embd(), weight=False)
    skip_src = inp
    for il in b.each_layer():
        cur = b.norm(inp, weight=False)
        q, k, v = build_qkv(b, il, cur)
        q, k = b.norm(b.rope(q)), b.norm(b.rope(k), weight=False)
        cur = b.attn_kv(il, q, k, v)
        cur, inp, skip = b.last_rows(il, cur, inp, skip_src)
        ffn_inp = g.op("add", cur, inp)
        cur = g.op("add", b.ffn(b.norm(ffn_inp, weight=False), d.n_ff[il]), ffn_inp)
        inp = g.op("add", cur, g.op("mul", skip, g.weight(d.n_embd)))
    b.output_head(inp, logit_scale=True)


FAMILY = Family(graph_talkie, laid_out=("talkie",))
