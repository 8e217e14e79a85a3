"""Qwen4 experimental (qwen4exp): gated delta net layers and gated full-attention layers
with QSA (a k-pool sparse indexer), low-rank hyper-connections (four residual streams), an
n-gram hash embedding (PLE) with a dilated causal conv, routed experts plus a gated shared
expert (src/models/qwen4exp.cpp)."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.delta_net import gated_delta_net
from qmgui.core.graph.ffn import sum_experts
from qmgui.core.graph.kpool import KpoolInputs, fill, kpool_inputs, scatter_mask
from qmgui.core.models.family import Family


def _mm(b: Builder, x: Tensor, n_out: int, name: str) -> Tensor:
    """build_lora_mm: the matmul, times the weight's scale tensor where the GGUF has one."""
    cur = b.linear(x, n_out)
    if b.d.has(name + ".scale"):
        cur = b.g.op("mul", cur, b.g.weight(1))
    return cur


def _hc_mix(b: Builder, x: Tensor, prefix: str, *, fused: bool) -> tuple[Tensor, Tensor]:
    """build_hc_mix: a grouped RMS norm of the [n_embd, hc, T] streams, a low-rank gate
    (down, scale, SiLU, up); fused (the layers' mixers: ggml_dsv4_hc_pre_gated) or, for the
    final mixer, sigmoid-gated, the streams' mean by views and adds. Returns the mixed
    [n_embd, T] and the inject weights (created; read by the combine)."""
    d, g = b.d, b.g
    n_embd, hc, nt = x.ne[0], x.ne[1], x.ne[2]
    down = d.shape(prefix + "_down.weight")
    rank = down[1] if down and len(down) > 1 else 1
    xn = g.op("mul", g.op("rms_norm", x), g.weight(n_embd, hc))
    xn = g.reshape(xn, n_embd * hc, nt)
    lo = g.op("unary", g.op("scale", b.linear(xn, rank)))
    gate = b.linear(lo, n_embd * hc)
    if fused:
        mixed = Tensor(
            "f32",
            (n_embd, nt),
            op="dsv4_hc_pre_gated",
            src=(g.reshape(xn, n_embd, hc, nt), g.reshape(gate, n_embd, hc, nt)),
        )
    else:
        gated = g.reshape(g.op("mul", xn, g.op("unary", gate)), n_embd, hc, nt)
        mixed = g.cont(g.view(gated, (n_embd, nt), (gated.nb[2],)))
        for _ in range(1, hc):
            mixed = g.op("add", mixed, g.view(gated, (n_embd, nt), (gated.nb[2],)))
        mixed = g.op("scale", mixed)
    inject = b.linear(xn, hc)
    return mixed, inject


def _hc_combine(b: Builder, residual: Tensor, out: Tensor, inject: Tensor) -> Tensor:
    """build_hc_combine, fused (ggml_dsv4_hc_post): 2 * sigmoid(inject / hc) scatters the
    block output over the streams, added to the residual streams."""
    g = b.g
    w = g.op("scale", g.op("unary", g.op("scale", inject)))
    return Tensor("f32", residual.ne, op="dsv4_hc_post", src=(out, residual, w))


def _conv_state_at(b: Builder, x: Tensor, cols: int, rows: list[Tensor]) -> Tensor:
    """build_conv_state_at: the layer's state row gathered (build_rs, once per state
    tensor), `cols` cached columns prepended to the tokens, the last `cols` columns copied
    (cont) back to the cache. Returns [cols + n_t, channels, n_seqs]."""
    g = b.g
    channels, n_seqs = x.ne[0], x.ne[2]
    if not rows:
        rows.append(b.rs(cols * channels))
    state = g.reshape(rows[0], cols, channels, n_seqs)
    conv_input = g.concat(state, g.transpose(x), 0)
    tail = g.view(conv_input, (cols, channels, n_seqs), (conv_input.nb[1], conv_input.nb[2]))
    cache = g.cache("f32", cols * channels, max(1, n_seqs))
    g.expand(g.cpy(g.cont(tail), g.view(cache, (cols * channels, n_seqs))))
    return conv_input


