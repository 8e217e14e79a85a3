"""Attention blocks shared by the families: the Q/K/V projections (build_qkv) and
attention without a KV cache (encoders)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def build_qkv(b: Builder, il: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_qkv (separate Q/K/V matmuls, optional biases) then the optional Q/K norms."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq, hkv = d.n_head[il], d.n_head_kv[il]
    pre = f"blk.{il}."
    if d.has(pre + "attn_qkv.weight"):  # fused projection, split by views
        n_q, n_k = d.head_k * hq, d.head_k * hkv
        qkv = b.linear(x, n_q + n_k + d.head_v * hkv, bias=d.has(pre + "attn_qkv.bias"))
        q = g.view(qkv, (d.head_k, hq, n_tok), (d.head_k * 4, qkv.nb[1]))
        k = g.view(qkv, (d.head_k, hkv, n_tok), (d.head_k * 4, qkv.nb[1]))
        v = g.view(qkv, (d.head_v, hkv, n_tok), (d.head_v * 4, qkv.nb[1]))
    else:
        q = b.linear(x, d.head_k * hq, bias=d.has(pre + "attn_q.bias"))
        k = b.linear(x, d.head_k * hkv, bias=d.has(pre + "attn_k.bias"))
        v = b.linear(x, d.head_v * hkv, bias=d.has(pre + "attn_v.bias"))
        q = g.reshape(q, d.head_k, hq, n_tok)
        k = g.reshape(k, d.head_k, hkv, n_tok)
        v = g.reshape(v, d.head_v, hkv, n_tok)
    if d.has(pre + "attn_q_norm.weight"):
        q = b.norm(q)
    if d.has(pre + "attn_k_norm.weight"):
        k = b.norm(k)
    return q, k, v


def attn_no_cache(
    b: Builder, il: int, q: Tensor, k: Tensor, v: Tensor, *, wo_bias: bool | None = None
) -> Tensor:
    """build_attn without a KV cache (encoders): attend over the ubatch itself, with a
    [n_tokens, n_tokens] mask; flash attention first casts K and V to f16. `wo_bias`: whether
    wo has a bias (None: where the GGUF has one)."""
    d, g = b.d, b.g
    n_tok = q.ne[2]
    if b.no_cache_mask is None:
        b.no_cache_mask = g.input("f16" if d.flash_attn else "f32", n_tok, n_tok)
    for t in (q, k, v):
        g.expand(t)
    cur = b.attn_mha(q, k, v, b.no_cache_mask)
    if wo_bias is None:
        wo_bias = d.has(f"blk.{il}.attn_output.bias")
    return b.linear(cur, d.n_embd, bias=wo_bias)
