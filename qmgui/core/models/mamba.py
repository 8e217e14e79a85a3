"""Mamba (Mamba-1, src/models/mamba.cpp)."""

from __future__ import annotations

from qmgui.core.graph.builder import Builder
from qmgui.core.graph.ssm import mamba_layer
from qmgui.core.models.family import Family


def graph_mamba(b: Builder) -> None:
    """src/models/mamba.cpp (Mamba-1): every layer a Mamba-1 mixer
    (mamba-base.cpp build_mamba_layer) on the RMS-normed input, with a residual add."""
    g = b.g
    inp = b.inp_embd()
    for il in b.each_layer():
        cur = mamba_layer(b, il, b.norm(inp))
        cur, inp = b.last_rows(il, cur, inp)
        inp = g.op("add", cur, inp)
    b.output_head(inp)


FAMILY = Family(graph_mamba, laid_out=("mamba",))
