"""The RWKV-7 time mix (src/models/rwkv7-base.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def _lora_rank(b: Builder, name: str) -> int:
    shape = b.d.shape(name)
    return shape[1] if shape else 1


def rwkv7_time_mix(
    b: Builder, il: int, cur: Tensor, x_prev: Tensor, first_v: list[Tensor]
) -> Tensor:
    """src/models/rwkv7-base.cpp build_rwkv7_time_mix: the token-shift lerp repeated into
    five or six mixes, LoRA'd decay / in-context rate / value residual / gate, the WKV7 op
    (output + new state in one tensor), a per-head group norm, bonus term, gate, out-proj."""
    d, g = b.d, b.g
    pre = f"blk.{il}.time_mix_"
    n_embd = d.n_embd
    n_seqs = b.s.n_seqs
    n_tok = cur.ne[1] * cur.ne[2]
    hs = d.rwkv_head
    hc = n_embd // hs
    gating = d.has(pre + "g1.weight")
    sx = g.op("sub", x_prev, cur)
    sx = g.op("repeat", sx, ne=(n_embd, cur.ne[1], n_seqs, 6 if gating else 5))
    xxx = g.op("add", g.op("mul", sx, g.weight(n_embd, 1, 1, 6)), cur)
    xr, xw, xk, xv, xa, xg = (g.view(xxx, (n_embd, n_tok), (xxx.nb[1],)) for _ in range(6))
    r = b.linear(xr, n_embd)
    w = b.linear(g.op("unary", b.linear(xw, _lora_rank(b, pre + "w1.weight"))), n_embd)
    w = g.op("unary", g.op("scale", g.op("unary", g.op("add", w, g.weight(n_embd)))))
    k = b.linear(xk, n_embd)
    v = b.linear(xv, n_embd)
    if not first_v:
        first_v.append(v)
    else:
        mix = b.linear(b.linear(xv, _lora_rank(b, pre + "v1.weight")), n_embd)
        mix = g.op("unary", g.op("add", mix, g.weight(n_embd)))
        v = g.op("add", v, g.op("mul", g.op("sub", first_v[0], v), mix))
    gate = None
    if gating:
        gate = b.linear(g.op("unary", b.linear(xg, _lora_rank(b, pre + "g1.weight"))), n_embd)
    a = b.linear(b.linear(xa, _lora_rank(b, pre + "a1.weight")), n_embd)
    a = g.op("unary", g.op("add", a, g.weight(n_embd)))
    kk = g.op("l2_norm", g.reshape(g.op("mul", k, g.weight(n_embd)), hs, hc, n_tok))
    ka = g.op("mul", k, g.weight(n_embd))
    k = g.op("add", k, g.op("sub", g.op("mul", a, ka), ka))
    r3, w3, k3, v3, a3 = (g.reshape(t, hs, hc, n_tok) for t in (r, w, k, v, a))
    state = b.rs(n_embd * hs)
    wkv = Tensor(
        "f32",
        (n_embd, n_tok + hs * n_seqs),
        op="rwkv_wkv7",
        src=(r3, w3, k3, v3, g.op("unary", kk), g.op("mul", kk, a3), state),
    )
    out = g.view(wkv, (n_embd * n_tok,))
    s_cache = g.cache("f32", n_embd * hs, max(1, n_seqs))
    g.expand(g.cpy(g.view(wkv, (n_embd * hs * n_seqs,)), g.view(s_cache, (n_embd * hs * n_seqs,))))
    if d.has(pre + "ln.weight"):
        out = g.reshape(g.op("norm", g.reshape(out, n_embd // hc, hc, n_tok)), n_embd, n_tok)
        out = g.op("add", g.op("mul", out, g.weight(n_embd)), g.weight(n_embd))
    else:
        out = g.reshape(out, n_embd, n_tok)
    rk = g.op("mul", g.op("mul", k3, r3), g.reshape(g.weight(n_embd), hs, hc))
    rk = g.op("sum_rows", rk, ne=(1, hc, n_tok))
    out = g.op("add", out, g.reshape(g.op("mul", v3, rk), n_embd, n_tok))
    if gate is not None:
        out = g.op("mul", out, gate)
    return g.reshape(b.linear(out, n_embd), n_embd, cur.ne[1], n_seqs)
