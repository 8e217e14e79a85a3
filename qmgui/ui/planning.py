"""What the window asks the planner, as plain functions the workers run off the GUI thread.

`plan_model` sizes one launch and renders its command the way `qmgui preview` does (the same
resolver and emitters, so the window and the CLI never disagree); `fit_badge` is the per-row
answer of the model table. No Qt here.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, replace

from qmgui.core.bench import BenchResult, settings_key
from qmgui.core.build_rules import rules_for
from qmgui.core.discovery import ModelEntry
from qmgui.core.emit import Command, EmitError, skipped, split_args
from qmgui.core.errors import SizingError
from qmgui.core.fit import (
    DEFAULT_RULES,
    Budget,
    FitResult,
    check,
    max_context,
    nearest_fit,
    noted,
    offload_for_context,
)
from qmgui.core.footprint import EngineRules
from qmgui.core.launch import CTX_PAD, LaunchSettings
from qmgui.core.meta import ModelClass, ModelMeta
from qmgui.core.repack import CpuTarget, target_from_capabilities
from qmgui.core.shell import quote_bash, quote_powershell
from qmgui.core.textsafe import redact_argv, redact_env
from qmgui.core.units import MIB
from qmgui.core.vllm import VllmPins, VllmPlan, plan_vllm
from qmgui.engines.bench import BenchStore
from qmgui.engines.model_ports import choose_port
from qmgui.hw.host import cpu_target
from qmgui.service.disk import disk_advice
from qmgui.service.launch import (
    Request,
    Resolver,
    Target,
    UsageError,
    emit_model,
    missing_engine,
)
from qmgui.service.projector import projector_meta
from qmgui.ui.hardware import Hardware
from qmgui.ui.occupancy import gpu_index

# the context a fit badge is judged at: the trained one, capped where most chats live (a 1M
# trained context would mark every model "does not fit")
BADGE_CONTEXT = 8192
# model classes llama-server serves and the planner sizes
PLANNED_CLASSES = frozenset({ModelClass.LLM, ModelClass.EMBEDDING, ModelClass.RERANK})


class Badge(enum.Enum):
    FITS = "fits"
    PARTIAL = "partial offload"
    NO_FIT = "does not fit"
    NOT_PLANNED = "—"


@dataclass(frozen=True)
class BadgeResult:
    badge: Badge
    detail: str  # the tooltip: the context judged at, or why it does not fit


# an engine build's GPU variant (probed from its devices, or set by the user) -> the allocation
# rules `core.footprint` applies (ROCm builds allocate as CUDA's do)
_RULES_OF_VARIANT = {
    "cuda": "cuda",
    "rocm": "cuda",
    "hip": "cuda",
    "vulkan": "vulkan",
    "metal": "metal",
}


def for_variant(hw: Hardware, variant: str | None) -> Hardware:
    """`hw` with its GPUs sized by the rules of the engine build that will run on them (a
    Vulkan build on an NVIDIA card allocates as Vulkan does, with Vulkan's context charge);
    unknown or mixed variants keep the cards' own rules."""
    rules = _RULES_OF_VARIANT.get((variant or "").strip().lower())
    if rules is None or not hw.gpus or all(g.backend == rules for g in hw.gpus):
        return hw
    return replace(hw, gpus=tuple(replace(g, backend=rules) for g in hw.gpus))


def on_gpus(hw: Hardware, subset: tuple[int, ...]) -> Hardware:
    """`hw` with only the GPUs at positions `subset` (the plan panel's "Run on"); `hw` itself
    when the subset is empty or names every GPU."""
    if not subset or len(subset) >= len(hw.gpus):
        return hw
    return replace(hw, gpus=tuple(hw.gpus[i] for i in subset))


def _engine_cpu(
    resolver: Resolver, target: Target | str | None, build: int | None
) -> CpuTarget | None:
    """The registered build's probed CPU features, else this machine's (hw.host)."""
    if target is not None and not isinstance(target, str) and target.backend_id:
        for b in resolver.backends:
            if b.id == target.backend_id:
                found = target_from_capabilities(b.capabilities, build)
                if found is not None:
                    return found
    return cpu_target(build)


def budget_for(hw: Hardware, reserve_mib: int) -> Budget:
    return Budget(gpus=hw.gpus, gpu_reserve=reserve_mib * MIB, host_bytes=hw.host_bytes)


def plannable(entry: ModelEntry) -> bool:
    m = entry.meta
    return (
        m is not None and entry.error is None and entry.format == "gguf"
        and m.model_class in PLANNED_CLASSES
    )  # fmt: skip


def badge_context(entry: ModelEntry) -> int:
    trained = (entry.meta.context_length if entry.meta else None) or 4096
    return max(CTX_PAD, min(trained, BADGE_CONTEXT) // CTX_PAD * CTX_PAD)


def fit_badge(
    entry: ModelEntry, hw: Hardware, reserve_mib: int, *, rules: EngineRules = DEFAULT_RULES
) -> BadgeResult:
    """Fits with every layer on the GPU(s), fits with some layers on the CPU, or not at all, at
    `badge_context` tokens with the engine's default settings (`rules`: its build's)."""
    if entry.format == "hf" and entry.meta is not None and entry.error is None:
        return _vllm_badge(entry, hw, reserve_mib)
    if not plannable(entry):
        why = entry.error or "qmgui sizes llama-server launches of GGUF language models"
        return BadgeResult(Badge.NOT_PLANNED, why)
    assert entry.meta is not None
    ctx = badge_context(entry)
    settings = LaunchSettings(ctx_size=ctx)
    budget = replace(budget_for(hw, reserve_mib), rules=rules)
    proj = projector_meta(entry)  # loaded beside the model: its weights and compute count
    try:
        result = check(entry.meta, settings, budget, mmproj=proj)
        if result.fits:
            where = "the GPU" if len(hw.gpus) == 1 else "the GPUs" if hw.gpus else "host memory"
            return BadgeResult(Badge.FITS, f"{ctx} tokens fit in {where} ({hw.summary})")
        offload = offload_for_context(entry.meta, settings, budget, mmproj=proj)
    except SizingError as e:
        return BadgeResult(Badge.NOT_PLANNED, str(e))
    if offload.fits and offload.nearest is not None:
        ngl = offload.nearest.n_gpu_layers
        moe = offload.nearest.n_cpu_moe
        how = f"--n-cpu-moe {moe}" if moe else f"{ngl} of {entry.meta.n_layer + 1} layers on GPU"
        return BadgeResult(Badge.PARTIAL, f"{ctx} tokens fit with {how} ({hw.summary})")
    return BadgeResult(Badge.NO_FIT, f"{ctx} tokens: {result.reason}")


def _vllm_badge(entry: ModelEntry, hw: Hardware, reserve_mib: int) -> BadgeResult:
    """A Hugging Face folder, as vLLM would serve it: on one GPU of `hw` (the first), at
    `badge_context` tokens, with vLLM's memory share sized to fit."""
    assert entry.meta is not None
    if not hw.gpus:
        return BadgeResult(Badge.NOT_PLANNED, "vLLM needs a GPU; none is planned for")
    gpu = hw.gpus[0]
    ctx = badge_context(entry)
    try:
        plan = plan_vllm(
            entry.meta,
            gpu_total_bytes=gpu.total_bytes,
            budget_bytes=max(gpu.available - reserve_mib * MIB, 1),
            pins=VllmPins(max_model_len=ctx),
        )
    except SizingError as e:
        return BadgeResult(Badge.NOT_PLANNED, str(e))
    if plan.skipped:
        return BadgeResult(Badge.NOT_PLANNED, plan.reason or "vLLM cannot serve it")
    if plan.fits:
        return BadgeResult(Badge.FITS, f"vLLM: {ctx} tokens fit on {gpu.name} ({hw.summary})")
    return BadgeResult(Badge.NO_FIT, f"vLLM, {ctx} tokens: {plan.reason}")


@dataclass(frozen=True)
class PlanOutcome:
    """One planned launch: what it costs (None for models the planner does not size), why
    not, and the command that runs it."""

    entry: ModelEntry
    settings: LaunchSettings
    hardware: Hardware
    fit: FitResult | None
    error: str | None
    command: Command
    bash: str
    powershell: str
    engine: str  # which engine and why ("no backends registered: llama-server")
    # what the preview shows: the command with secrets (--api-key values, *_TOKEN variables)
    # as <redacted>, for screenshots and screen shares; Copy takes `bash`/`powershell`
    shown_bash: str = ""
    shown_powershell: str = ""
    vllm: VllmPlan | None = None  # a vLLM launch's plan (its bars and verdict)
    vllm_gpus: tuple[str, ...] = ()  # the GPUs that plan occupies (one per tensor-parallel rank)
    missing: str | None = None  # the engine is not installed: what to install (Start says it)
    # the latest `qmgui bench` result of this model here, and whether it measured this command
    measured: tuple[BenchResult, bool] | None = None
    disk_note: str = ""  # how the weights are read when the model is on a network disk
    mmproj: ModelMeta | None = None  # the projector loaded beside it, charged in `fit`


def plan_model(
    entry: ModelEntry,
    settings: LaunchSettings,
    hw: Hardware,
    reserve_mib: int,
    resolver: Resolver,
    *,
    extra_args: str = "",
    gpu_subset: tuple[int, ...] = (),
    given: frozenset[str] = frozenset(),
) -> PlanOutcome:
    """Size one launch (llama-server GGUF models) and emit its command (any engine).

    `extra_args`: the plan panel's extra engine arguments, split like a shell does and
    appended after the model's stored ones; one that does not split gives no command, with
    the reason shown instead. `gpu_subset`: positions in `hw.gpus` of the only GPUs the engine
    may use (`--device`); () = all. The outcome keeps every GPU (the others plan nothing).
    `given`: the profile fields `settings` already hold (the window's panel shows the model's
    profile), which the saved profile then does not fill again."""
    target: Target | str | None = None
    try:
        target = resolver.target(entry)
    except (EmitError, SizingError, UsageError, ValueError):
        target = None  # said again below, where the command is built
    if target is not None and not isinstance(target, str):
        hw = for_variant(hw, target.variant)
    sized = on_gpus(hw, gpu_subset)
    devices: tuple[int, ...] = ()
    if sized is not hw:
        # as the engine numbers them: this machine's NVML index, else the card's position
        indices = [gpu_index(g.name) for g in sized.gpus]
        devices = tuple(i if n is None else n for i, n in zip(gpu_subset, indices, strict=True))
    # sized by the rules of the build that will run it (its probed --version)
    build = target.build if target is not None and not isinstance(target, str) else None
    rules, rules_note = rules_for(build)
    # weight repacking follows the CPU features the build's probe printed (system_info), else
    # this machine's CPU flags; a what-if machine's are not known (bound)
    rules = replace(rules, cpu=None if hw.what_if else _engine_cpu(resolver, target, rules.build))
    budget = replace(budget_for(sized, reserve_mib), rules=rules)
    fit: FitResult | None = None
    error: str | None = None
    sized_settings, disk = disk_advice(entry, settings, given)  # a network disk: --no-mmap
    proj = projector_meta(entry) if plannable(entry) else None  # loaded beside it: charged
    if plannable(entry):
        assert entry.meta is not None
        try:
            fit = check(entry.meta, sized_settings, budget, mmproj=proj)
            fit = noted(fit, disk.note, disk.warning)
            fit = noted(fit, rules_note)
            if not fit.fits:
                near = nearest_fit(entry.meta, sized_settings, budget, mmproj=proj)
                fit = replace(fit, nearest=near)
        except SizingError as e:
            error = str(e)
    else:
        error = entry.error or "qmgui sizes llama-server launches of GGUF language models only"
    # the disk rule is applied above (one look at the mount table per plan): "mmap" is given
    req = Request(settings=sized_settings, gpus=sized.gpus, reserve=reserve_mib * MIB,
                  port=choose_port(resolver.loaded.settings, entry.id),
                  extra=(), devices=devices, given=given | {"mmap"})  # fmt: skip
    command, engine, vllm, missing = _emit(entry, target, req, resolver, extra_args)
    if vllm is not None and vllm.breakdown is not None and not vllm.skipped:
        error = None  # sized: by vLLM's rules (core.vllm), not llama.cpp's
    if missing is not None and command.runnable:
        command = replace(command, warnings=(missing, *command.warnings))
    bash = quote_bash(command.argv, command.env) if command.runnable else ""
    ps = quote_powershell(command.argv, command.env) if command.runnable else ""
    shown_bash, shown_ps = bash, ps
    argv, env = redact_argv(command.argv), redact_env(command.env)
    if command.runnable and (argv, env) != (tuple(command.argv), dict(command.env)):
        shown_bash, shown_ps = quote_bash(argv, env), quote_powershell(argv, env)
    vllm_gpus = tuple(g.name for g in sized.gpus[: vllm.tensor_parallel]) if vllm else ()
    return PlanOutcome(
        entry, sized_settings, hw, fit, error, command, bash, ps, engine, shown_bash, shown_ps,
        vllm, vllm_gpus, missing, last_measured(entry, command), disk.note, proj,
    )  # fmt: skip


def last_measured(entry: ModelEntry, command: Command) -> tuple[BenchResult, bool] | None:
    """The latest `qmgui bench` result of `entry` on this machine (a small file's read), and
    whether it measured `command`'s settings; None when there is none or it cannot be read."""
    if not command.runnable:
        return None
    try:
        return BenchStore().latest(entry.id, settings_key(command.argv))
    except OSError:
        return None


def _emit(
    entry: ModelEntry,
    target: Target | str | None,
    req: Request,
    resolver: Resolver,
    extra_args: str,
) -> tuple[Command, str, VllmPlan | None, str | None]:
    """The command on `target` (the plan panel's extra arguments appended), the engine line,
    a vLLM launch's plan, and what to install when the engine is missing."""
    engine = ""
    try:
        target = resolver.target(entry) if target is None else target
        if isinstance(target, str):
            return skipped(target), "", None, None
        name = os.path.basename(target.executable) or target.executable
        engine = f"{name} ({target.kind}): {target.reason}"
        req = replace(req, extra=tuple(split_args(extra_args)))
        emitted = emit_model(entry, target, req, resolver.override(entry))
        return emitted.command, engine, emitted.vllm, missing_engine(target)
    except (EmitError, SizingError, UsageError, ValueError) as e:
        return skipped(str(e)), engine, None, None


def fit_context(
    entry: ModelEntry,
    settings: LaunchSettings,
    hw: Hardware,
    reserve_mib: int,
    *,
    gpu_subset: tuple[int, ...] = (),
) -> FitResult | None:
    """The largest context that fits with the other settings kept (the "Fit context" button),
    on the GPUs `gpu_subset` chooses (as `plan_model`)."""
    if not plannable(entry):
        return None
    assert entry.meta is not None
    budget = budget_for(on_gpus(hw, gpu_subset), reserve_mib)
    return max_context(entry.meta, settings, budget, mmproj=projector_meta(entry))
