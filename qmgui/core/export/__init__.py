"""Exports: plans rendered as files other tools run (llama-swap, scripts, llama.cpp presets).

Each exporter is pure: it takes emitted `Command`s (or the plan behind them) and returns an
`Export`, the file's text plus warnings in words. Writing the file is the caller's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgui.core.errors import QmguiError
from qmgui.core.footprint import CPU, Footprint
from qmgui.core.units import format_bytes
from qmgui.core.vllm import VllmPlan


class ExportError(QmguiError):
    """The inputs of an export contradict each other (a group naming a model not exported)."""


@dataclass(frozen=True)
class Export:
    """A rendered file and what the user should know about it."""

    text: str
    warnings: tuple[str, ...] = ()


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`… when taken; the result is added to `taken`."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    taken.add(candidate)
    return candidate


def footprint_comment(fp: Footprint) -> str:
    """One line for a config comment: the planned memory per GPU and in host memory."""
    gpus = [f"{d.name} {format_bytes(d.total)}" for d in fp.devices if d.name != CPU]
    r = fp.settings
    return (
        f"estimated VRAM: {', '.join(gpus) if gpus else 'none (CPU only)'}; host "
        f"{format_bytes(fp.host.total)} (context {r.n_ctx}, {r.n_seq} slots, KV "
        f"{r.cache_type_k}/{r.cache_type_v}, {fp.n_gpu_layers} GPU layers)"
    )


def vllm_comment(plan: VllmPlan) -> str:
    """One line for a config comment: what vLLM takes on each GPU (its share, up front)."""
    n = plan.tensor_parallel * plan.pipeline_parallel
    gpus = f" on each of {n} GPUs" if n > 1 else ""
    return (
        f"estimated VRAM: {format_bytes(plan.charge_bytes)}{gpus} (vLLM, max-model-len "
        f"{plan.max_model_len}, gpu-memory-utilization {plan.gpu_memory_utilization:g})"
    )
