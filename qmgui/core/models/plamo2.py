"""PLaMo-2: Mamba and attention layers with post-norms (src/models/plamo2.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ffn import ffn_no_gate
from qmgui.core.graph.ssm import selective_scan
from qmgui.core.models.family import Family


def graph_plamo2(b: Builder) -> None:
    """src/models/plamo2.cpp: pre-norm, a Mamba (_mamba) or attention layer (fused QKV,
    Q/K norms, RoPE, no output bias), post-norm and residual; pre-norm, an FFN whose fused
    up projection carries the gate (SwiGLU), post-norm and residual. The last layer keeps
    only the output rows right after its mixer from MIXED_BATCH_BUILD on (b11434), before
    the last residual add in older builds (b10435)."""
    g = b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        residual = inp
        cur = b.norm(inp)
        if b.is_recurrent(il):
            cur = _mamba(b, il, cur)
        else:
            q, k, v = build_qkv(b, il, cur)
            cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
        if b.mixed_batch:
            cur, residual = b.last_rows(il, cur, residual)
        residual = g.op("add", b.norm(cur), residual)
        cur = b.norm(ffn_no_gate(b, il, b.norm(residual)))
        if not b.mixed_batch:
            cur, residual = b.last_rows(il, cur, residual)
        inp = g.op("add", cur, residual)
    b.output_head(inp)


def _mamba(b: Builder, il: int, x: Tensor) -> Tensor:
    """plamo2.cpp build_plamo2_mamba_layer: in-projection to z and x per head (permuted and
    made contiguous, x copied out), causal conv over cached tokens and SiLU; the x
    projection to B, C and dt, each RMS-normed, dt projected to the heads (+bias); selective
    scan (ssm_scan reads and returns the states); y + x*D, gated by z, out-projection. No
    groups: B and C are shared by the heads."""
    d, g = b.d, b.g
    d_conv, d_inner, d_state, _, n_head = d.ssm
    head_dim = d_inner // n_head
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    pre = f"blk.{il}."
    conv = g.reshape(b.rs((d_conv - 1) * d_inner), d_conv - 1, d_inner, n_seqs)
    zx = b.linear(g.reshape(x, x.ne[0], n_t, n_seqs), 2 * d_inner)
    zx = g.cont(g.permute(zx, 0, 2, 1, 3), head_dim * 2, n_head, n_t, n_seqs)
    row = (zx.nb[1], zx.nb[2], zx.nb[3])
    xs = g.cont(g.view(zx, (head_dim, n_head, n_t, n_seqs), row), d_inner, n_t, n_seqs)
    z = g.view(zx, (head_dim, n_head, n_t, n_seqs), row)
    conv_x = g.concat(conv, g.transpose(xs), 0)
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * d_inner, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * d_inner * n_seqs,))))
    xs = Tensor(
        "f32", (d_inner, n_t, n_seqs), op="ssm_conv", src=(conv_x, g.weight(d_conv, d_inner))
    )
    xs = g.op("unary", xs)
    x_shape = d.shape(pre + "ssm_x.weight")
    dt_dim = max(64, d.n_embd // 16)
    x_bcdt = b.linear(xs, x_shape[1] if x_shape else 2 * d_state + dt_dim)
    strides = (x_bcdt.nb[1], x_bcdt.nb[2])
    bs = b.norm(g.view(x_bcdt, (d_state, n_t, n_seqs), strides))
    cs = b.norm(g.view(x_bcdt, (d_state, n_t, n_seqs), strides))
    dt = b.norm(g.view(x_bcdt, (dt_dim, n_t, n_seqs), strides))
    dt = b.linear(dt, n_head, bias=True)
    x4 = g.view(xs, (head_dim, n_head, n_t, n_seqs))
    bs = g.view(bs, (d_state, 1, n_t, n_seqs), (d_state * 4, bs.nb[1], bs.nb[2]))
    cs = g.view(cs, (d_state, 1, n_t, n_seqs), (d_state * 4, cs.nb[1], cs.nb[2]))

    y_ssm = selective_scan(
        b, x4, dt, g.weight(1, n_head), (bs, cs), state=(d_state, head_dim, n_head)
    )
    y = g.view(y_ssm, (head_dim, n_head, n_t, n_seqs))
    y = g.op("add", y, g.op("mul", x4, g.weight(1, n_head)))
    y = g.op("swiglu", g.cont(z), y)
    y = g.view(y, (d_inner, n_t, n_seqs), (y.nb[2], y.nb[3]))
    return g.reshape(b.linear(y, d.n_embd), d.n_embd, n_t * n_seqs)


FAMILY = Family(graph_plamo2, laid_out=("plamo2",))
