"""Snowflake Arctic: a dense SwiGLU FFN on the attention's residual plus routed experts on
the layer input, both added into the layer output (src/models/arctic.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def _mm(b: Builder, x: Tensor, n_out: int, name: str, *, bias: bool = False) -> Tensor:
    """build_lora_mm with the weight's optional per-tensor scale (`<name>.scale`, multiplied
    in after the matmul), then the optional bias (build_qkv's order)."""
    g = b.g
    cur = b.linear(x, n_out)
    if b.d.has(name + ".scale"):
        cur = g.op("mul", cur, g.weight(1))
    if bias:
        cur = g.op("add", cur, g.weight(n_out))
    return cur


def _qkv(b: Builder, il: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """build_qkv for separate Q/K/V projections, each with its optional scale and bias,
    reshaped to heads."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    pre = f"blk.{il}."
    out = []
    for name, width, heads in (
        ("attn_q", d.head_k, d.n_head[il]),
        ("attn_k", d.head_k, d.n_head_kv[il]),
        ("attn_v", d.head_v, d.n_head_kv[il]),
    ):
        cur = _mm(b, x, width * heads, pre + name, bias=d.has(pre + name + ".bias"))
        out.append(g.reshape(cur, width, heads, n_tok))
    q, k, v = out
    return q, k, v


def graph_arctic(b: Builder) -> None:
    """src/models/arctic.cpp: pre-norm attention (Q/K/V and wo with their per-tensor
    scales, RoPE), residual; a dense SwiGLU FFN on its own RMS norm of that residual
    (build_ffn without scales), added back; then softmax-routed experts (weights
    normalised) on a second RMS norm (ffn_norm_exps) of the layer's INPUT, added to the
    dense branch's output.

    Node order follows the engine's: build_moe_ffn expands its routing weights and experts
    while the attention's tail (V rotation, wo) and the dense FFN are still unexpanded, so
    the MoE branch runs between flash attention and wo, and the dense branch is pulled in
    by the next layer's expands (or the output head)."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    # softmax gating, normalised weights, scaled when expert_weights_scale is neither 0 nor 1
    moe = Moe(scale=d.expert_weights_scale not in (0.0, 1.0))
    for il in b.each_layer():
        pre = f"blk.{il}."
        inp_sa = inp
        cur = b.norm(inp)
        q, k, v = _qkv(b, il, cur)
        q, k = b.rope(q), b.rope(k)
        cur = b.attn_kv(il, q, k, v, wo=False)
        cur = _mm(b, cur, d.n_embd, pre + "attn_output")
        cur, inp_sa = b.last_rows(il, cur, inp_sa)
        ffn_inp = g.op("add", cur, inp_sa)
        cur = b.ffn(b.norm(ffn_inp), d.n_embd)
        ffn_out = g.op("add", cur, ffn_inp)
        cur = moe_ffn(b, b.norm(inp_sa), il, moe)
        inp = g.op("add", cur, ffn_out)
    b.output_head(inp)


FAMILY = Family(graph_arctic, laid_out=("arctic",))
