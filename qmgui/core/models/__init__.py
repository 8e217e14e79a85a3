"""One module per architecture family, as llama.cpp's src/models/ is laid out: each builds
its family's compute graph from the shared blocks (qmgui.core.graph) and declares the
architectures it serves (its FAMILY). Adding an architecture is one module here, a line in
INDEX, and its test (tests/core/test_models.py holds INDEX to the modules' declarations).

A family's module is imported when a model of one of its architectures is first sized, not
with this package: there are over thirty, and a `qmgui plan` sizes one model."""

from __future__ import annotations

import importlib
import pkgutil

from qmgui.core.graph.builder import Build
from qmgui.core.models.family import Family

# architecture -> the module of its family
INDEX: dict[str, str] = {
    "llama": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "qwen3moe": "llama",
    "gemma2": "gemma",
    "gemma3": "gemma",
    "gpt-oss": "gpt_oss",
    "deepseek2": "deepseek2",
    "mistral4": "deepseek2",
    "dream": "diffusion",
    "llada": "diffusion",
    "llada-moe": "diffusion",
    "rnd1": "diffusion",
    "bert": "bert",
    "qwen3next": "qwen3next",
    "qwen35": "qwen3next",
    "qwen35moe": "qwen3next",
    "bailingmoe3": "bailingmoe3",
    "glm5-next": "glm5_next",
    "qwen4exp": "qwen4exp",
    "granitehybrid": "granite_hybrid",
    "lfm2": "lfm2",
    "lfm2moe": "lfm2",
    "mamba2": "mamba2",
    "mamba": "mamba",
    "jamba": "jamba",
    "kimi-linear": "kimi_linear",
    "kimi-k3": "kimi_k3",
    "minimax-01": "minimax01",
    "minimax-m3": "minimax_m3",
    "nemotron_h": "nemotron_h",
    "nemotron_h_moe": "nemotron_h",
    "openelm": "openelm",
    "falcon-h1": "falcon_h1",
    "plamo2": "plamo2",
    "rwkv7": "rwkv7",
    "phi2": "parallel",
    "command-r": "parallel",
    "cohere2": "parallel",
    "cohere2moe": "parallel",
    "plamo": "parallel",
    "talkie": "talkie",
    "hrm_text": "hrm",
    "minicpm3": "minicpm3",
    "deepseek32": "deepseek32",
    "glm-dsa": "deepseek32",
    "dots3note": "dots3note",
    "hy_v4": "hy_v4",
    "deepseek4": "deepseek4",
    "arctic": "arctic",
}
_GENERIC_MODULE = "llama"  # graph_llama: the layout of architectures without a family


def family_of(arch: str) -> Family | None:
    """The family that lays out `arch` (its module imported on first use), or None."""
    module = INDEX.get(arch)
    if module is None:
        return None
    family: Family = importlib.import_module(f"{__name__}.{module}").FAMILY
    return family


def generic() -> Build:
    """The layout of architectures without a family of their own (times the generic margin)."""
    build: Build = importlib.import_module(f"{__name__}.{_GENERIC_MODULE}").graph_llama
    return build


def all_families() -> tuple[Family, ...]:
    """Every family module's FAMILY, each module imported (tests, tools)."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name != "family")
    return tuple(importlib.import_module(f"{__name__}.{n}").FAMILY for n in names)
