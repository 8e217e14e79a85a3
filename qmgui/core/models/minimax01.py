"""MiniMax-01: lightning (linear) attention layers, softmax attention layers, softmax-routed
experts, scaled residuals (src/models/minimax-01.cpp)."""

from __future__ import annotations

from dataclasses import replace

from qmgui.core.ggml.alloc import peak_bytes
from qmgui.core.ggml.compile import CELLS
from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.attention import build_qkv
from qmgui.core.graph.builder import Builder
from qmgui.core.graph.dims import Shape
from qmgui.core.graph.ffn import Moe, moe_ffn
from qmgui.core.graph.lightning import LightningInputs, lightning_attn
from qmgui.core.models.family import Family


def _softmax_attn(b: Builder, il: int, x: Tensor) -> Tensor:
    """The full-attention layers: build_qkv (biases; each projection's scale tensor runs in
    place), RoPE on Q and K, build_attn over the KV cache, wo (and its scale)."""
    g = b.g
    q, k, v = build_qkv(b, il, x)
    cur = b.attn_kv(il, b.rope(q), b.rope(k), v)
    if b.d.has(f"blk.{il}.attn_output.scale"):
        cur = g.op("mul", cur, g.weight(1))
    return cur


def _layers(b: Builder) -> None:
    g = b.g
    scale = getattr(b.d, "expert_weights_scale", 0.0) not in (0.0, 1.0)
    moe = Moe(gating="softmax", norm_w=True, scale=scale)
    inp = b.inp_embd()
    la = LightningInputs.build(b)
    for il in b.each_layer():
        cur = b.norm(inp)
        residual = cur
        cur = lightning_attn(b, il, cur, la) if b.is_recurrent(il) else _softmax_attn(b, il, cur)
        cur, residual = b.last_rows(il, cur, residual)
        ffn_inp = g.op("add", cur, g.op("scale", residual))
        cur = b.norm(ffn_inp)
        out = moe_ffn(b, cur, il, moe)
        inp = g.op("add", out, g.op("scale", cur))
    b.output_head(inp)


def _one_sequence(b: Builder) -> None:
    """The prompt ubatch as one sequence; the states are still read for every slot."""
    s = b.s
    b.rs_slots = s.n_seqs
    b.s = Shape(s.n_tokens, 1, s.n_outputs)


def _one_sequence_outweighs(b: Builder) -> bool:
    """Whether the one-sequence prompt graph needs more than the n_seqs one, compared at a
    fixed cache size (so every context of a launch gets the same graph structure): the
    decay input and the QK scores grow with the square of the tokens per sequence, the
    states and their products with the sequences."""
    d = replace(b.d, n_kv=CELLS, n_kv_swa=CELLS)
    peaks = []
    for one in (False, True):
        t = Builder(d, b.s)
        t.mixed_batch = b.mixed_batch
        if one:
            _one_sequence(t)
        _layers(t)
        peaks.append(peak_bytes(t.g))
    return peaks[1] > peaks[0]


def graph_minimax01(b: Builder) -> None:
    """src/models/minimax-01.cpp: the lightning-attention inputs (slopes, per-token Q/K
    decays, the [n_seq_tokens, n_seq_tokens, n_head] diagonal decay) once; per layer an RMS
    norm, lightning attention (recurrent layers) or softmax attention, the scaled normed
    input as the residual (the last layer keeps the output rows), RMS norm, softmax-routed
    experts with normalized weights, the scaled normed FFN input as the second residual.

    llama.cpp reserves this architecture's prompt graph a third time with one sequence
    (llama_context::sched_reserve, [TAG_RESERVE_DIAG_DECAY]) and keeps the larger buffer:
    with several slots the prompt graph is laid out as the larger of the two."""
    s = b.s
    if s.n_tokens > s.n_seqs > 1 and _one_sequence_outweighs(b):
        _one_sequence(b)
    _layers(b)


FAMILY = Family(graph_minimax01, laid_out=("minimax-01",))
