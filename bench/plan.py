"""Planning speed: one footprint evaluation and whole fit searches on a realistic model.

    .venv/bin/python bench/plan.py

The model is a header-only description of a 64-layer MoE (Qwen3-235B-like layout, ~960
tensors): no file is needed. Each figure is printed beside its target and beside a baseline
measured in the same run (a fixed pure-Python workload), so a slow or busy machine shows up
as a slow baseline rather than as a regression. Exit status 1 if a target is missed.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qmgui.core.fit import Budget, gpus_from_sizes, max_context, offload_for_context
from qmgui.core.footprint import estimate
from qmgui.core.launch import LaunchSettings
from qmgui.core.meta import ModelClass, ModelMeta, TensorEntry
from qmgui.core.units import GIB

TARGET_ESTIMATE_MS = 1.0
TARGET_FIT_MS = 20.0
N_LAYER = 94
PER_LAYER = (
    "attn_norm",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "attn_q_norm",
    "attn_k_norm",
    "ffn_norm",
    "ffn_gate_inp",
    "ffn_up_exps",
    "ffn_down_exps",
    "ffn_gate_exps",
)


def big_moe() -> ModelMeta:
    tensors = [TensorEntry("token_embd.weight", "Q4_K", (4096, 151936), 350_000_000, 0)]
    off = 350_000_000
    per_layer = []
    for il in range(N_LAYER):
        size = 0
        for name in PER_LAYER:
            nbytes = 450_000_000 if name.endswith("_exps") else 12_000_000
            tensors.append(
                TensorEntry(f"blk.{il}.{name}.weight", "Q4_K", (4096, 4096), nbytes, off)
            )
            off += nbytes
            size += nbytes
        per_layer.append(size)
    tensors.append(TensorEntry("output_norm.weight", "F32", (4096,), 16384, off))
    tensors.append(TensorEntry("output.weight", "Q6_K", (4096, 151936), 510_000_000, off + 16384))
    return ModelMeta(
        format="gguf",
        architecture="qwen3moe",
        name="bench-moe",
        model_class=ModelClass.LLM,
        quant="Q4_K_M",
        param_count=235_000_000_000,
        weight_bytes=off + 510_016_384,
        context_length=131072,
        n_layer=N_LAYER,
        n_embd=4096,
        n_head=(64,) * N_LAYER,
        n_head_kv=(4,) * N_LAYER,
        head_dim_k=128,
        head_dim_v=128,
        vocab_size=151936,
        n_expert=128,
        n_expert_used=8,
        swa_layers=(False,) * N_LAYER,
        recurrent_layers=(False,) * N_LAYER,
        tensors=tuple(tensors),
        bytes_per_layer=tuple(per_layer),
    )


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of `fn` over `repeat` runs."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def baseline() -> None:
    """A fixed pure-Python workload: sorting 20k pseudo-random ints."""
    sorted((i * 7919) % 20011 for i in range(20_000))


def main() -> int:
    meta = big_moe()
    gpus = gpus_from_sizes([24 * GIB, 24 * GIB])
    budget = Budget(gpus=gpus)
    base_ms = timed(baseline, 50)
    est_ms = timed(lambda: estimate(meta, LaunchSettings(ctx_size=32768), gpus), 200)
    fit_ms = timed(lambda: max_context(meta, LaunchSettings(n_gpu_layers=40), budget), 20)
    off_ms = timed(lambda: offload_for_context(meta, LaunchSettings(ctx_size=32768), budget), 10)
    print(
        f"model: {N_LAYER} layers, {len(meta.tensors)} tensors, "
        f"{meta.weight_bytes / GIB:.0f} GiB of weights, 2 x 24 GiB GPUs"
    )
    print(f"baseline (sort 20k ints):        {base_ms:6.2f} ms")
    ok_est = est_ms < TARGET_ESTIMATE_MS
    ok_fit = max(fit_ms, off_ms) < TARGET_FIT_MS
    print(
        f"one footprint evaluation:        {est_ms:6.3f} ms  ({est_ms / base_ms:.2f}x baseline;"
        f" target < {TARGET_ESTIMATE_MS} ms: {'ok' if ok_est else 'MISSED'})"
    )
    print(f"fit: largest context:            {fit_ms:6.2f} ms  ({fit_ms / base_ms:.2f}x baseline)")
    print(
        f"fit: offload for 32k (MoE -> experts): {off_ms:6.2f} ms  ({off_ms / base_ms:.2f}x "
        f"baseline; target < {TARGET_FIT_MS} ms: {'ok' if ok_fit else 'MISSED'})"
    )
    return 0 if ok_est and ok_fit else 1


if __name__ == "__main__":
    sys.exit(main())
