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

    y_ssm = selective_scan(
        b, xs, dt, g.weight(1, n_head), (bs, cs), state=(d_state, head_dim, n_head)
    )
    y = g.view(y_ssm, (head_dim, n_head, n_t, n_seqs))
    y = g.op("add", y, g.op("mul", xs, g.weight(1, n_head)))
    y = g.op("swiglu", g.cont(z), y)
    if d.has(f"blk.{il}.ssm_norm.weight"):
        y = b.norm(g.reshape(y, d_inner // n_group, n_group, n_t, n_seqs))
    y = g.reshape(y, d_inner, n_t * n_seqs)
    # the output is reshaped (a view), so the residual scale that follows cannot run in place
    return g.reshape(b.linear(y, d.n_embd), d.n_embd, n_t * n_seqs)


def mamba_layer(b: Builder, il: int, x: Tensor) -> Tensor:
    """src/models/mamba-base.cpp build_mamba_layer (Mamba-1, also Jamba's mixer): in-projection
    to x and z; causal conv over cached tokens (bias, SiLU); the x projection to dt, B and C
    (dt_rank + 2 * d_state), RMS-normed when the layer has dt/B/C norms (Jamba), dt projected
    up to d_inner; selective scan with one head per channel (it reads and returns the states);
    y + x*D, gated by z, out-projection."""
    d, g = b.d, b.g
    d_conv, d_inner, d_state, _, dt_rank = d.ssm
    n_seqs = b.s.n_seqs
    n_t = x.ne[1] // n_seqs
    conv = g.reshape(b.rs((d_conv - 1) * d_inner), d_conv - 1, d_inner, n_seqs)
    xz = b.linear(g.reshape(x, x.ne[0], n_t, n_seqs), 2 * d_inner)
    strides = (xz.nb[1], xz.nb[2])
    xs = g.view(xz, (d_inner, n_t, n_seqs), strides)
    z = g.view(xz, (d_inner, n_t, n_seqs), strides)
    conv_x = g.concat(conv, g.transpose(xs), 0)
    last = g.view(conv_x, (d_conv - 1, d_inner, n_seqs), (conv_x.nb[1], conv_x.nb[2]))
    r_cache = g.cache("f32", (d_conv - 1) * d_inner, max(1, n_seqs))
    g.expand(g.cpy(last, g.view(r_cache, ((d_conv - 1) * d_inner * n_seqs,))))
    xs = Tensor(
        "f32", (d_inner, n_t, n_seqs), op="ssm_conv", src=(conv_x, g.weight(d_conv, d_inner))
    )
    xs = g.op("unary", g.op("add", xs, g.weight(d_inner)))
    x_db = b.linear(xs, dt_rank + 2 * d_state)
    row = (x_db.nb[1], x_db.nb[2])
    dt = g.view(x_db, (dt_rank, n_t, n_seqs), row)
    bs = g.view(x_db, (d_state, 1, n_t, n_seqs), (d_state * 4, *row))
    cs = g.view(x_db, (d_state, 1, n_t, n_seqs), (d_state * 4, *row))
    pre = f"blk.{il}."
    if all(d.has(pre + f"ssm_{n}_norm.weight") for n in ("dt", "b", "c")):
        dt, bs, cs = b.norm(dt), b.norm(bs), b.norm(cs)
    else:
        dt = g.cont(dt)
    dt = b.linear(dt, d_inner, bias=True)
    x4 = g.reshape(xs, 1, d_inner, n_t, n_seqs)

    a = g.weight(d_state, d_inner)
    y_ssm = selective_scan(b, x4, dt, a, (bs, cs), state=(d_state, 1, d_inner))
    y = g.view(y_ssm, (d_inner, n_t, n_seqs))
    y = g.op("add", y, g.op("mul", xs, g.weight(d_inner)))
    y = g.op("swiglu", g.cont(z), y)
    return g.reshape(b.linear(y, d.n_embd), d.n_embd, n_t * n_seqs)


def selective_scan(
    b: Builder,
    x: Tensor,
    dt: Tensor,
    a: Tensor,
    bc: tuple[Tensor, Tensor],
    *,
    state: tuple[int, int, int],
) -> Tensor:
    """ggml_ssm_scan over the layer's recurrent states (build_rs hands it the sequences'
    states), then the final states copied back into the state cache. `state`: one
    sequence's state as (d_state, head_dim, n_head) (Mamba-1: head_dim 1, a head per
    channel); `bc`: the B and C inputs. Returns the scan's output: y for every token, then
    the states."""
    g = b.g
    bs, cs = bc
    n_seqs = b.s.n_seqs
    size = state[0] * state[1] * state[2]

    def scan(states: Tensor, ids: Tensor) -> Tensor:
        ssm = g.reshape(states, *state, states.ne[1])
        n = x.nelements + size * ids.ne[0]
        return Tensor("f32", (n,), op="ssm_scan", src=(ssm, x, dt, a, bs, cs, ids))

    y_ssm = b.rs(size, scan)
    s_cache = g.cache("f32", size, max(1, n_seqs))
    n_s = size * n_seqs
    g.expand(g.cpy(g.view(y_ssm, (n_s,)), g.view(s_cache, (n_s,))))
    return y_ssm
