"""Kimi K3: Kimi Linear's KDA and RoPE-less MLA layers with cross-layer residual attention,
the situ activation and latent experts (src/models/kimi-k3.cpp)."""

from __future__ import annotations

from collections.abc import Iterator

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import sum_experts
from qmgui.core.graph.kda import kda_layer, mla_nope_attn
from qmgui.core.models.family import Family


def _situ(b: Builder, gate: Tensor, up: Tensor) -> Tensor:
    """kimi_k3_situ: beta*tanh(gate/beta) * sigmoid(gate) * lb*tanh(up/lb); the first scale
    is a new tensor (gate has two readers), the rest run in place."""
    g = b.g
    act = g.op("scale", g.op("unary", g.op("scale", gate)))
    act = g.op("mul", act, g.op("unary", gate))
    up = g.op("scale", g.op("unary", g.op("scale", up)))
    return g.op("mul", act, up)


def _situ_ffn(b: Builder, x: Tensor, n_ff: int) -> Tensor:
    """The dense (and shared-expert) FFN: gate and up matmuls, situ, down."""
    gate = b.linear(x, n_ff)
    up = b.linear(x, n_ff)
    return b.linear(_situ(b, gate, up), x.ne[0])


def _latent_moe(b: Builder, il: int, x: Tensor) -> Tensor:
    """build_latent_moe: the router scores the full-width input (sigmoid, selection bias,
    optionally normalized weights); the experts (situ) run on the down-projected input; the
    experts' sum is RMS-normed and projected back up; the shared experts read the full
    input."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_tok = x.ne[1]
    n_used, n_exp = d.n_expert_used, d.n_expert
    down_w = d.shape(pre + "ffn_routed_down.weight")
    routed_in = b.linear(x, down_w[1]) if down_w else x
    n_lat = routed_in.ne[0]
    up_shape = d.shape(pre + "ffn_up_exps.weight") or (n_lat, d.n_ff[il], n_exp)
    n_ff_exp = up_shape[1]
    probs = g.op("unary", b.linear(x, n_exp))
    sel = g.op("add", probs, g.weight(n_exp)) if d.has(pre + "exp_probs_b.bias") else probs
    order = g.op("argsort", sel, type_="i32")
    topk = g.view(order, (n_used, n_tok), (order.nb[1],))
    weights = g.get_rows(g.reshape(probs, 1, n_exp, n_tok), topk)
    if getattr(d, "expert_weights_norm", False):
        w2 = g.reshape(weights, n_used, n_tok)
        total = g.op("clamp", g.op("sum_rows", w2, ne=(1, n_tok)))
        weights = g.reshape(g.op("div", w2, total), 1, n_used, n_tok)
    if getattr(d, "expert_weights_scale", 0.0) not in (0.0, 1.0):
        weights = g.op("scale", weights)
    g.expand(weights)
    cur = g.reshape(routed_in, n_lat, 1, n_tok)
    up = g.mul_mat_id(g.expert_weight(n_lat, n_ff_exp, n_exp), cur, topk)
    gate = g.mul_mat_id(g.expert_weight(n_lat, n_ff_exp, n_exp), cur, topk)
    act = _situ(b, gate, up)
    experts = g.mul_mat_id(g.expert_weight(n_ff_exp, n_lat, n_exp), act, topk)
    experts = g.op("mul", experts, weights)
    out = sum_experts(b, experts)
    if d.has(pre + "ffn_routed_norm.weight"):
        out = b.norm(out)
    if d.has(pre + "ffn_routed_up.weight"):
        out = b.linear(out, d.n_embd)
    shexp = d.shape(pre + "ffn_up_shexp.weight")
    if shexp is not None:
        out = g.op("add", out, _situ_ffn(b, x, shexp[1]))
    return out


class _Residuals:
    """res_push / res_mix: the banked layer inputs ([n_embd, n_ckpt, n_tokens], one concat
    per bank) and the softmax-weighted mix of them with the current stream."""

    def __init__(self, b: Builder) -> None:
        self.b = b
        self.stack: Tensor | None = None

    def push(self, x: Tensor) -> None:
        g = self.b.g
        ckpt = g.reshape(x, x.ne[0], 1, x.ne[1])
        self.stack = ckpt if self.stack is None else g.concat(self.stack, ckpt, 1)

    def mix(self, cur: Tensor) -> Tensor:
        g = self.b.g
        src = self.stack
        if src is None:
            return cur
        n_ckpt, n_tok = src.ne[1], src.ne[2]
        sc_src = g.op("mul", g.op("rms_norm", src), g.weight(src.ne[0]))
        sc_src = g.reshape(g.op("sum_rows", sc_src, ne=(1, n_ckpt, n_tok)), n_ckpt, n_tok)
        sc_cur = g.op("mul", g.op("rms_norm", cur), g.weight(cur.ne[0]))
        sc_cur = g.op("sum_rows", sc_cur, ne=(1, n_tok))
        probs = g.op("soft_max", g.concat(sc_src, sc_cur, 0))
        p_src = g.cont(g.view(probs, (n_ckpt, n_tok), (probs.nb[1],)))
        p_cur = g.cont(g.view(probs, (1, n_tok), (probs.nb[1],)))
        out = g.op("dsv4_hc_pre", src, p_src, ne=(src.ne[0], n_tok))
        return g.op("add", out, g.op("mul", cur, p_cur))


def _all_layers(b: Builder) -> Iterator[int]:
    """Every layer: the residual bank grows every block, so no shorter replay stands for
    the stack (Builder.each_layer's shortcut assumes layers repeat)."""
    for il in range(b.d.n_layer):
        b.g.layer = il
        yield il
    b.g.layer = b.d.n_layer


def graph_kimi_k3(b: Builder) -> None:
    """src/models/kimi-k3.cpp: per layer the residual stream is mixed with the banked layer
    inputs (res_mix; the layer input is banked every attn_res.block_size layers, and a
    banking layer restarts the stream from its attention output), RMS norm, a KDA layer
    (full-rank output gate) or a gated MLA layer, the mix again, RMS norm, then a situ FFN
    (leading dense layers) or the latent MoE; a final mix, the output rows, the head."""
    d, g = b.d, b.g
    bs = d.attn_res_block_size
    res = _Residuals(b)
    inp = b.inp_embd()
    layers = _all_layers(b) if bs else b.each_layer()
    for il in layers:
        prefix = inp
        cur = res.mix(prefix) if bs else prefix
        banked = bool(bs) and il % bs == 0
        if banked:
            res.push(prefix)
        cur = g.expand(b.norm(cur))
        if b.is_recurrent(il):
            cur = kda_layer(b, il, cur, full_gate=True)
        else:
            cur = mla_nope_attn(b, il, cur, gate=True)
        prefix = cur if banked else g.op("add", prefix, cur)
        cur = b.norm(res.mix(prefix) if bs else prefix)
        if il < d.leading_dense or not d.has(f"blk.{il}.ffn_gate_inp.weight"):
            cur = _situ_ffn(b, cur, d.n_ff[il])
        else:
            cur = _latent_moe(b, il, cur)
        inp = g.op("add", prefix, cur)
    cur = res.mix(inp) if bs else inp
    cur = g.get_rows(cur, b.out_ids())
    b.output_head(cur)


FAMILY = Family(graph_kimi_k3, laid_out=("kimi-k3",))