def _ple(b: Builder, il: int, emb: Tensor, hidden: Tensor) -> Tensor:
    """build_ple: key and value from the n-gram embedding, a per-stream gate (grouped norms,
    dot product, signed square root, sigmoid) on the value broadcast over the streams, a
    grouped norm, the dilated depthwise causal conv as a sum of shifted copies over the
    cached history (cont of each shift and kernel column), SiLU, added back."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_embd, hc, nt = hidden.ne[0], hidden.ne[1], hidden.ne[2]
    hc_dim = n_embd * hc
    n_seqs = b.s.n_seqs
    n_t = nt // n_seqs
    conv_w = d.shape(pre + "ple_conv1d.weight") or (4, hc_dim)
    kern = conv_w[0]
    # the history: (kernel - 1) taps times the dilation (the n-gram size)
    hist = d.ple_conv_floats // hc_dim if d.ple_conv_floats else 3 * (kern - 1)
    key = b.linear(emb, hc_dim)
    value = b.linear(emb, n_embd)

    def grouped(t: Tensor) -> Tensor:
        return g.op("mul", g.op("rms_norm", g.reshape(t, n_embd, hc, nt)), g.weight(n_embd, hc))

    key = grouped(key)
    query = grouped(hidden)
    s = g.op("scale", g.op("sum_rows", g.op("mul", key, query), ne=(1, hc, nt)))
    mag = g.op("sqrt", g.op("clamp", g.op("unary", s)))
    gate = g.op("unary", g.op("mul", g.op("unary", s), mag))
    v3 = g.op("repeat", g.reshape(value, n_embd, 1, nt), ne=(n_embd, hc, nt))
    gated = g.op("mul", v3, gate)
    normalized = g.reshape(grouped(g.reshape(gated, hc_dim, nt)), hc_dim, nt)
    rows: list[Tensor] = []
    padded = _conv_state_at(b, g.reshape(normalized, hc_dim, n_t, n_seqs), hist, rows)
    conv_out: Tensor | None = None
    for _ in range(kern):  # tap k reads (kern - 1 - k) * dilation columns back
        view = g.view(padded, (n_t, hc_dim, n_seqs), (padded.nb[1], padded.nb[2]))
        shifted = g.cont(g.transpose(view))
        w = g.view(g.weight(kern, hc_dim), (1, hc_dim))
        wk = g.reshape(g.op("cont", w, ne=(1, hc_dim), type_="f32"), hc_dim)
        term = g.op("mul", shifted, wk)
        conv_out = term if conv_out is None else g.op("add", conv_out, term)
    assert conv_out is not None
    conv_out = g.reshape(g.cont(g.op("unary", conv_out)), n_embd, hc, nt)
    return g.op("add", hidden, g.op("add", gated, conv_out))


def _linear_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """build_layer_attn_linear: fused QKV and gate projections (with their scales), beta
    and the decay, QKV through the causal conv over its cached columns, L2-normed Q and K
    (rms_norm, scale), the fused gated delta net (no repeat: the CPU's fused op takes
    fewer K heads), an RMS norm gated by sigmoid(z), out-projection."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    d_conv, _, head, num_k, num_v = d.ssm
    n_seqs = b.s.n_seqs
    n_tok = x.ne[1]
    n_t = n_tok // n_seqs
    channels = head * num_k * 2 + head * num_v
    qkv = g.reshape(_mm(b, x, channels, pre + "attn_qkv"), channels, n_t, n_seqs)
    z = _mm(b, x, head * num_v, pre + "attn_gate")
    beta = g.reshape(_mm(b, x, num_v, pre + "ssm_beta"), 1, num_v, n_t, n_seqs)
    beta = g.op("unary", beta)
    alpha = g.reshape(_mm(b, x, num_v, pre + "ssm_alpha"), num_v, n_t, n_seqs)
    alpha = g.op("unary", g.op("add", alpha, g.weight(num_v)))
    decay = g.reshape(g.op("mul", alpha, g.weight(num_v)), 1, num_v, n_t, n_seqs)
    rows: list[Tensor] = []
    conv_input = _conv_state_at(b, qkv, d_conv - 1, rows)
    state = g.reshape(b.rs(head * head * num_v), head, head, num_v, n_seqs)
    conv = Tensor(
        "f32", (channels, n_t, n_seqs), op="ssm_conv", src=(conv_input, g.weight(d_conv, channels))
    )
    conv = g.op("unary", conv)
    cs = (conv.nb[1], conv.nb[1] * n_t)
    q = g.view(conv, (head, num_k, n_t, n_seqs), (head * 4, *cs))
    k = g.view(conv, (head, num_k, n_t, n_seqs), (head * 4, *cs))
    v = g.view(conv, (head, num_v, n_t, n_seqs), (head * 4, *cs))
    q = g.op("scale", g.op("rms_norm", q))
    k = g.op("scale", g.op("rms_norm", k))
    out = gated_delta_net(b, (q, k, v), decay, beta, state)
    gate = g.op("unary", g.reshape(z, head, num_v, n_t, n_seqs))
    normed = g.op("mul", b.norm(out), gate)
    cur = _mm(b, g.reshape(normed, head * num_v, n_t, n_seqs), d.n_embd, pre + "ssm_out")
    return g.reshape(cur, d.n_embd, n_t * n_seqs)


