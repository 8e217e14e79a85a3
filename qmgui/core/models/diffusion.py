"""Diffusion language models (src/models/dream.cpp, llada.cpp, llada-moe.cpp, rnd1.cpp):
decoder-shaped transformers that attend over the whole ubatch without a KV cache."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.attention import attn_no_cache, build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family

# build_moe_ffn's norm_w argument: rnd1.cpp normalizes the top-k weights, llada-moe.cpp not
_NORM_W = frozenset({"rnd1"})

# the attention output bias the graph adds where the GGUF has one: llada.cpp and
# llada-moe.cpp pass none to build_attn (llada.cpp loads an optional one and leaves it out)
_WO_BIAS = frozenset({"dream", "rnd1"})


def graph_diffusion(b: Builder) -> None:
    """src/models/dream.cpp, llada.cpp, llada-moe.cpp, rnd1.cpp (the same in b10435 and
    b11434): RMS pre-norm attention over the ubatch itself (build_attn_inp_no_cache: an
    n_tokens x n_tokens mask, no cache) with RoPE and, in the MoE two, Q/K RMS norms
    before it; residual; RMS pre-norm FFN, dense SwiGLU (dream, llada) or softmax-routed
    experts (llada-moe, rnd1); residual; the output norm and the LM head, without the
    output bias dream.cpp loads.

    Outputs: these are LLMs to llama-server (no --embedding, compute.is_embedding), so
    the context keeps one output row per slot (server_output_limits)."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    b.inp_pos()
    # both pass the header's expert_weights_scale: a scale op unless it is 0 or 1
    moe = Moe(norm_w=d.arch in _NORM_W, scale=d.expert_weights_scale not in (0.0, 1.0))
    for il in b.each_layer():
        residual = inp
        cur = b.norm(inp)
        q, k, v = build_qkv(b, il, cur)  # llada-moe.cpp and rnd1.cpp: Q/K norms here
        q, k = b.rope(q), b.rope(k)
        wo_bias = d.arch in _WO_BIAS and d.has(f"blk.{il}.attn_output.bias")
        cur = attn_no_cache(b, il, q, k, v, wo_bias=wo_bias)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = moe_ffn(b, cur, il, moe)
        else:
            cur = b.ffn(cur, d.n_ff[il])
        inp = g.op("add", cur, ffn_inp)
    _head(b, inp)


def _head(b: Builder, x: Tensor) -> None:
    """result_norm (t_embd) and result_output: both graph outputs; no output bias."""
    g = b.g
    cur = b.norm(x)
    cur.is_output = True
    b.t_embd = cur
    logits = g.mul_mat(g.weight(b.d.n_embd, b.d.n_vocab), cur)
    logits.is_output = True
    g.expand(logits)


FAMILY = Family(graph_diffusion, laid_out=("dream", "llada", "llada-moe", "rnd1"))
