"""The short-convolution block of LFM2 (src/models/lfm2.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def shortconv_block(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/lfm2.cpp build_shortconv_block: in_proj to B, C, x; B*x convolved over the
    cached previous tokens (ssm_conv), gated by C, out_proj."""
    d, g = b.d, b.g
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    n_embd = d.n_embd
    d_conv = d.shortconv - 1
    cur = g.reshape(x, n_embd, n_t, n_seqs)
    bcx = b.linear(cur, 3 * n_embd)
    strides = (bcx.nb[1], bcx.nb[2])
    bb = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    c = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    xx = g.view(bcx, (n_embd, n_t, n_seqs), strides)
    bx = g.transpose(g.op("mul", bb, xx))
    conv = g.reshape(b.rs(n_embd * d_conv), d_conv, n_embd, n_seqs)
    bx = g.concat(conv, bx, 0)
    snap = g.view(bx, (d_conv, bx.ne[1], bx.ne[2]), (bx.nb[1], bx.nb[2]))
    state = g.cache("f32", n_embd * d_conv, max(1, n_seqs))
    g.expand(g.cpy(snap, g.view(state, (n_embd * d_conv, n_seqs))))
    conv_out = Tensor(
        "f32",
        (n_embd, bx.ne[0] - d_conv, n_seqs),
        op="ssm_conv",
        src=(bx, g.weight(d_conv + 1, n_embd)),
    )
    y = b.linear(g.op("mul", c, conv_out), n_embd)
    return g.reshape(y, n_embd, n_t * n_seqs)
