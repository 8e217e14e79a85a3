"""Jamba: Mamba-1 and attention layers, each followed by a dense or expert FFN
(src/models/jamba.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.ssm import mamba_layer
from qmgui.core.models.family import Family


def graph_jamba(b: Builder) -> None:
    """src/models/jamba.cpp: layers without KV heads are Mamba-1 mixers (with Jamba's dt/B/C
    RMS norms), the others attention without RoPE; the last layer keeps the output rows;
    residual add (input first), RMS norm, then SwiGLU FFN or softmax-routed experts (weights
    not renormalized), residual add."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = mamba_layer(b, il, cur)
        else:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, q, k, v)
        cur, inp = b.last_rows(il, cur, inp)
        ffn_inp = g.op("add", inp, cur)
        cur = b.norm(ffn_inp)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = moe_ffn(b, cur, il, Moe(norm_w=False))
        else:
            cur = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", ffn_inp, cur)
    b.output_head(inp)


FAMILY = Family(graph_jamba, laid_out=("jamba",))
