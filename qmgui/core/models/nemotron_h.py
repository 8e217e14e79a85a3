"""Nemotron-H: Mamba-2, attention and MLP layers (src/models/nemotron-h.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ssm import mamba2_layer
from qmgui.core.models.family import Family


def graph_nemotron_h(b: Builder) -> None:
    """src/models/nemotron-h.cpp: each layer is one of Mamba-2, attention (no RoPE) or a
    squared-ReLU MLP, with a residual add; the final norm is kept as an output and the
    output rows are selected after it."""
    d, g = b.d, b.g
    inp = g.expand(b.inp_embd())
    for il in b.each_layer():
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = mamba2_layer(b, il, cur)
        elif d.n_ff[il] == 0:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, q, k, v, wo_bias=d.has(f"blk.{il}.attn_output.bias"))
        else:
            up = b.linear(cur, d.n_ff[il], bias=d.has(f"blk.{il}.ffn_up.bias"))
            act = g.op("sqr", g.op("unary", up))
            cur = b.linear(act, d.n_embd, bias=d.has(f"blk.{il}.ffn_down.bias"))
        inp = g.op("add", cur, inp)
    b.output_head(inp, norm_is_output=True)


FAMILY = Family(graph_nemotron_h, verified=("nemotron_h",))
