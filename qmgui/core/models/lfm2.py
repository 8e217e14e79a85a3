"""LFM2 and LFM2-MoE: short convolutions and attention (src/models/lfm2.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.shortconv import shortconv_block
from qmgui.core.models.family import Family


def graph_lfm2(b: Builder) -> None:
    """src/models/lfm2.cpp: short-convolution layers and attention layers (Q/K norms), each
    followed by a SwiGLU FFN (experts on lfm2moe); residual adds take the residual first."""
    d, g = b.d, b.g
    cur = g.expand(b.inp_embd())
    for il in b.each_layer():
        prev = cur
        cur = b.norm(cur)
        if b.is_recurrent(il):
            cur = shortconv_block(b, il, cur)
        else:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
        cur, prev = b.last_rows(il, cur, prev)
        cur = g.op("add", prev, cur)
        ffn_in = b.norm(cur)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            bias = d.has(f"blk.{il}.exp_probs_b.bias")
            out = moe_ffn(b, ffn_in, il, Moe(gating="sigmoid", probs_bias=bias))
        else:
            out = b.ffn(ffn_in, d.n_ff[il])
        cur = g.op("add", cur, out)
    b.output_head(cur)


FAMILY = Family(graph_lfm2, verified=("lfm2",), relatives=("lfm2moe",))
