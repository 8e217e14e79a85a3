"""Feed-forward blocks shared by the families: routed experts (build_moe_ffn) and the FFN
without a gate tensor."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


class Moe:
    """How one architecture routes tokens to experts (build_moe_ffn's arguments)."""

    def __init__(
        self,
        *,
        gating: str = "softmax",
        norm_w: bool = True,
        scale: bool = False,
        probs_bias: bool = False,
        biases: bool = False,
        act: str = "swiglu",
        weight_before: bool = False,
        gated: bool = True,
        limit: float = 0.0,
        scaled: bool = False,
    ) -> None:
        self.gating = gating  # softmax | sigmoid | softmax_weight
        self.norm_w = norm_w
        self.scale = scale
        self.probs_bias = probs_bias  # DeepSeek-V3 exp_probs_b selection bias
        self.biases = biases  # gpt-oss: router and expert biases
        self.act = act
        # Llama 4: the routing weights scale each token's copies before the experts
        # (weight_before_ffn: the input repeated n_expert_used times, then multiplied)
        self.weight_before = weight_before
        # experts without a gate tensor (Nemotron-H MoE): up, the activation alone ("relu_sqr":
        # relu then sqr, both in place), down
        self.gated = gated
        # the layer's swiglu_clamp_exp, unfused (build_moe_ffn's generic branch): the up rows
        # clamped, silu(gate) clamped, their product
        self.limit = limit
        # per-expert scales of the gated experts' three matmuls (build_lora_mm_id's w_s: the
        # scales repeated over the tokens, their rows picked per token, multiplied in)
        self.scaled = scaled


def moe_ffn(b: Builder, x: Tensor, il: int, m: Moe, *, logits: Tensor | None = None) -> Tensor:
    """build_moe_ffn: router, top-k, weights, expert matmuls over n_expert_used rows per
    token, weighted, then the experts' rows summed. `logits`: the router's logits computed
    by the caller (probs_in; Nemotron-H MoE routes from the layer input while the experts
    read its latent projection)."""
    g, d = b.g, b.d
    n_tok = x.ne[1]
    n_used = d.n_expert_used
    up_shape = d.shape(f"blk.{il}.ffn_up_exps.weight") or (d.n_embd, d.n_ff[il], d.n_expert)
    n_ff_exp = up_shape[1]
    weights, topk = _route(b, x, m, logits)
    cur = g.reshape(x, x.ne[0], 1, n_tok)
    if m.weight_before:  # each token's copies scaled by its weights
        cur = g.op("mul", g.op("repeat", cur, ne=(x.ne[0], n_used, n_tok)), weights)
    if not m.gated:
        return _moe_gateless(b, cur, m, weights=weights, topk=topk, n_ff_exp=n_ff_exp)
    up = g.mul_mat_id(g.expert_weight(x.ne[0], n_ff_exp, d.n_expert), cur, topk)
    gate = g.mul_mat_id(g.expert_weight(x.ne[0], n_ff_exp, d.n_expert), cur, topk)
    if m.scaled:
        up, gate = _expert_scaled(b, up, topk), _expert_scaled(b, gate, topk)
    if m.biases:
        up = g.op("add_id", up, g.expert_weight(n_ff_exp, d.n_expert), topk)
        gate = g.op("add_id", gate, g.expert_weight(n_ff_exp, d.n_expert), topk)
    if m.limit > 1e-6:
        act = g.op("mul", g.op("clamp", g.op("unary", gate)), g.op("clamp", up))
    else:
        act = g.op(m.act, gate, up)
    experts = g.mul_mat_id(g.expert_weight(n_ff_exp, x.ne[0], d.n_expert), act, topk)
    if m.scaled:
        experts = _expert_scaled(b, experts, topk)
    if m.biases:
        experts = g.op("add_id", experts, g.expert_weight(x.ne[0], d.n_expert), topk)
    experts = experts if m.weight_before else g.op("mul", experts, weights)
    return sum_experts(b, experts)


def sum_experts(b: Builder, experts: Tensor) -> Tensor:
    """build_moe_ffn's sum of the weighted expert outputs [width, n_expert_used, n_tokens]:
    one view per used expert, added in turn (a single expert's view made contiguous)."""
    g = b.g
    width, n_used, n_tok = experts.ne[0], experts.ne[1], experts.ne[2]
    g.expand(experts)
    views = [g.view(experts, (width, n_tok), (experts.nb[2],)) for _ in range(n_used)]
    for v in views:
        g.expand(v)
    out = views[0]
    for v in views[1:]:
        out = g.expand(g.op("add", out, v))
    return g.cont(out) if n_used == 1 else out


def _route(b: Builder, x: Tensor, m: Moe, logits: Tensor | None) -> tuple[Tensor, Tensor]:
    """build_moe_ffn's routing: the router's logits (unless given), gating, the top-k
    selection (argsort, a view), the selected experts' weights (normalised, scaled); the
    weights are expanded here. Returns (weights [1, n_used, n_tokens], topk)."""
    g, d = b.g, b.d
    n_tok = x.ne[1]
    n_used = d.n_expert_used
    logits = b.linear(x, d.n_expert, bias=m.biases) if logits is None else logits
    probs = logits
    if m.gating == "softmax":
        probs = g.op("soft_max", logits)
    elif m.gating == "sigmoid":
        probs = g.op("unary", logits)
    sel = g.op("add", probs, g.weight(d.n_expert)) if m.probs_bias else probs
    order = g.op("argsort", sel, type_="i32")
    topk = g.view(order, (n_used, n_tok), (order.nb[1],))
    weights = g.get_rows(g.reshape(probs, 1, d.n_expert, n_tok), topk)
    if m.gating == "softmax_weight":
        weights = g.op("soft_max", g.reshape(weights, n_used, n_tok))
        weights = g.reshape(weights, 1, n_used, n_tok)
    if m.norm_w:
        w2 = g.reshape(weights, n_used, n_tok)
        total = g.op("clamp", g.op("sum_rows", w2, ne=(1, n_tok)))
        weights = g.reshape(g.op("div", w2, total), 1, n_used, n_tok)
    if m.scale:
        weights = g.op("scale", weights)
    g.expand(weights)
    return weights, topk


def _expert_scaled(b: Builder, res: Tensor, topk: Tensor) -> Tensor:
    """build_lora_mm_id with w_s: the [n_expert] scales reshaped to [1, n_expert, 1],
    repeated over the tokens, the selected experts' rows gathered and multiplied in."""
    g, d = b.g, b.d
    n_tok = topk.ne[1]
    s = g.reshape(g.expert_weight(d.n_expert), 1, d.n_expert, 1)
    s = g.op("repeat", s, ne=(1, d.n_expert, n_tok))
    return g.op("mul", res, g.get_rows(s, topk))


def _moe_gateless(
    b: Builder, cur: Tensor, m: Moe, *, weights: Tensor, topk: Tensor, n_ff_exp: int
) -> Tensor:
    """moe_ffn's experts without a gate: up (times its per-expert scales), the activation
    alone, down (scaled), weighted, the experts' rows summed. `cur`: [n_embd, 1, n_tokens]."""
    g, d = b.g, b.d
    n_embd = cur.ne[0]
    up = g.mul_mat_id(g.expert_weight(n_embd, n_ff_exp, d.n_expert), cur, topk)
    if m.scaled:
        up = _expert_scaled(b, up, topk)
    act = g.op("unary", up)
    if m.act == "relu_sqr":
        act = g.op("sqr", act)
    experts = g.mul_mat_id(g.expert_weight(n_ff_exp, n_embd, d.n_expert), act, topk)
    if m.scaled:
        experts = _expert_scaled(b, experts, topk)
    experts = g.op("mul", experts, weights)
    return sum_experts(b, experts)


def ffn_no_gate(b: Builder, il: int, x: Tensor) -> Tensor:
    """build_ffn without a gate tensor: up (+bias), activation, down (+bias). An up
    projection twice n_ff wide carries the gate in its first half (phi3.cpp, glm4.cpp,
    chatglm.cpp: `{n_embd, 2 * n_ff}`, LLM_FFN_SWIGLU): the fused GLU (ggml_swiglu of one
    tensor) splits it and halves the width."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_ff = d.n_ff[il]
    shape = d.shape(pre + "ffn_up.weight")
    n_up = shape[1] if shape is not None and len(shape) > 1 else n_ff
    up = b.linear(x, n_up, bias=d.has(pre + "ffn_up.bias"))
    fused = n_up == 2 * n_ff
    act = g.op("swiglu", up, ne=(n_ff, *up.ne[1:])) if fused else g.op("unary", up)
    return b.linear(act, x.ne[0], bias=d.has(pre + "ffn_down.bias"))
