"""Nemotron-H: Mamba-2, attention and MLP layers (src/models/nemotron-h.cpp); Nemotron-H MoE
(src/models/nemotron-h-moe.cpp builds the same graph) with expert layers in place of MLPs."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.ssm import mamba2_layer
from qmgui.core.models.family import Family


def graph_nemotron_h(b: Builder) -> None:
    """src/models/nemotron-h.cpp: each layer is one of Mamba-2, attention (no RoPE) or a
    squared-ReLU MLP (expert layers where the GGUF has a router: _moe_layer), with a
    residual add; the final norm is kept as an output and the output rows are selected
    after it."""
    d, g = b.d, b.g
    inp = g.expand(b.inp_embd())
    for il in b.each_layer():
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = mamba2_layer(b, il, cur)
        elif d.n_ff[il] == 0:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, q, k, v, wo_bias=d.has(f"blk.{il}.attn_output.bias"))
        elif d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = _moe_layer(b, il, cur)
        else:
            up = b.linear(cur, d.n_ff[il], bias=d.has(f"blk.{il}.ffn_up.bias"))
            act = g.op("sqr", g.op("unary", up))
            cur = b.linear(act, d.n_embd, bias=d.has(f"blk.{il}.ffn_down.bias"))
        inp = g.op("add", cur, inp)
    b.output_head(inp, norm_is_output=True)


def _moe_layer(b: Builder, il: int, cur: Tensor) -> Tensor:
    """nemotron-h.cpp build_ffn_layer's expert branch: the experts (no gate, squared ReLU,
    per-expert scales where the GGUF has them) read the input, or its latent projection
    (ffn_latent_down, projected back up after), routed by sigmoid of the input's own logits
    with the exp_probs_b selection bias and the header's expert_weights_norm/_scale; plus
    the shared squared-ReLU expert on the input."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    latent = d.shape(pre + "ffn_latent_down.weight")
    x = b.linear(cur, latent[1]) if latent is not None else cur
    logits = b.linear(cur, d.n_expert)
    moe = Moe(
        gating="sigmoid",
        probs_bias=d.has(pre + "exp_probs_b.bias"),
        norm_w=d.expert_weights_norm,
        scale=d.expert_weights_scale not in (0.0, 1.0),
        act="relu_sqr",
        gated=False,
        scaled=d.has(pre + "ffn_up_exps.scale"),
    )
    moe_out = moe_ffn(b, x, il, moe, logits=logits)
    if d.has(pre + "ffn_latent_up.weight"):
        moe_out = b.linear(moe_out, d.n_embd)
    shexp = d.shape(pre + "ffn_up_shexp.weight")
    n_shexp = shexp[1] if shexp is not None else d.n_ff[il]
    up = b.linear(cur, n_shexp)
    shared = b.linear(g.op("sqr", g.op("unary", up)), d.n_embd)
    return g.op("add", moe_out, shared)


FAMILY = Family(graph_nemotron_h, verified=("nemotron_h",), laid_out=("nemotron_h_moe",))
