"""The dense and MoE transformer (src/models/llama.cpp, qwen2.cpp, qwen3.cpp,
qwen3moe.cpp), also the generic layout of architectures without a module of their own."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder, pre_norm
from qmgui.core.graph.dims import Dims
from qmgui.core.graph.ffn import Moe, ffn_no_gate, moe_ffn
from qmgui.core.graph.pooling import build_pooling
from qmgui.core.models.family import Family

# src/models/*.cpp without ggml_rope_ext: ALiBi (bloom, jais, mpt, refact) or learned
# positions (gpt2, starcoder); Q and K go to the cache as views of the projections
_NO_ROPE = frozenset({"bloom", "gpt2", "jais", "mpt", "refact", "starcoder"})


# The output gate measured against b11434's dumps (spark2-5.cpp, afmoe.cpp). muse-glimmer
# has one too but predicts best without it (its layout differs elsewhere: an embedding
# norm, layers without RoPE), so other architectures are laid out without the gate.
_GATED_ATTN = frozenset({"spark2_5", "afmoe"})


def graph_llama(b: Builder) -> None:
    """src/models/llama.cpp, qwen2.cpp, qwen3.cpp, qwen3moe.cpp: pre-norm attention with
    RoPE, residual, pre-norm FFN (dense SwiGLU or softmax-routed experts), residual.

    Also the layout for architectures without a builder of their own, so optional tensors
    switch optional ops: biased layer norms, a fused QKV projection, an FFN without gate,
    learned positions, an embedding norm, absent pre-norms and present post-norms (olmo2.cpp,
    exaone4.cpp), an attention output gate, shared experts."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    if d.has("position_embd.weight"):  # gpt2.cpp, starcoder.cpp: learned positions
        pos = g.get_rows(g.weight(d.n_embd, d.n_ctx_train), b.inp_pos())
        inp = g.op("add", inp, pos)
    if d.has("token_embd_norm.weight"):  # bloom.cpp: a layer norm on the embeddings
        inp = b.norm(inp, kind="norm", bias=d.has("token_embd_norm.bias"))
    # llama4.cpp: sigmoid routing, weights before the experts
    llama4 = Moe(gating="sigmoid", norm_w=False, weight_before=True)
    moe = llama4 if d.arch == "llama4" else Moe()
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        # post-norms and no attention norm tensor: post-norms only (olmo2.cpp, exaone4.cpp;
        # olmo.cpp has no norm tensors but weightless pre-norms); with an attention norm, a
        # post-attention norm is the FFN's pre-norm (openai-moe.cpp names it so)
        post = not d.has(pre + "attn_norm.weight") and (
            d.has(pre + "post_attention_norm.weight") or d.has(pre + "post_ffw_norm.weight")
        )
        cur = inp if post else pre_norm(b, inp, pre + "attn_norm")
        cur = _llama_attn(b, il, cur)
        # a post-attention norm beside an FFN norm is a post-norm too (muse-glimmer.cpp)
        if d.has(pre + "post_attention_norm.weight") and (post or d.has(pre + "ffn_norm.weight")):
            cur = b.norm(cur)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = ffn_inp if post else pre_norm(b, ffn_inp, pre + "ffn_norm")
        cur = _llama_ffn(b, il, cur, moe)
        if d.has(pre + "post_ffw_norm.weight"):
            cur = b.norm(cur)
        inp = g.op("add", cur, ffn_inp)
    kind = "norm" if d.has("output_norm.bias") else "rms_norm"
    b.output_head(inp, kind=kind)
    assert b.t_embd is not None
    build_pooling(b, b.t_embd)


def _llama_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """The generic layout's attention: Q/K/V, RoPE unless the family has none, the cache,
    the optional per-head sigmoid output gate, wo."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    q, k, v = build_qkv(b, il, x)
    if ropes(d, il):
        q, k = b.rope(q), b.rope(k)
    wo_bias = d.has(pre + "attn_output.bias")
    gate_shape = d.shape(pre + "attn_gate.weight")
    if d.arch not in _GATED_ATTN or gate_shape is None or len(gate_shape) < 2:
        return b.attn_kv(il, q, k, v, wo_bias=wo_bias)
    # a sigmoid output gate computed from the attention's input (spark2-5.cpp, afmoe.cpp),
    # which so lives across the attention
    cur = b.attn_kv(il, q, k, v, wo=False)
    cur = g.op("mul", cur, g.op("unary", b.linear(x, gate_shape[1])))
    return b.linear(cur, d.n_embd, bias=wo_bias)


def _llama_ffn(b: Builder, il: int, x: Tensor, moe: Moe) -> Tensor:
    """The generic layout's FFN: experts (plus a shared expert, or Grok's dense FFN beside
    them), a gated FFN as wide as its up projection, or an ungated one."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    up = d.shape(pre + "ffn_up.weight")
    if d.arch == "refact":  # refact.cpp: build_ffn whatever expert tensors the file has
        if up is None:  # no weights at all: build_ffn leaves the activation alone
            return g.op("unary", x)
    elif d.has(pre + "ffn_gate_inp.weight"):
        cur = moe_ffn(b, x, il, moe)
        shexp = d.shape(pre + "ffn_up_shexp.weight")
        if shexp is not None:  # a shared expert beside the routed ones
            return g.op("add", cur, b.ffn(x, shexp[1]))
        if d.arch == "grok" and up is not None:
            # grok.cpp: a dense GELU FFN beside the experts, the sum scaled
            return g.op("scale", g.op("add", b.ffn(x, d.n_ff[il], act="geglu"), cur))
        return cur
    if d.has(pre + "ffn_gate.weight") or up is None:
        # the up projection's width where the file has one: qwen.cpp's is n_ff / 2
        return b.ffn(x, up[1] if up is not None and len(up) > 1 else d.n_ff[il])
    return ffn_no_gate(b, il, x)


def ropes(d: Dims, il: int) -> bool:
    """Whether layer `il` ropes Q and K. Cohere 2, Maple and muse-glimmer rope their
    sliding-window layers only; Cohere 2 MoE also its leading dense layers (cohere2moe.cpp
    force_rope); SmallThinker with sliding windows skips every 4th layer from 0
    (smallthinker.cpp n_no_rope_layer_step); baichuan.cpp ropes only the 7B (32 layers)."""
    if d.arch in _NO_ROPE or (d.arch == "baichuan" and d.n_layer != 32):
        return False
    if d.arch in ("cohere2", "maple", "muse-glimmer"):
        return d.is_swa(il)
    if d.arch == "cohere2moe":
        return d.is_swa(il) or il < d.leading_dense
    if d.arch == "smallthinker" and d.iswa:
        return il % 4 != 0
    return True


FAMILY = Family(graph_llama, verified=("llama", "qwen2", "qwen3", "qwen3moe"))
