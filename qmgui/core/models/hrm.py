"""HRM text (src/models/hrm-text.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.models.family import Family


def graph_hrm(b: Builder) -> None:
    """src/models/hrm-text.cpp: the embeddings (zH) stay live under every stack; each stack
    reads zH + zL (zL starting as a learned vector), runs weightless pre-norm layers whose
    attention has a sigmoid output gate, ends in a weightless norm, and becomes the next
    zL (the last one zH). Rows are selected only for the output head. The cycle counts are
    not in ModelMeta, so every layer is laid out as a stack of its own (test-llama-archs'
    model: one layer per stack, one cycle each)."""
    d, g = b.d, b.g
    z_h = b.inp_embd()
    z_l = g.weight(d.n_embd)
    for il in b.each_layer():
        inp = g.op("add", z_h, z_l)
        cur = b.norm(inp, weight=False)
        q, k, v = build_qkv(b, il, cur)
        gate = b.linear(cur, d.n_head[il] * d.head_v)
        cur = b.attn_kv(il, b.rope(q), b.rope(k), v, wo=False)
        cur = g.op("mul", cur, g.op("unary", gate))
        ffn_inp = g.op("add", b.linear(cur, d.n_embd), inp)
        cur = g.op("add", b.ffn(b.norm(ffn_inp, weight=False), d.n_ff[il]), ffn_inp)
        z_l = b.norm(cur, weight=False)
    b.output_head(g.get_rows(z_l, b.out_ids()))


FAMILY = Family(graph_hrm, laid_out=("hrm_text",))
