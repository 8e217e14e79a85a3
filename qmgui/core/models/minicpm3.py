"""MiniCPM3: multi-head latent attention without absorption (src/models/minicpm3.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.models.family import Family


def _minicpm3_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/minicpm3.cpp's self-attention: Q through a normed LoRA pair, the
    compressed KV (normed) decompressed by wkv_b into per-head K (no-RoPE part) and V (a
    contiguous copy); Q is roped whole (the offset keeps the no-RoPE part; before b11434 its
    RoPE part was roped alone and concatenated back, `b.mixed_batch` standing for the newer
    build), the shared roped key is repeated per head and joined to K; a plain K and V
    cache."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope, head_k, head_v = d.mla_kv_lora, d.mla_rope, d.head_k, d.head_v
    nope = head_k - rope
    q_a = d.shape(f"blk.{il}.attn_q_a.weight")
    q = b.linear(b.norm(b.linear(x, q_a[1] if q_a else x.ne[0])), hq * head_k)
    head_row = row_size("f32", head_k)
    q_nope = g.view(q, (nope, hq, n_tok), (head_row, head_row * hq))
    q_pe = g.view(q, (rope, hq, n_tok), (head_row, head_row * hq))
    q = g.reshape(q, head_k, hq, n_tok)
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],))
    k_pe = g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1]))
    kv_cmpr = b.norm(kv_cmpr)
    kv = b.linear(kv_cmpr, hq * (nope + head_v))
    row = row_size("f32", nope + head_v)
    k_nope = g.view(kv, (nope, hq, n_tok), (row, row * hq))
    v = g.cont(g.view(kv, (head_v, hq, n_tok), (row, row * hq)))
    if b.mixed_batch:
        # b11434: Q roped whole (ggml_rope_set_offset keeps its no-RoPE part)
        q = b.rope(q)
        k_pe = b.rope(k_pe)
    else:
        # older builds (b10435) rope Q's RoPE part alone and join it back to the rest
        q_pe = b.rope(q_pe)
        k_pe = b.rope(k_pe)
        q = g.concat(q_nope, q_pe, 0)
    k = g.concat(k_nope, g.op("repeat", k_pe, ne=(rope, hq, n_tok)), 0)
    return b.attn_kv(il, q, k, v)


def graph_minicpm3(b: Builder) -> None:
    """src/models/minicpm3.cpp: scaled embeddings, MLA attention decompressed to plain
    multi-head attention, residuals scaled by depth, a dense SwiGLU FFN, and the hidden
    state scaled before the LM head."""
    d, g = b.d, b.g
    inp = g.op("scale", b.inp_embd())
    for il in b.each_layer():
        residual = inp
        cur = _minicpm3_attn(b, il, b.norm(inp))
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", g.op("scale", cur), residual)
        cur = b.ffn(b.norm(ffn_inp), d.n_ff[il])
        inp = g.op("add", g.op("scale", cur), ffn_inp)
    _scaled_head(b, inp)


def _scaled_head(b: Builder, cur: Tensor) -> None:
    """result_norm (a graph output), lmhead_scaling, result_output."""
    g = b.g
    cur = b.norm(cur)
    cur.is_output = True
    b.t_embd = cur
    cur = g.op("scale", cur)
    logits = g.mul_mat(g.weight(b.d.n_embd, b.d.n_vocab), cur)
    logits.is_output = True
    g.expand(logits)


FAMILY = Family(graph_minicpm3, laid_out=("minicpm3",))
