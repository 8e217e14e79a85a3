"""One module per architecture family, as llama.cpp's src/models/ is laid out: each builds
its family's compute graph from the shared blocks (qmgui.core.graph) and declares the
architectures it serves (its FAMILY). Adding an architecture is one module here, listed in
FAMILIES, and its test (tests/core/test_models.py checks both)."""

from __future__ import annotations

from qmgui.core.graph.builder import Build
from qmgui.core.models import (
    arctic,
    bailingmoe3,
    bert,
    deepseek2,
    deepseek4,
    deepseek32,
    diffusion,
    dots3note,
    falcon_h1,
    gemma,
    glm5_next,
    gpt_oss,
    granite_hybrid,
    hrm,
    hy_v4,
    jamba,
    kimi_k3,
    kimi_linear,
    lfm2,
    llama,
    mamba,
    mamba2,
    minicpm3,
    minimax01,
    minimax_m3,
    nemotron_h,
    openelm,
    parallel,
    plamo2,
    qwen3next,
    qwen4exp,
    rwkv7,
    talkie,
)
from qmgui.core.models.family import Family

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    gemma.FAMILY,
    gpt_oss.FAMILY,
    deepseek2.FAMILY,
    diffusion.FAMILY,
    bert.FAMILY,
    qwen3next.FAMILY,
    bailingmoe3.FAMILY,
    glm5_next.FAMILY,
    qwen4exp.FAMILY,
    granite_hybrid.FAMILY,
    lfm2.FAMILY,
    mamba2.FAMILY,
    mamba.FAMILY,
    jamba.FAMILY,
    kimi_linear.FAMILY,
    kimi_k3.FAMILY,
    minimax01.FAMILY,
    minimax_m3.FAMILY,
    nemotron_h.FAMILY,
    openelm.FAMILY,
    falcon_h1.FAMILY,
    plamo2.FAMILY,
    rwkv7.FAMILY,
    parallel.FAMILY,
    talkie.FAMILY,
    hrm.FAMILY,
    minicpm3.FAMILY,
    deepseek32.FAMILY,
    dots3note.FAMILY,
    hy_v4.FAMILY,
    deepseek4.FAMILY,
    arctic.FAMILY,
)

# architecture -> graph, by how far the graph was checked (see Family)
VERIFIED: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.verified}
LAID_OUT: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.laid_out}
RELATIVES: dict[str, Build] = {a: f.build for f in FAMILIES for a in f.relatives}
# the layout of architectures without a family of their own (times the generic margin)
GENERIC: Build = llama.graph_llama
