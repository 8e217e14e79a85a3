"""Placement speed: 10 models on 8 mismatched GPUs, against baselines measured in the same run.

    .venv/bin/python bench/place.py

The models are the full-size headers of bench/plan.py (Qwen3-4B, Llama-3-8B, Qwen3-30B-A3B,
Gemma-3-12B, written by the test factory as sparse files), asked for ten times with different
contexts, slots and KV cache types, four of them with an automatic context. The cards are
what a power user's rig holds: 24, 24, 16, 12, 12, 8, 8 and 6 GiB. Each `place()` call starts
cold (its own memo of footprints; the tensor tables of the headers stay cached, as in the
window). Baselines in the same run: a naive placement (each model in turn on the first card
with room, checked with the same footprint model: no best fit, no splits, no context
growth) and one fit search (`fit.max_context` of one model on one card). Exit status 1 if
the target is missed.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qmgui.core.fit import DEFAULT_GPU_RESERVE, Budget, check, max_context
from qmgui.core.footprint import Gpu
from qmgui.core.gguf_header import read_gguf_header
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelMeta, meta_from_gguf
from qmgui.core.placement import AutoContext, Placement, Request, place
from qmgui.core.units import GIB, format_bytes
from tests.synth.factory import FULL_SIZE_PRESETS, write_sparse_gguf

TARGET_MS = 100.0
CARDS_GIB = (24, 24, 16, 12, 12, 8, 8, 6)
REPEAT = 7
Q8 = {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "flash_attn": "on"}
# (name, preset, settings, automatic context)
MODELS: tuple[tuple[str, str, dict[str, object], bool], ...] = (
    ("coder-30b", "qwen3-30b-a3b", {"ctx_size": 32768}, False),
    ("chat-30b", "qwen3-30b-a3b", {"ctx_size": 16384, **Q8}, False),
    ("gemma-12b", "gemma3-12b", {}, True),
    ("gemma-12b-long", "gemma3-12b", {"ctx_size": 65536, **Q8}, False),
    ("llama-8b", "llama3-8b", {"ctx_size": 8192, "parallel": 2}, False),
    ("llama-8b-auto", "llama3-8b", {}, True),
    ("qwen-4b", "qwen3-4b", {"ctx_size": 40960}, False),
    ("qwen-4b-auto", "qwen3-4b", {}, True),
    ("qwen-4b-slots", "qwen3-4b", {"ctx_size": 16384, "parallel": 4}, False),
    ("qwen-4b-q8", "qwen3-4b", {**Q8}, True),
)


def timed(fn: Callable[[], object], repeat: int = REPEAT) -> float:
    """Median milliseconds of `fn()` over `repeat` runs."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def requests(tmp: Path) -> list[Request]:
    metas: dict[str, ModelMeta] = {}
    for key in {preset for _, preset, _, _ in MODELS}:
        path = write_sparse_gguf(tmp / f"{key}.gguf", FULL_SIZE_PRESETS[key])
        metas[key] = meta_from_gguf(read_gguf_header(path), file_name=path.name)
    return [
        Request(
            name,
            metas[preset],
            replace(LaunchSettings(), **settings),  # type: ignore[arg-type]
            context=AutoContext() if auto else None,
        )
        for name, preset, settings, auto in MODELS
    ]


def gpus() -> tuple[Gpu, ...]:
    return tuple(Gpu(f"GPU{i}", g * GIB) for i, g in enumerate(CARDS_GIB))


def naive(reqs: Sequence[Request], cards: Sequence[Gpu]) -> int:
    """Each model on the first card with room, at its minimum context: how many run."""
    left = [g.total_bytes - DEFAULT_GPU_RESERVE for g in cards]
    placed = 0
    for r in reqs:
        s = r.settings if r.context is None else replace(r.settings, ctx_size=r.context.minimum)
        for i, g in enumerate(cards):
            card = (Gpu(g.name, left[i] + DEFAULT_GPU_RESERVE),)
            result = check(r.meta, s, Budget(gpus=card))
            if result.fits:
                left[i] -= result.footprint.device(g.name).total
                placed += 1
                break
    return placed


def report(p: Placement) -> None:
    for m in p.placed:
        r = m.footprint.settings
        split = f" split {','.join(f'{x:g}' for x in m.settings.tensor_split)}" if m.split else ""
        print(f"  {m.name:15s} {', '.join(m.devices):12s} context {r.n_ctx:6d}{split}")
    for u in p.unplaced:
        print(f"  {u.name:15s} not placed: {u.reason}")
    free = ", ".join(f"{d.device} {format_bytes(d.free)}" for d in p.gpus)
    print(f"  free: {free}")


def main() -> int:
    cards = gpus()
    with tempfile.TemporaryDirectory() as tmp:
        reqs = requests(Path(tmp))
        result = place(reqs, cards)  # also warms the tensor tables, as a window would
        place_ms = timed(lambda: place(reqs, cards))
        fixed_ms = timed(lambda: place(reqs, cards, grow_context=False))
        naive_ms = timed(lambda: naive(reqs, cards))
        n_naive = naive(reqs, cards)
        one = Budget(gpus=(cards[0],))
        fit_ms = timed(lambda: max_context(reqs[0].meta, reqs[0].settings, one))
    print(f"{len(reqs)} models on {len(cards)} GPUs ({', '.join(f'{g}' for g in CARDS_GIB)} GiB):")
    report(result)
    print(
        f"baselines: naive first-fit placement {naive_ms:.1f} ms ({n_naive} of {len(reqs)} "
        f"placed); one largest-context search {fit_ms:.1f} ms"
    )
    print(
        f"place(): {place_ms:.1f} ms ({len(result.placed)} of {len(reqs)} placed; "
        f"{place_ms / naive_ms:.1f}x the naive placement, {place_ms / fit_ms:.1f}x one fit "
        f"search); without growing contexts {fixed_ms:.1f} ms"
    )
    ok = place_ms < TARGET_MS
    print(f"target < {TARGET_MS:.0f} ms: {'ok' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
