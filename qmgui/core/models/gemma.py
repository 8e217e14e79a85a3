"""Gemma 2 and Gemma 3 (src/models/gemma2.cpp, gemma3.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.models.family import Family


def graph_gemma(b: Builder) -> None:
    """src/models/gemma3.cpp and gemma2.cpp: scaled embeddings, Q/K norms (Gemma 3), Q
    scaled before attention, post-attention and post-FFN norms, GELU-gated FFN;
    sliding-window layers on their own cache. Gemma 2 soft-caps the attention scores and the
    logits with scale/tanh/scale (in place)."""
    d, g = b.d, b.g
    softcap = d.arch == "gemma2"
    # Gemma 2 scales the embeddings in the model; Gemma 3 in build_inp_embd (tok_scale)
    inp = g.op("scale", b.inp_embd()) if softcap else b.inp_embd(tok_scale=True)
    for il in b.each_layer():
        cur = b.norm(inp)
        q, k, v = build_qkv(b, il, cur)
        q = g.op("scale", b.rope(q))
        cur = b.attn_kv(il, q, b.rope(k), v, softcap=softcap)
        cur, inp = b.last_rows(il, cur, inp)
        sa_out = g.op("add", b.norm(cur), inp)
        cur = b.ffn(b.norm(sa_out), d.n_ff[il], act="geglu")
        inp = g.op("add", b.norm(cur), sa_out)
    b.output_head(inp, softcap=softcap)


FAMILY = Family(graph_gemma, verified=("gemma2", "gemma3"))
