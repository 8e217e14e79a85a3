"""Parallel attention and FFN from one norm (src/models/phi2.cpp, command-r.cpp,
cohere2.cpp, cohere2moe.cpp, plamo.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, ffn_no_gate, moe_ffn
from qmgui.core.models.family import Family
from qmgui.core.models.llama import ropes


def graph_parallel(b: Builder) -> None:
    """src/models/phi2.cpp, command-r.cpp, cohere2.cpp: one layer norm feeds attention and
    the FFN in parallel, so the norm's output lives across the attention; the layer output
    is attention + FFN + input. Phi-2 scales Q after RoPE, has an ungated GELU FFN and a
    biased output head; Cohere 2 ropes only its sliding-window layers."""
    d, g = b.d, b.g
    # cohere2moe.cpp selects the output rows after the output norm (t_h_nextn)
    late_rows = d.arch == "cohere2moe"
    inp = b.inp_embd()
    for il in b.each_layer():
        pre = f"blk.{il}."
        normed = b.norm(inp, kind="norm", bias=d.has(pre + "attn_norm.bias"))
        q, k, v = build_qkv(b, il, normed)
        if ropes(d, il):
            q, k = b.rope(q), b.rope(k)
        if d.arch == "phi2":
            q = g.op("scale", q)
        cur = b.attn_kv(il, q, k, v, wo_bias=d.has(pre + "attn_output.bias"))
        if not late_rows:
            cur, inp, normed = b.last_rows(il, cur, inp, normed)
        if d.has(pre + "ffn_gate_inp.weight"):
            ffn = moe_ffn(b, normed, il, Moe())
            shexp = d.shape(pre + "ffn_up_shexp.weight")
            if shexp is not None:  # shared expert, averaged with the routed ones
                ffn = g.op("scale", g.op("add", ffn, b.ffn(normed, shexp[1])))
        elif d.has(pre + "ffn_gate.weight"):
            ffn = b.ffn(normed, d.n_ff[il])
        else:
            ffn = ffn_no_gate(b, il, normed)
        inp = g.op("add", g.op("add", ffn, inp), cur)
    b.output_head(inp, kind="norm", logit_scale=d.arch != "phi2", norm_is_output=late_rows)


FAMILY = Family(graph_parallel, laid_out=("phi2", "command-r", "cohere2", "cohere2moe", "plamo"))