def _qsa_sel(b: Builder, il: int, x: Tensor, kp: KpoolInputs) -> Tensor:
    """build_qsa_sel: raw indexer keys cached beside a zeroed pooled slot; this ubatch's
    pools re-pooled (the members' mean, RMS norm, M-RoPE at the first member) and scattered
    to their slots; every pooled key gathered and scored by the lightning indexer against
    the normed, roped indexer queries (head weights a filled constant); the top pools'
    members plus the tail selected; the selection scattered into the KQ mask (dead slots
    dumped to rows found by a cumulative sum)."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n = b.n_tokens
    k_shape = d.shape(pre + "indexer.k_proj.weight")
    q_shape = d.shape(pre + "indexer.q_proj.weight")
    head = k_shape[1] if k_shape and len(k_shape) > 1 else 128
    n_ih = (q_shape[1] // head) if q_shape and len(q_shape) > 1 else 1
    kpool, n_new, n_pool, n_top = kp.kpool, kp.n_new, kp.n_pool, kp.n_top
    k_raw = b.linear(x, head)
    packed = g.reshape(g.concat(k_raw, fill(b, "f32", head, n), 0), 2 * head, 1, n)
    idx_cache = g.cache(d.type_k, 2 * head, d.n_kv, d.n_stream)
    g.expand(b.store_k(idx_cache, packed, kp.k_idxs))
    cells = d.n_kv * d.n_stream
    row = idx_cache.nb[1]
    key_slot = g.view(idx_cache, (head, cells), (row,))
    pooled_slot = g.view(idx_cache, (head, cells), (row,))
    rows = g.get_rows(key_slot, g.reshape(kp.new_pool_idxs, kpool * n_new))
    rows = g.reshape(rows, head, kpool, n_new)
    pooled_new: Tensor | None = None
    for _ in range(kpool):
        part = g.view(rows, (head, n_new), (rows.nb[2],))
        pooled_new = g.cont(part) if pooled_new is None else g.op("add", pooled_new, part)
    assert pooled_new is not None
    assert kp.new_pool_pos is not None
    pooled_new = b.norm(g.op("scale", pooled_new))
    pooled_new = g.op("rope", g.reshape(pooled_new, head, 1, n_new), kp.new_pool_pos)
    g.expand(g.set_rows(pooled_slot, g.reshape(pooled_new, head, n_new), kp.new_pool_rep))
    pooled = g.reshape(g.get_rows(pooled_slot, kp.pool_cells), head, 1, n_pool)
    q = g.reshape(b.linear(x, n_ih * head), head, n_ih, n)
    q = b.rope(b.norm(q))
    weights = fill(b, "f32", n_ih, n)
    score = Tensor(
        "f32", (n_pool, n), op="lightning_indexer", src=(q, pooled, weights, kp.pool_mask)
    )
    top = Tensor("i32", (n_top, n), op="top_k", src=(score,))
    sel_idx = g.get_rows(kp.pool_idxs, g.reshape(top, n_top * n))
    sel_idx = g.concat(g.reshape(sel_idx, kpool * n_top, n), kp.tail_idxs, 0)
    g.expand(sel_idx)
    inp = b.kv_inputs(False)
    top_score = g.get_rows(g.reshape(score, 1, n_pool, n), top)
    live_pool = g.op("clamp", g.op("scale", top_score))
    live_pool = g.op("repeat", live_pool, ne=(kpool, n_top, n))
    live_pool = g.reshape(live_pool, kpool * n_top, n)
    live_tail = g.op("clamp", g.op("scale", g.op("cpy", kp.tail_idxs, type_="f32")))
    live = g.concat(live_pool, live_tail, 0)
    dump = g.op("scale", g.op("cumsum", g.op("fill", live)))
    return scatter_mask(b, kp, sel_idx, live=live, dump=dump, mask=inp.mask, n_kv=inp.n_kv)


def _full_attn(b: Builder, il: int, x: Tensor, kp: KpoolInputs | None) -> Tensor:
    """build_layer_attn: the QSA selection first (where the layer compresses), Q with its
    per-head gate in one projection, Q/K norms, M-RoPE, attention over the cache (under the
    selection mask), sigmoid(gate) times the output, wo (with the scales)."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n = x.ne[1]
    hq, hkv, hd = d.n_head[il], d.n_head_kv[il], d.head_k
    ratio = d.compress_ratios[il] if il < len(d.compress_ratios) else 0
    sel = _qsa_sel(b, il, x, kp) if kp is not None and ratio > 0 else None
    q_full = _mm(b, x, 2 * hd * hq, pre + "attn_q")
    q = g.view(q_full, (hd, hq, n), (2 * hd * 4, 2 * hd * hq * 4))
    q = b.norm(q)
    k = _mm(b, x, hd * hkv, pre + "attn_k")
    v = _mm(b, x, hd * hkv, pre + "attn_v")
    k = b.norm(g.reshape(k, hd, hkv, n))
    gate = g.cont(g.view(q_full, (hd, hq, n), (2 * hd * 4, 2 * hd * hq * 4)), hd * hq, n)
    v = g.reshape(v, hd, hkv, n)
    q, k = b.rope(q), b.rope(k)
    if sel is not None:
        mask = b.kv_inputs(False).mask
        cur = b.attn_kv(il, q, k, v, wo=False, mask=g.reshape(sel, *mask.ne))
    else:
        cur = b.attn_kv(il, q, k, v, wo=False)
    cur = g.op("mul", cur, g.op("unary", gate))
    return _mm(b, cur, d.n_embd, pre + "attn_output")


