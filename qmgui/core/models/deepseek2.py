"""DeepSeek V2/V3 with multi-head latent attention (src/models/deepseek2.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor, row_size
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dsa import mla_attn, mla_q
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.models.family import Family


def _deepseek_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/deepseek2.cpp, MLA with absorption: Q's no-RoPE part is absorbed into the
    compressed KV space (wk_b), K is the normed compressed KV plus the roped key, V a view
    of the K cache, and wv_b decompresses the attention output (build_attn, K-only cache)."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope = d.mla_kv_lora, d.mla_rope
    nope = d.mla_head_k - rope
    q = mla_q(b, il, x, d.n_head[il] * d.mla_head_k)  # viewed as [mla_head_k, n_head, n_tokens]
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],))
    k_pe = b.rope(g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1])))
    kv_cmpr = b.norm(kv_cmpr)
    head_row = row_size("f32", d.mla_head_k)
    q_nope = g.permute(g.view(q, (nope, hq, n_tok), (head_row, head_row * hq)), 0, 2, 1, 3)
    q_pe = b.rope(g.view(q, (rope, hq, n_tok), (head_row, head_row * hq)))
    absorbed = g.permute(g.mul_mat(g.weight(nope, lora, hq), q_nope), 0, 2, 1, 3)
    q_cur = g.concat(absorbed, q_pe, 0)
    v_cur = g.reshape(kv_cmpr, lora, 1, n_tok)
    k_cur = g.concat(v_cur, k_pe, 0)
    cur = mla_attn(b, il, (q_cur, k_cur, v_cur), b.kv_inputs(False))
    return b.linear(cur, d.n_embd)


def _deepseek_attn_mha(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/deepseek2.cpp without MLA keys (GGUFs converted before llama.cpp split
    wkv_b): K and V are decompressed per head and cached as plain multi-head attention."""
    d, g = b.d, b.g
    n_tok = x.ne[1]
    hq = d.n_head[il]
    lora, rope, head_k, head_v = d.mla_kv_lora, d.mla_rope, d.head_k, d.head_v
    nope = head_k - rope
    q = g.reshape(mla_q(b, il, x, hq * head_k), head_k, hq, n_tok)
    kv_pe = b.linear(x, lora + rope)
    kv_cmpr = b.norm(g.view(kv_pe, (lora, n_tok), (kv_pe.nb[1],)))
    k_pe = b.rope(g.view(kv_pe, (rope, 1, n_tok), (kv_pe.nb[1], kv_pe.nb[1])))
    kv = b.linear(kv_cmpr, hq * (nope + head_v))
    row = row_size("f32", nope + head_v)
    k_nope = g.view(kv, (nope, hq, n_tok), (row, row * hq))
    v = g.cont(g.view(kv, (head_v, hq, n_tok), (row, row * hq)))
    k = g.concat(k_nope, g.op("repeat", k_pe, ne=(rope, hq, n_tok)), 0)
    return b.attn_kv(il, b.rope(q), k, v)


def graph_deepseek2(b: Builder) -> None:
    """src/models/deepseek2.cpp: MLA attention, leading dense FFN layers, then sigmoid-routed
    experts (V3: selection bias, normalized and scaled weights) plus shared experts."""
    d, g = b.d, b.g
    v3 = any(n.endswith("exp_probs_b.bias") for n in d.names)
    moe = Moe(gating="sigmoid" if v3 else "softmax", norm_w=v3, scale=v3, probs_bias=v3)
    inp = b.inp_embd()
    for il in b.each_layer():
        residual = inp
        attn = _deepseek_attn if d.mla_head_k else _deepseek_attn_mha
        cur = attn(b, il, b.norm(inp))
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, residual)
        cur = b.norm(ffn_inp)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = b.ffn(cur, d.n_ff[il])
        else:
            shexp = d.shape(f"blk.{il}.ffn_up_shexp.weight")
            moe_out = moe_ffn(b, cur, il, moe)
            if shexp is not None:
                moe_out = g.op("add", moe_out, b.ffn(cur, shexp[1]))
            cur = moe_out
        inp = g.op("add", cur, ffn_inp)
    b.output_head(inp)


# mistral4: src/models/mistral4.cpp builds llama_model_deepseek2's graph
FAMILY = Family(graph_deepseek2, verified=("deepseek2",), laid_out=("mistral4",))
