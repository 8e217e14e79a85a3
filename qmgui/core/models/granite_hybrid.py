"""Granite 4 hybrid: Mamba-2 and attention layers (src/models/granite-hybrid.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.ssm import mamba2_layer
from qmgui.core.models.family import Family


def graph_granite_hybrid(b: Builder) -> None:
    """src/models/granite-hybrid.cpp: Mamba-2 layers and attention layers (no RoPE), with
    Granite's embedding, residual and logit scales (in place), SwiGLU or expert FFN. The
    attention layers rope Q and K where rope.scaling.finetuned is true (or absent: Granite's
    switch for RoPE, false in Granite 4.0's GGUFs); the position input that brings is what
    the layout needs (the rope itself runs in place)."""
    d, g = b.d, b.g
    inp = b.inp_embd(scale=True)
    for il in b.each_layer():
        residual = inp
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = mamba2_layer(b, il, cur)
        else:
            q, k, v = build_qkv(b, il, cur)
            if d.rope_finetuned:  # hparams.rope_finetuned (has_rope): RoPE on Q and K
                q, k = b.rope(q), b.rope(k)
            cur = b.attn_kv(il, q, k, v, wo_bias=d.has(f"blk.{il}.attn_output.bias"))
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", g.op("scale", cur), residual)
        cur = b.norm(ffn_inp)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            moe_out = moe_ffn(b, cur, il, Moe())
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                moe_out = g.op("add", moe_out, b.ffn(cur, shexp[1]))
            cur = moe_out
        else:
            cur = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", g.op("scale", cur), ffn_inp)
    b.output_head(inp, logit_scale=True)


FAMILY = Family(graph_granite_hybrid, verified=("granitehybrid",))