def _moe(b: Builder, x: Tensor, il: int) -> Tensor:
    """build_layer_ffn: softmax-routed experts (weights normalized, scaled where the GGUF
    says), gate and up in one merged matmul where the GGUF has ffn_gate_up_exps, per-expert
    scales (repeat, get_rows, mul); plus the shared expert (with its scales) gated by
    sigmoid(gate_inp_shexp x)."""
    d, g = b.d, b.g
    pre = f"blk.{il}."
    n_tok, n_embd = x.ne[1], x.ne[0]
    n_used, n_exp = d.n_expert_used, d.n_expert
    logits = b.linear(x, n_exp)
    probs = g.op("soft_max", logits)
    order = g.op("argsort", probs, type_="i32")
    topk = g.view(order, (n_used, n_tok), (order.nb[1],))
    weights = g.get_rows(g.reshape(probs, 1, n_exp, n_tok), topk)
    w2 = g.reshape(weights, n_used, n_tok)
    total = g.op("clamp", g.op("sum_rows", w2, ne=(1, n_tok)))
    weights = g.reshape(g.op("div", w2, total), 1, n_used, n_tok)
    if d.expert_weights_scale not in (0.0, 1.0):
        weights = g.op("scale", weights)
    g.expand(weights)
    cur = g.reshape(x, n_embd, 1, n_tok)

    def scaled(t: Tensor, name: str) -> Tensor:
        if not d.has(pre + name + ".scale"):
            return t
        s = g.op("repeat", g.reshape(g.weight(n_exp), 1, n_exp, 1), ne=(1, n_exp, n_tok))
        return g.op("mul", t, g.get_rows(s, topk))

    down_shape = d.shape(pre + "ffn_down_exps.weight")
    n_ff = down_shape[0] if down_shape else d.n_ff[il]
    if d.has(pre + "ffn_gate_up_exps.weight"):
        gate_up = g.mul_mat_id(g.expert_weight(n_embd, 2 * n_ff, n_exp), cur, topk)
        gate_up = scaled(gate_up, "ffn_up_exps")
        gv = g.view(gate_up, (n_ff, n_used, n_tok), (gate_up.nb[1], gate_up.nb[2]))
        uv = g.view(gate_up, (n_ff, n_used, n_tok), (gate_up.nb[1], gate_up.nb[2]))
        act = g.op("swiglu", gv, uv)
    else:
        up = scaled(g.mul_mat_id(g.expert_weight(n_embd, n_ff, n_exp), cur, topk), "ffn_up_exps")
        gt = g.mul_mat_id(g.expert_weight(n_embd, n_ff, n_exp), cur, topk)
        act = g.op("swiglu", scaled(gt, "ffn_gate_exps"), up)
    experts = g.mul_mat_id(g.expert_weight(n_ff, n_embd, n_exp), act, topk)
    experts = g.op("mul", scaled(experts, "ffn_down_exps"), weights)
    out = sum_experts(b, experts)
    shexp = d.shape(pre + "ffn_up_shexp.weight")
    if shexp is None:
        return out
    up = _mm(b, x, shexp[1], pre + "ffn_up_shexp")
    gt = _mm(b, x, shexp[1], pre + "ffn_gate_shexp")
    sh = _mm(b, g.op("swiglu", gt, up), n_embd, pre + "ffn_down_shexp")
    sh = g.op("mul", sh, g.op("unary", b.linear(x, 1)))
    return g.op("add", out, sh)


