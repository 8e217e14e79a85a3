"""DeepSeek-V3.2 and GLM-DSA: DeepSeek's MLA with DeepSeek sparse attention, a lightning
indexer that picks the cells each token attends to (src/models/deepseek32.cpp,
src/models/glm-dsa.cpp; build_attn for llm_graph_input_attn_k_dsa in src/llama-graph.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dims import Dims
from qmgui.core.graph.dsa import (
    LidInputs,
    indexer_dims,
    indexer_select,
    lid_inputs,
    mla_absorbed,
    mla_attn,
)
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def _rot(width: int) -> int:
    """llama_kv_cache's Hadamard block for the indexer cache, which always rotates: 64,
    doubled while it divides the key width."""
    n = 64
    while width % (2 * n) == 0:
        n *= 2
    return n


def _mm(b: Builder, x: Tensor, n_out: int, name: str) -> Tensor:
    """build_lora_mm: the matmul, times the weight's per-tensor scale where the GGUF has one."""
    cur = b.linear(x, n_out)
    if b.d.has(name + ".scale"):
        cur = b.g.op("mul", cur, b.g.weight(1))
    return cur


def _ffn(b: Builder, x: Tensor, n_ff: int, pre: str, suffix: str = "") -> Tensor:
    """build_ffn (SwiGLU) with the optional per-tensor scales of gate, up and down."""
    gate = _mm(b, x, n_ff, pre + "ffn_gate" + suffix)
    up = _mm(b, x, n_ff, pre + "ffn_up" + suffix)
    return _mm(b, b.g.op("swiglu", gate, up), x.ne[0], pre + "ffn_down" + suffix)


def _rope_head(b: Builder, x: Tensor, width: int, heads: int) -> Tensor:
    """Rope the first n_rot values of each indexer head: b11434 ropes the heads whole
    (ggml_rope_ext on the reshape); older builds (b10435; `b.mixed_batch` stands for the
    newer build) rope a view of the RoPE part and concatenate the rest back."""
    g = b.g
    n_tok = x.ne[1]
    if b.mixed_batch:
        return b.rope(g.reshape(x, width, heads, n_tok))
    rope = b.d.mla_rope
    row = row_size("f32", width)
    pe = g.view(x, (rope, heads, n_tok), (row, row * heads))
    nope = g.view(x, (width - rope, heads, n_tok), (row, row * heads))
    return g.concat(b.rope(pe), nope, 0)


def _indexer(b: Builder, il: int, x: Tensor, qr: Tensor, lid: LidInputs) -> Tensor:
    """The lightning indexer (fused on the CPU: cparams.fused_lid): per-head queries from
    the normed Q LoRA rows, one layer-normed key per token, both roped and rotated
    (Hadamard), the key stored in the indexer cache; the per-head weights pre-scaled, the
    scores over the whole cache (ggml_lightning_indexer) and the indices of the top k
    (made contiguous)."""
    d, g = b.d, b.g
    pre = f"blk.{il}.indexer."
    width, heads = indexer_dims(b, il)
    iq = _rope_head(b, b.linear(qr, width * heads), width, heads)
    ik = b.norm(b.linear(x, width), kind="norm", bias=d.has(pre + "k_norm.bias"))
    ik = _rope_head(b, ik, width, 1)
    if lid.rot is not None:
        iq = g.mul_mat(lid.rot, iq)
        ik = g.mul_mat(lid.rot, ik)
    return indexer_select(b, x, iq, ik, lid, width=width, heads=heads)


def _dsa_attn(
    b: Builder, il: int, x: Tensor, lid: LidInputs, top_k: Tensor | None
) -> tuple[Tensor, Tensor]:
    """src/models/deepseek32.cpp's attention: the Q LoRA rows (shared with the indexer),
    the lightning indexer's top-k on its full layers (GLM-DSA's shared layers reuse the
    last full layer's), MLA with absorption over a K-only cache attending to the top-k
    cells only, wo (times its scale where the GGUF has one). Returns (output, top-k)."""
    d = b.d
    q_a = d.shape(f"blk.{il}.attn_q_a.weight")
    qr = b.norm(b.linear(x, q_a[1] if q_a else x.ne[0]))
    if top_k is None or _indexer_full(d, il):
        top_k = _indexer(b, il, x, qr, lid)
    qkv = mla_absorbed(b, il, x, qr)
    cur = mla_attn(b, il, qkv, b.kv_inputs(False), top_k=top_k)
    return _mm(b, cur, d.n_embd, f"blk.{il}.attn_output"), top_k


def _indexer_full(d: Dims, il: int) -> bool:
    """is_indexer_full: GLM-DSA's "full" indexer layers carry the indexer's tensors, its
    "shared" ones (GLM 5.2) reuse the previous full layer's top-k; every DeepSeek-V3.2
    layer is full."""
    return d.arch != "glm-dsa" or d.has(f"blk.{il}.indexer.attn_q_b.weight")


def graph_deepseek32(b: Builder) -> None:
    """src/models/deepseek32.cpp, glm-dsa.cpp: MLA attention with the lightning indexer,
    leading dense FFN layers, then sigmoid-routed experts plus shared experts."""
    d, g = b.d, b.g
    v3 = any(n.endswith("exp_probs_b.bias") for n in d.names)
    moe = Moe(gating="sigmoid" if v3 else "softmax", norm_w=v3, scale=v3, probs_bias=v3)
    inp = b.inp_embd()
    b.inp_pos()
    lid = lid_inputs(b, _rot(indexer_dims(b, 0)[0]))
    top_k: Tensor | None = None
    for il in b.each_layer():
        pre = f"blk.{il}."
        residual = inp
        cur, top_k = _dsa_attn(b, il, b.norm(inp), lid, top_k)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(pre + "ffn_gate_inp.weight"):
            cur = _ffn(b, cur, d.n_ff[il], pre)
        else:
            shexp = d.shape(pre + "ffn_up_shexp.weight")
            moe_out = moe_ffn(b, cur, il, moe)
            if shexp is not None:
                moe_out = g.op("add", moe_out, _ffn(b, cur, shexp[1], pre, "_shexp"))
            cur = moe_out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


FAMILY = Family(graph_deepseek32, laid_out=("deepseek32", "glm-dsa"))
