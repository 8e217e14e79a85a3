"""Sliding-window attention: the window, and which layers slide (llama.cpp's
load_swa_pattern / set_swa_pattern per architecture, models/<arch>.cpp)."""

from __future__ import annotations

from qmgui.core.hparams.keys import MAX_CONTEXT, MAX_LAYERS, Keys, checked_count

# llama.cpp's sliding-window layout per architecture when the GGUF carries no per-layer
# sliding_window_pattern array (models/<arch>.cpp, load_swa_pattern / set_swa_pattern):
# arch -> (period, dense_first, window used when the GGUF has none). With period p, layer il
# slides when il % p < p - 1 (the last of each group is full attention); dense_first flips it
# to il % p != 0. Period 0 means every layer slides, 1 that none does. An architecture not
# listed here gets no sliding layers: charging full attention never under-estimates.
SWA_RULES: dict[str, tuple[int, bool, int | None]] = {
    "gemma2": (2, False, 4096),
    "gemma3": (6, False, None),
    "gemma3n": (5, False, None),
    "gemma-embedding": (6, False, None),
    "cohere2": (4, False, None),
    "cohere2moe": (4, True, None),
    "gpt-oss": (2, False, None),
    "llama4": (4, False, 8192),
    "exaone4": (4, False, None),
    "exaone-moe": (4, False, None),
    "olmo2": (4, False, None),
    "afmoe": (4, False, None),
    "smallthinker": (4, True, None),
    "laguna": (4, True, None),
    "mellum": (4, False, None),
    "muse-glimmer": (4, False, None),
    "plamo3": (8, False, None),
    "modern-bert": (3, True, None),
    "phi3": (1, False, None),
    "deepseek4": (0, False, None),
}
# the architectures read here their own way: SWA_RULES, LFM2's attention layers, EXAONE 4
ARCHS = frozenset({*SWA_RULES, "lfm2", "lfm2moe", "exaone4"})


def sliding_window(k: Keys, arch: str) -> int | None:
    """{arch}.attention.sliding_window, else the engine's default window for `arch`."""
    n_swa = k.get_int("attention.sliding_window", hi=MAX_CONTEXT, unit="tokens")
    if n_swa is None and arch in SWA_RULES:
        n_swa = SWA_RULES[arch][2]  # the engine's default window for this architecture
    return n_swa or None


def swa_layers(
    k: Keys, arch: str, n_layer: int, n_swa: int | None, kv: tuple[int, ...]
) -> tuple[bool, ...]:
    if not n_swa or (arch == "exaone4" and n_layer != 64):
        # exaone4: llama.cpp slides only in the 32B (64 layers; models/exaone4.cpp), the
        # others keep full attention whatever their sliding_window says
        return (False,) * n_layer
    pattern = k.raw("attention.sliding_window_pattern")
    if isinstance(pattern, tuple) and pattern:
        flags = tuple(bool(x) for x in pattern)
        return (flags + (False,) * n_layer)[:n_layer]
    if arch in ("lfm2", "lfm2moe"):
        return tuple(h > 0 for h in kv)
    rule = SWA_RULES.get(arch)
    if rule is None:
        return (False,) * n_layer
    period, dense_first = rule[0], rule[1]
    if isinstance(pattern, (int, float)) and not isinstance(pattern, bool):
        period = checked_count(
            k.name("attention.sliding_window_pattern"), pattern, MAX_LAYERS, "layers"
        )
    if period == 0:
        return (True,) * n_layer
    if dense_first:
        return tuple(il % period != 0 for il in range(n_layer))
    return tuple(il % period < period - 1 for il in range(n_layer))