def graph_qwen4exp(b: Builder) -> None:
    """src/models/qwen4exp.cpp: the embedding repeated into hc streams; the PLE n-gram rows
    gathered once and mixed in before the PLE layer; per layer a hyper-connection mix, a
    gated delta net or a (QSA) gated attention layer, a combine; the same around the MoE;
    the last layer keeps only the output rows (block output, inject weights, streams); the
    final mixer (unfused) is the output norm."""
    d, g = b.d, b.g
    n = b.n_tokens
    inp = b.inp_embd()
    ratios = [r for r in d.compress_ratios if r > 0]
    has_idx = any(n_.endswith("indexer.k_proj.weight") for n_ in d.names)
    kp = None
    if ratios and has_idx:
        kp = kpool_inputs(
            b, ratios[0], d.indexer_top_k, tail=True, gather_mask=False, pool_pos=True
        )
    b.inp_pos(4)  # IMRoPE: four positions a token
    ple_emb = None
    table = d.shape("per_layer_token_embd.weight")
    if table is not None:
        head = table[0]
        key = next((s for nm, s in d.shapes.items() if nm.endswith("ple_key.weight")), None)
        width = key[0] if key else d.n_embd
        emb = g.get_rows(g.weight(head, table[1]), g.input("i32", (width // head) * n))
        ple_emb = g.expand(g.reshape(emb, width, n))
    norm_shape = d.shape("blk.0.hc_attn_norm.weight")
    hc = norm_shape[1] if norm_shape and len(norm_shape) > 1 else 4
    res_hc = g.expand(g.op("repeat", g.reshape(inp, d.n_embd, 1, n), ne=(d.n_embd, hc, n)))
    for il in b.each_layer():
        pre = f"blk.{il}."
        if ple_emb is not None and d.has(pre + "ple_key.weight"):
            res_hc = _ple(b, il, ple_emb, res_hc)
        cur, inject = _hc_mix(b, res_hc, pre + "hc_attn", fused=True)
        g.expand(cur)
        cur = _linear_attn(b, il, cur) if b.is_recurrent(il) else _full_attn(b, il, cur, kp)
        if il == d.n_layer - 1:
            cur = g.get_rows(cur, b.out_ids())
            inject = g.get_rows(inject, b.out_ids())
            flat = g.get_rows(g.reshape(res_hc, d.n_embd * hc, res_hc.ne[2]), b.out_ids())
            res_hc = g.reshape(flat, d.n_embd, hc, flat.ne[1])
        res_hc = _hc_combine(b, res_hc, cur, inject)
        cur, inject = _hc_mix(b, res_hc, pre + "hc_ffn", fused=True)
        res_hc = _hc_combine(b, res_hc, _moe(b, cur, il), inject)
    cur, _ = _hc_mix(b, res_hc, "output_hc", fused=False)
    cur.is_output = True
    b.t_embd = cur
    logits = g.mul_mat(g.weight(d.n_embd, d.n_vocab), cur)
    logits.is_output = True
    g.expand(logits)


FAMILY = Family(graph_qwen4exp, laid_out=("qwen4exp",))
