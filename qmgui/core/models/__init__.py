"""One module per architecture family, as llama.cpp's src/models/ is laid out: each builds
its family's compute graph from the shared blocks (qmgui.core.graph) and declares the
architectures it serves (its FAMILY). Adding an architecture is one module here, listed in
FAMILIES, and its test (tests/core/test_models.py checks both)."""

from __future__ import annotations

from qmgui.core.graph.builder import Build
from qmgui.core.models import (
    bert,
    deepseek2,
    gemma,
    gpt_oss,
    granite_hybrid,
    hrm,
    lfm2,
    llama,
    mamba2,
    nemotron_h,
    parallel,
    qwen3next,
    rwkv7,
    talkie,
)
from qmgui.core.models.family import Family

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    gemma.FAMILY,
    gpt_oss.FAMILY,
    deepseek2.FAMILY,
    bert.FAMILY,
    qwen3next.FAMILY,
    granite_hybrid.FAMILY,
    lfm2.FAMILY,
    mamba2.FAMILY,
    nemotron_h.FAMILY,
    rwkv7.FAMILY,
    parallel.FAMILY,
    talkie.FAMILY,
    hrm.FAMILY,
)

# architecture -> graph, by how far the graph was checked (see Family)
VERIFIED: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.verified}
LAID_OUT: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.laid_out}
RELATIVES: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.relatives}
# the layout of architectures without a family of their own (times the generic margin)
GENERIC: Build = llama.graph_llama
