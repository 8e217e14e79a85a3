"""OpenELM: per-layer head counts, a fused QKV projection with Q/K norms
(src/models/openelm.cpp)."""

from __future__ import annotations

from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.models.family import Family


def graph_openelm(b: Builder) -> None:
    """src/models/openelm.cpp: RMS pre-norm, the fused QKV matmul split by views into Q, K
    and V (V stays a strided view into the cache store), RMS norms on Q and K, RoPE, build_attn
    with wo (times wo_s where the GGUF has one); the last layer takes its rows after the
    attention, residual first (the residual add's first source), then the SwiGLU FFN."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        q, k, v = build_qkv(b, il, b.norm(inp))
        cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
        if d.has(pre + "attn_output.scale"):  # build_lora_mm's per-tensor scale
            cur = g.op("mul", cur, g.weight(1))
        residual, cur = b.last_rows(il, residual, cur)
        ffn_inp = g.op("add", residual, cur)
        cur = b.ffn(b.norm(ffn_inp), d.n_ff[il])
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


FAMILY = Family(graph_openelm, laid_out=("openelm",))
