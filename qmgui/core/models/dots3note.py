"""dots.llm3 note: absorbed MLA with a DSA lightning indexer on the full-attention layers,
a sliding-window MLA cache for the others, a head-wise sigmoid output gate, leading dense
FFN layers then sigmoid-routed experts plus shared experts (src/models/dots3note.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dsa import indexer_dims, indexer_top_k, lid_inputs, mla_absorbed, mla_attn
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def linear_scaled(b: Builder, il: int, x: Tensor, n_out: int, name: str) -> Tensor:
    """build_lora_mm with the weight's per-tensor scale (`blk.N.<name>.scale`) where the
    GGUF has one: a mul in place."""
    cur = b.linear(x, n_out)
    if b.d.has(f"blk.{il}.{name}.scale"):
        cur = b.g.op("mul", cur, b.g.weight(1))
    return cur


def ffn_scaled(b: Builder, il: int, x: Tensor, n_ff: int, suffix: str = "") -> Tensor:
    """build_ffn (SiLU, parallel gate) with the weights' scales: gate, up, SwiGLU, down."""
    gate = linear_scaled(b, il, x, n_ff, f"ffn_gate{suffix}")
    up = linear_scaled(b, il, x, n_ff, f"ffn_up{suffix}")
    return linear_scaled(b, il, b.g.op("swiglu", gate, up), x.ne[0], f"ffn_down{suffix}")


def routing(b: Builder, il: int, *, probs_bias: bool = True) -> Moe:
    """build_moe_ffn's routing as the GGUF states it (expert_gating_func, weights norm and
    scale), with the per-expert scales where the layer has them."""
    d = b.d
    gating = {2: "sigmoid", 3: "softmax_weight"}.get(d.expert_gating, "softmax")
    return Moe(
        gating=gating,
        norm_w=d.expert_weights_norm,
        scale=d.expert_weights_scale not in (0.0, 1.0),
        probs_bias=probs_bias and d.has(f"blk.{il}.exp_probs_b.bias"),
        scaled=d.has(f"blk.{il}.ffn_up_exps.scale"),
    )


def shexp_width(b: Builder, il: int) -> int:
    shape = b.d.shape(f"blk.{il}.ffn_up_shexp.weight")
    return shape[1] if shape and len(shape) > 1 else 0


def graph_dots3note(b: Builder) -> None:
    """src/models/dots3note.cpp (b11434): per layer the Q LoRA; on full-attention layers the
    lightning indexer's top k (its q and k rotated by the indexer cache's Hadamard matrix)
    and DSA attention over the main MLA cache, on sliding-window layers plain MLA attention
    over the SWA cache; the head-wise gate sigmoid(x W) times the decompressed output, wo;
    then the dense or routed + shared FFN."""
    d, g = b.d, b.g
    inp = b.inp_embd()
    width = indexer_dims(b, next((il for il in d.layers if not d.is_swa(il)), 0))[0]
    rot = 64
    while width % (2 * rot) == 0:
        rot *= 2
    lid = lid_inputs(b, rot if width % 64 == 0 else 0)
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        cur = b.norm(inp)
        n_tok = cur.ne[1]
        q_a = d.shape(pre + "attn_q_a.weight")
        qr = b.norm(b.linear(cur, q_a[1] if q_a and len(q_a) > 1 else cur.ne[0]))
        swa = d.is_swa(il)
        top = None if swa else indexer_top_k(b, il, cur, qr, lid)
        qkv = mla_absorbed(b, il, cur, qr, k_norm=True)
        attn = mla_attn(b, il, qkv, b.kv_inputs(swa), top_k=top)
        hq = d.n_head[il]
        gate = g.op("unary", b.linear(cur, hq))
        head_v = attn.ne[0] // hq
        gated = g.op("mul", g.reshape(attn, head_v, hq, n_tok), g.reshape(gate, 1, hq, n_tok))
        cur = linear_scaled(b, il, g.reshape(gated, head_v * hq, n_tok), d.n_embd, "attn_output")
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(pre + "ffn_gate_inp.weight"):
            cur = ffn_scaled(b, il, cur, d.n_ff[il])
        else:
            moe_out = moe_ffn(b, cur, il, routing(b, il))
            n_sh = shexp_width(b, il)
            if n_sh:
                moe_out = g.op("add", moe_out, ffn_scaled(b, il, cur, n_sh, "_shexp"))
            cur = moe_out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


FAMILY = Family(graph_dots3note, laid_out=("dots3note",))
