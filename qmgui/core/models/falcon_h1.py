"""Falcon-H1: Mamba-2 and attention side by side in every layer (src/models/falcon-h1.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ssm import mamba2_layer
from qmgui.core.models.family import Family


def graph_falcon_h1(b: Builder) -> None:
    """src/models/falcon-h1.cpp: every layer normalises its input twice (the same weight),
    once for attention (RoPE, no output bias) and once for the Mamba-2 mixer; the two
    outputs are summed and added to the residual, then a SwiGLU FFN (its biases run in
    place) with a residual add. The last layer keeps only the output rows before the FFN."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        residual = inp
        cur = b.norm(inp)
        q, k, v = build_qkv(b, il, cur)
        q, k = b.rope(q), b.rope(k)
        attn_out = b.attn_kv(il, q, k, v)
        ssm_out = mamba2_layer(b, il, b.norm(inp))
        cur = g.op("add", attn_out, ssm_out)
        residual = g.op("add", cur, residual)
        cur, residual = b.last_rows(il, cur, residual)
        cur = b.ffn(b.norm(residual), d.n_ff[il])
        inp = g.op("add", cur, residual)
    b.output_head(inp)


FAMILY = Family(graph_falcon_h1, laid_out=("falcon-h1",))
