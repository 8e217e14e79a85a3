"""BERT encoders (src/models/bert.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import attn_no_cache, build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.pooling import build_pooling
from qmgui.core.models.family import Family


def graph_bert(b: Builder) -> None:
    """src/models/bert.cpp: token + type + position embeddings, layer norms after attention
    and FFN (post-norm), GELU FFN with biases, non-causal attention; then pooling
    (build_pooling)."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    if d.has("token_types.weight"):
        inp = g.op("add", inp, g.view(g.weight(d.n_embd, 2), (d.n_embd,)))
    if d.has("position_embd.weight"):
        inp = g.op("add", g.get_rows(g.weight(d.n_embd, d.n_ctx_train), b.inp_pos()), inp)
    inp = b.norm(inp, kind="norm", bias=True)
    for il in b.each_layer():
        q, k, v = build_qkv(b, il, inp)
        cur = attn_no_cache(b, il, q, k, v)
        cur, inp = b.last_rows(il, cur, inp)
        ffn_inp = b.norm(g.op("add", cur, inp), kind="norm", bias=True)
        up = b.linear(ffn_inp, d.n_ff[il], bias=True)
        cur = b.linear(g.op("unary", up), d.n_embd, bias=True)
        inp = b.norm(g.op("add", cur, ffn_inp), kind="norm", bias=True)
    build_pooling(b, inp)


FAMILY = Family(graph_bert, verified=("bert",))
