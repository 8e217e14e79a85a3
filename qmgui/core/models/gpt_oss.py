"""gpt-oss (src/models/openai-moe.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def graph_gpt_oss(b: Builder) -> None:
    """src/models/openai-moe.cpp: biased Q/K/V, attention sinks, alternating sliding-window
    layers, soft-max-weighted experts with biases and the clamped SwiGLU; output rows are
    selected after the last layer, whose hidden state is kept as an output."""
    g = b.g
    inp = b.inp_embd()
    moe = Moe(gating="softmax_weight", norm_w=False, biases=True, act="swiglu_oai")
    for il in b.each_layer():
        cur = b.norm(inp)
        q, k, v = build_qkv(b, il, cur)
        cur = b.attn_kv(il, b.rope(q), b.rope(k), v, sinks=True, wo_bias=True)
        ffn_inp = g.op("add", cur, inp)
        cur = moe_ffn(b, b.norm(ffn_inp), il, moe)
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp, keep_hidden=True)


FAMILY = Family(graph_gpt_oss, verified=("gpt-oss",))
