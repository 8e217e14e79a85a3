"""Kimi Linear: Kimi Delta Attention layers, RoPE-less MLA layers, sigmoid-routed experts
(src/models/kimi-linear.cpp)."""

from __future__ import annotations

from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.kda import kda_layer, mla_nope_attn
from qmgui.core.models.family import Family


def graph_kimi_linear(b: Builder) -> None:
    """src/models/kimi-linear.cpp: per layer an RMS norm, then a KDA layer (recurrent:
    n_head_kv 0) or an absorbed MLA layer over the K-only cache; the last layer keeps the
    output rows; leading dense FFN layers, then sigmoid-routed experts with a selection
    bias and normalized weights, plus the shared expert."""
    d, g = b.d, b.g
    # expert_gating_func 1 is softmax (Kimi Linear ships 2, sigmoid); a weight scale other
    # than 0 or 1 scales the routing weights
    gating = "softmax" if getattr(d, "expert_gating", 0) == 1 else "sigmoid"
    scale = getattr(d, "expert_weights_scale", 0.0) not in (0.0, 1.0)
    moe = Moe(gating=gating, norm_w=True, scale=scale, probs_bias=True)
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = g.expand(b.norm(inp))
        cur = kda_layer(b, il, cur) if b.is_recurrent(il) else mla_nope_attn(b, il, cur)
        cur, residual = b.last_rows(il, cur, inp)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = b.ffn(cur, d.n_ff[il])
        else:
            out = moe_ffn(b, cur, il, moe)
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            if shexp is not None:
                out = g.op("add", out, b.ffn(cur, shexp[1]))
            cur = out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


FAMILY = Family(graph_kimi_linear, laid_out=("kimi-linear",))
