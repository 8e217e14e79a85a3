"""build_pooling (src/llama-graph.cpp): the pooled embeddings of an embedding context."""

from __future__ import annotations

from qmgui.core.ggml.tensor import Tensor
from qmgui.core.graph.builder import Builder


def build_pooling(b: Builder, embd: Tensor) -> None:
    """build_pooling: t_embd stays an output; mean pooling multiplies by an [n_tokens,
    n_seqs] input, CLS/last pooling picks rows."""
    g = b.g
    embd.is_output = True
    g.expand(embd)
    n_tok = embd.ne[1]
    if b.d.pooling == "mean":
        pooled = g.mul_mat(g.cont(g.transpose(embd)), g.input("f32", n_tok, b.s.n_seqs))
    elif b.d.pooling in ("cls", "last", "rank"):
        pooled = g.get_rows(embd, g.input("i32", b.s.n_seqs))
    else:
        return
    if b.d.pooling == "rank":  # classification head (unmeasured: no reranker fixture)
        if b.d.has("cls.weight"):
            pooled = b.linear(pooled, b.d.n_embd, bias=b.d.has("cls.bias"))
            pooled = g.op("unary", pooled)
        if b.d.has("cls.output.weight"):
            n_out = (b.d.shape("cls.output.weight") or (0, 1))[1]
            pooled = b.linear(pooled, n_out, bias=b.d.has("cls.output.bias"))
    pooled.is_output = True
    g.expand(pooled)
