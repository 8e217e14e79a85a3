"""The key lookup every reader shares: `Keys` (typed, checked access to one header's
`{arch}.*` keys) and the plausibility limits a count is checked against (ImplausibleValue
naming the key and the value otherwise)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from qmgui.core.gguf_header import ArrayInfo, MetaValue
from qmgui.core.textsafe import printable

# --- plausibility limits ---------------------------------------------------------------------
# What a header (or config.json) may claim. Each count below sizes a loop, a per-layer tuple or
# a graph the sizing code builds, so each is checked before use; the limits sit far above any
# real model, and a value past one is a broken or hostile file: that file's row error, a
# sentence naming the key and the value (ModelReadError), never an exception from deeper down.
# llama.cpp's LLAMA_MAX_LAYERS (it loads no more); the deepest real models have ~130 layers
MAX_LAYERS = 512
MAX_EMBD = 1 << 20  # embedding width: 64x the widest real model (Llama 3.1 405B: 16,384)
MAX_WIDTH = 1 << 22  # feed-forward, SSM inner size, LoRA ranks: 80x the widest (405B: 53,248)
MAX_HEAD_DIM = 1 << 16  # values per K/V head: the largest real one is 576 (MLA 512 + 64 rope)
MAX_EXPERTS = 4096  # 8x llama.cpp's LLAMA_MAX_EXPERTS (512); Kimi K2 has 384
# experts used per token: each is a view per MoE layer in the replayed graph; real models use
# 1 to 16 (Qwen3-Next: 10 of 512)
MAX_EXPERTS_USED = 256
MAX_CONTEXT = 1 << 28  # tokens: 25x the longest trained context (Llama 4 Scout: 10,485,760)
MAX_VOCAB = 1 << 22  # 16x the largest vocabulary (Gemma 3: 262,208)
MAX_SMALL = 1024  # conv kernels, token-shift counts, short-conv caches (real ones: 2 to 4)


class ImplausibleValue(Exception):
    """A metadata value no real model has (the sentence names the key and the value). Raised
    inside the readers only; `meta_from_gguf` and `meta_from_hf` turn it into a
    ModelReadError naming the file."""


def shown(v: object) -> str:
    """A metadata value as a short, printable phrase for an error sentence."""
    if isinstance(v, str):
        cut = printable(v[:40])
        return f'"{cut}..." ({len(v):,} characters)' if len(v) > 40 else f'"{cut}"'
    if isinstance(v, ArrayInfo):
        return f"an array of {v.count:,} values"
    if isinstance(v, (tuple, list)):
        head = ", ".join(shown(x) for x in v[:4])
        return f"[{head}, ...] ({len(v):,} values)" if len(v) > 4 else f"[{head}]"
    if isinstance(v, dict):
        return f"an object of {len(v):,} keys"
    text = repr(v)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} digits)"


def checked_count(key: str, v: object, hi: int, unit: str) -> int:
    """`v` as a whole number from 0 to `hi`; ImplausibleValue naming `key` and `v` otherwise
    (negative, too large, fractional, infinite, NaN, text or an array where a number goes)."""
    if isinstance(v, bool):
        n = int(v)
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float) and math.isfinite(v) and v.is_integer():
        n = int(v)
    elif isinstance(v, float):
        raise ImplausibleValue(f"{key} is {shown(v)}; a number of {unit} is a whole number")
    else:
        raise ImplausibleValue(f"{key} is {shown(v)}; expected a number of {unit}")
    if not 0 <= n <= hi:
        raise ImplausibleValue(f"{key} is {shown(n)}, outside 0 to {hi:,} {unit}")
    return n


class Keys:
    """Typed, checked access to `{arch}.*` keys of one header: every count is a whole number
    within its limit before anything is sized by it (ImplausibleValue otherwise)."""

    def __init__(self, md: Mapping[str, MetaValue], arch: str) -> None:
        self.md = md
        self.arch = arch

    def name(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def raw(self, key: str) -> MetaValue | None:
        return self.md.get(f"{self.arch}.{key}")

    def get_int(self, key: str, default: int | None = None, *, hi: int, unit: str) -> int | None:
        """A count; an array of counts gives its largest element."""
        v = self.raw(key)
        if v is None:
            return default
        if isinstance(v, tuple):
            if not v:
                return default
            return max(self.element(key, i, x, hi, unit) for i, x in enumerate(v))
        return checked_count(self.name(key), v, hi, unit)

    def element(self, key: str, i: int, x: object, hi: int, unit: str) -> int:
        return checked_count(f"{self.name(key)}[{i}]", x, hi, unit)

    def per_layer(
        self, key: str, n_layer: int, default: int = 0, *, hi: int, unit: str
    ) -> tuple[int, ...]:
        """A scalar repeated per layer, or a per-layer array read element by element (a short
        array repeats its last element; `n_layer` is already bounded by MAX_LAYERS)."""
        v = self.raw(key)
        if v is None:
            return (default,) * n_layer
        if isinstance(v, tuple):
            if len(v) > MAX_LAYERS:
                raise ImplausibleValue(
                    f"{self.name(key)} is {shown(v)}: more values than a model has layers "
                    f"(at most {MAX_LAYERS})"
                )
            vals = tuple(self.element(key, i, x, hi, unit) for i, x in enumerate(v))
            if len(vals) >= n_layer:
                return vals[:n_layer]
            return vals + (vals[-1] if vals else default,) * (n_layer - len(vals))
        return (checked_count(self.name(key), v, hi, unit),) * n_layer
