"""The Mamba-2 mixer (src/models/mamba-base.cpp), shared by Mamba-2 and the hybrids."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def mamba2_layer(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/mamba-base.cpp build_mamba2_layer: in-projection to z, xBC, dt; causal
    conv over cached tokens; selective scan (ssm_scan reads and returns the states);
    y + x*D, gated by z, grouped RMS norm, out-projection."""
    d, g = b.d, b.g
    d_conv, d_inner, d_state, n_group, n_head = d.ssm
    head_dim = d_inner // n_head
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    channels = d_inner + 2 * n_group * d_state
    conv = g.reshape(b.rs((d_conv - 1) * channels), d_conv - 1, channels, n_seqs)
    zxbcdt = b.linear(
        g.reshape(x, x.ne[0], n_t, n_seqs), 2 * d_inner + 2 * n_group * d_state + n_head
    )
    strides = (zxbcdt.nb[1], zxbcdt.nb[2])
    z = g.view(zxbcdt, (head_dim, n_head, n_t, n_seqs), (head_dim * 4, *strides))
    xbc = g.view(zxbcdt, (channels, n_t, n_seqs), strides)
    dt = g.view(zxbcdt, (n_head, n_t, n_seqs), strides)
    conv_x = g.concat(conv, g.transpose(xbc), 0)
    last = g.view(conv_x, (d_conv - 1, channels, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * channels, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * channels, n_seqs))))
    xbc = Tensor(
        "f32", (channels, n_t, n_seqs), op="ssm_conv", src=(conv_x, g.weight(d_conv, channels))
    )
    xbc = g.op("unary", g.op("add", xbc, g.weight(channels)))
    xs = g.view(xbc, (head_dim, n_head, n_t, n_seqs), (head_dim * 4, xbc.nb[1], xbc.nb[2]))
    bs = g.view(xbc, (d_state, n_group, n_t, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]))
    cs = g.view(xbc, (d_state, n_group, n_t, n_seqs), (d_state * 4, xbc.nb[1], xbc.nb[2]))
    dt = g.op("add", g.cont(dt), g.weight(n_head))

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        ssm = g.reshape(states, d_state, head_dim, n_head, states.ne[1])
        n = xs.nelements + d_state * head_dim * n_head * ids.ne[0]
        return Tensor(
            "f32", (n,), op="ssm_scan", src=(ssm, xs, dt, g.weight(1, n_head), bs, cs, ids)
        )

    y_ssm = b.rs(d_state * d_inner, scan)
    s_cache = g.cache("f32", d_state * d_inner, max(1, n_seqs))
    g.expand(
        g.cpy(
            g.view(y_ssm, (d_state * d_inner, n_seqs)), g.view(s_cache, (d_state * d_inner, n_seqs))
        )
    )
    y = g.view(y_ssm, (head_dim, n_head, n_t, n_seqs))
    y = g.op("add", y, g.op("mul", xs, g.weight(1, n_head)))
    y = g.op("swiglu", g.cont(z), y)
    if d.has(f"blk.{il}.ssm_norm.weight"):
        y = b.norm(g.reshape(y, d_inner // n_group, n_group, n_t, n_seqs))
    y = g.reshape(y, d_inner, n_t * n_seqs)
    # the output is reshaped (a view), so the residual scale that follows cannot run in place
    return g.reshape(b.linear(y, d.n_embd), d.n_embd, n_t * n_seqs)
