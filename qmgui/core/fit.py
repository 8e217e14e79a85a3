"""Fit: the settings that fit a budget, answered with the footprint model.

Every question users ask maps to one search over `estimate()`: the largest context, the offload
(`-ngl`, `--n-cpu-moe`) that reaches a target context, the slot count, the KV cache type
trade-off. "Does not fit" is a result with the reason and the nearest setting that fits, never
an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from qmgui.core.compute import prompt_only, searching
from qmgui.core.errors import SizingError
from qmgui.core.footprint import CPU, DeviceFootprint, EngineRules, Footprint, Gpu, estimate
from qmgui.core.gcpause import while_paused
from qmgui.core.launch import CTX_PAD, LaunchSettings
from qmgui.core.meta import ModelMeta
from qmgui.core.units import MIB, format_bytes

# Per-GPU headroom left unplanned. The backend's context is in the plan now (each card's
# `other`, footprint.CONTEXT_BYTES: 528 MiB for CUDA, measured bare on an H200), so this holds
# what no load-time plan sees: CUDA's pool and cuBLAS workspaces growing with the first large
# batches, fragmentation, a desktop's display growing. Kept at 512 MiB (docs/sizing.md, Fit):
# before the context was charged, a big card's CUDA context alone ate all of it, run-time
# growth is unmeasured, and llama.cpp's own --fit keeps 1024 MiB free beyond its context.
DEFAULT_GPU_RESERVE = 512 * MIB
MIN_CONTEXT = CTX_PAD  # the smallest context llama-server pads to
DEFAULT_RULES = EngineRules()  # frozen: one shared default
KV_TYPE_LADDER = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"))


@dataclass(frozen=True)
class Budget:
    """What a plan may use: per GPU (their available memory minus a reserve) and host RAM."""

    gpus: tuple[Gpu, ...] = ()
    gpu_reserve: int = DEFAULT_GPU_RESERVE
    host_bytes: int | None = None  # None = host memory is not checked
    rules: EngineRules = DEFAULT_RULES  # the build's allocation rules (core.build_rules)

    def limit(self, device: str) -> int | None:
        if device == CPU:
            return self.host_bytes
        for g in self.gpus:
            if g.name == device:
                return max(g.available - self.gpu_reserve, 0)
        return None


@dataclass(frozen=True)
class FitResult:
    fits: bool
    settings: LaunchSettings
    footprint: Footprint
    reason: str | None = None  # why it does not fit (the first device over its limit)
    nearest: LaunchSettings | None = None  # the closest setting that fits, when one exists
    warnings: tuple[str, ...] = ()  # it fits, but the user should know (mapped weights over RAM)
    # the verdict rests on a buffer charged as an upper bound (Footprint.bounds) on a device
    # whose limit was checked: "fits (bound)"
    bounded: bool = False

    @property
    def verdict(self) -> str:
        """ "fits", "fits (bound)" or "does not fit" (the reason is apart)."""
        if not self.fits:
            return "does not fit"
        return "fits (bound)" if self.bounded else "fits"


def charged(d: DeviceFootprint, settings: LaunchSettings) -> int:
    """What a device's limit is checked against. On the host, weights of a memory-mapped file
    are page cache the kernel can drop and read again (llama.cpp maps the file; pages it does
    not touch are never read), so they are not charged: only what the engine allocates
    (KV cache, recurrent state, compute and output buffers, and weights read without mmap)
    must fit in RAM. Mapped weights over RAM are a warning (see `check`), not a refusal."""
    if d.name == CPU and settings.mmap:
        return d.total - d.weights
    return d.total


def check(
    meta: ModelMeta,
    settings: LaunchSettings,
    budget: Budget,
    *,
    mmproj: ModelMeta | None = None,
    mmproj_offload: bool = True,
) -> FitResult:
    """Plan one launch and say whether it fits, and if not, which device is over by how much.
    `mmproj`: the vision projector loaded beside the model (its weights and compute buffer)."""
    fp = estimate(
        meta,
        settings,
        budget.gpus,
        rules=budget.rules,
        mmproj=mmproj,
        mmproj_offload=mmproj_offload,
    )
    bounded = any(budget.limit(b.device) is not None for b in fp.bounds)
    for d in fp.devices:
        limit = budget.limit(d.name)
        need = charged(d, settings)
        if limit is not None and need > limit:
            where = "host memory" if d.name == CPU else d.name
            what = " resident" if need != d.total else ""
            bound = fp.bounded(d.name)
            upper = (
                f" (of which {format_bytes(bound)} is an upper bound, not an estimate)"
                if bound
                else ""
            )
            return FitResult(
                False,
                settings,
                fp,
                reason=(
                    f"needs {format_bytes(need)}{what} on {where}, "
                    f"{format_bytes(need - limit)} more than the {format_bytes(limit)} "
                    f"available{upper}"
                ),
                bounded=bool(bound),
            )
    warnings: tuple[str, ...] = ()
    host = budget.limit(CPU)
    cpu = next((d for d in fp.devices if d.name == CPU), None)
    if host is not None and cpu is not None and cpu.total > host:
        warnings = (
            f"host memory: {format_bytes(cpu.total - cpu.weights)} resident + "
            f"{format_bytes(cpu.weights)} mapped is more than the {format_bytes(host)} of RAM; "
            "the mapped weights will be read from disk as they are used (slow)",
        )
    return FitResult(
        True,
        settings,
        fp,
        warnings=(*warnings, *context_warnings(meta, fp), *split_warnings(meta, fp, budget)),
        bounded=bounded,
    )


def noted(result: FitResult, note: str = "", warning: str = "") -> FitResult:
    """`result` with a note on its plan (which rule applied, and why) and a warning, each
    when given: the disk rule, another build's rules."""
    if note:
        fp = result.footprint
        result = replace(result, footprint=replace(fp, notes=(*fp.notes, note)))
    if warning:
        result = replace(result, warnings=(*result.warnings, warning))
    return result


def context_warnings(meta: ModelMeta, fp: Footprint) -> tuple[str, ...]:
    """A context per slot beyond the trained one: the engine allocates it (as planned) and
    warns of a possible training context overflow; say the same, with what it means."""
    trained, per_slot = meta.context_length, fp.settings.n_ctx_seq
    if not trained or per_slot <= trained:
        return ()
    return (
        f"{per_slot:,} tokens per slot is beyond the {trained:,} the model was trained on: "
        "llama-server allocates it as planned and warns of a possible training context "
        "overflow; without RoPE scaling (--rope-scaling, --rope-scale) answers degrade past "
        f"{trained:,} tokens",
    )


def split_warnings(meta: ModelMeta, fp: Footprint, budget: Budget) -> tuple[str, ...]:
    """A split over cards that NVLink does not join (as the readings say; what-if cards say
    nothing): each boundary between them moves every token's activations over PCIe."""
    used = [g for g in budget.gpus if any(d.name == g.name and d.weights for d in fp.devices)]
    out = []
    for a, b in pairwise(used):
        if a.nvlink is None or b.nvlink is None or b.name in a.nvlink:
            continue
        r = fp.settings
        token = meta.n_embd * 4  # one f32 activation row crosses each boundary per token
        out.append(
            f"split over {a.name} and {b.name}, which NVLink does not join: every token's "
            f"activations cross PCIe between them ({format_bytes(token)} a token, "
            f"{format_bytes(token * r.n_ubatch)} for a {r.n_ubatch}-token batch); prompt "
            "processing and generation are slower than on one card or NVLinked cards, and "
            "-sm row would move far more"
        )
    return tuple(out)


def _fits(
    meta: ModelMeta,
    settings: LaunchSettings,
    budget: Budget,
    mmproj: ModelMeta | None = None,
    *,
    new_offload: bool = False,
) -> bool:
    """`check(...).fits`, with the compute buffers (the expensive part of an estimate) only
    where everything else fits: compute buffers are never negative, so a launch already over
    a limit without them is over it with them. The searches below ask this of every
    candidate; most of those far from the answer are settled without a compute buffer.
    `new_offload`: a candidate whose layers sit where no earlier candidate's did (a new
    structure for the scheduler, compiled per reserve graph): the prompt graph's buffers are
    sized first, a lower bound (compute.prompt_only), and a launch over a limit by then is
    settled without the token-generation graph."""
    if not _within_without_compute(meta, settings, budget, mmproj):
        return False
    if new_offload:
        with prompt_only():
            lower = estimate(meta, settings, budget.gpus, rules=budget.rules, mmproj=mmproj)
        if not _within(lower, settings, budget, {}):
            return False
    return check(meta, settings, budget, mmproj=mmproj).fits


def _within_without_compute(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, mmproj: ModelMeta | None
) -> bool:
    """Whether the launch is within every limit before its compute buffers are counted (if
    not, it does not fit: they are never negative)."""
    cheap = estimate(meta, settings, budget.gpus, compute=False, rules=budget.rules, mmproj=mmproj)
    return _within(cheap, settings, budget, {})


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest x in [lo, hi] with ok(x), for ok monotone (true then false)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@while_paused
def max_context(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, *, mmproj: ModelMeta | None = None
) -> FitResult:
    """The largest context (a multiple of 256, at most the trained one) that fits.

    The compute buffer is the expensive part of an estimate (a replay of the engine's
    allocator), so the search runs in two steps: a binary search on the cheap part plus the
    compute buffers measured once at the top of the range, then full estimates that walk from
    that candidate to the exact answer (compute buffers change little from one 256-cell step
    to the next, so this takes a few full estimates instead of one per bisection step).
    The estimates of the context search share their graph structures, so each structure's
    walk is compiled at its first ask (core.compute.searching); a launch over a limit at the
    smallest context asks its structure once, and is walked plainly."""
    trained = meta.context_length or 4096
    top = max(trained // CTX_PAD, 1)

    def at(k: int) -> LaunchSettings:
        return replace(settings, ctx_size=k * CTX_PAD)

    def fits_at(k: int) -> bool:
        return _fits(meta, at(k), budget, mmproj)

    extra: dict[str, int] = {}

    def cheap_fits(k: int) -> bool:
        fp = estimate(meta, at(k), budget.gpus, compute=False, rules=budget.rules, mmproj=mmproj)
        return _within(fp, at(k), budget, extra)

    if not cheap_fits(1):  # over a limit without any compute buffer: no context fits
        best: int | None = None
    else:
        with searching():
            high = estimate(meta, at(top), budget.gpus, rules=budget.rules, mmproj=mmproj)
            extra.update((d.name, d.compute) for d in high.devices)
            best = _context_from_guess(largest(1, top, cheap_fits) or 1, top, fits_at)
    if best is None:
        smallest = check(meta, at(1), budget, mmproj=mmproj)
        nearest = _nearest_offload(meta, at(1), budget, mmproj)
        return replace(
            smallest,
            reason=f"even {MIN_CONTEXT} tokens do not fit: {smallest.reason}",
            nearest=nearest,
        )
    return check(meta, at(best), budget, mmproj=mmproj)


def _context_from_guess(guess: int, top: int, fits_at: Callable[[int], bool]) -> int | None:
    """The largest k in [1, top] with fits_at(k), galloping from `guess` (fits_at monotone)."""
    if not fits_at(guess):
        return largest(1, guess - 1, fits_at)
    best, step = guess, 1
    while best + step <= top and fits_at(best + step):
        best += step
        step *= 2
    return largest(best, min(best + step, top), fits_at) if best < top else best


def _within(fp: Footprint, settings: LaunchSettings, budget: Budget, extra: dict[str, int]) -> bool:
    for d in fp.devices:
        limit = budget.limit(d.name)
        if limit is not None and charged(d, settings) + extra.get(d.name, 0) > limit:
            return False
    return True


@while_paused
def offload_for_context(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, *, mmproj: ModelMeta | None = None
) -> FitResult:
    """The most GPU layers (`-ngl`) and, for MoE models, the fewest `--n-cpu-moe` layers that
    fit the requested context. The launch as asked is sized without its compute buffers
    first: when that is over a limit already, the answer is another offload's plan,
    and the asked one's compute buffers are sized only if no offload fits (for its reason)."""
    full: FitResult | None = None
    if not budget.gpus or _within_without_compute(meta, settings, budget, mmproj):
        full = check(meta, settings, budget, mmproj=mmproj)
        if full.fits or not budget.gpus:
            return full if full.fits else replace(full, nearest=None)
    nearest = _nearest_offload(meta, settings, budget, mmproj)
    if nearest is None:
        full = full or check(meta, settings, budget, mmproj=mmproj)
        return replace(full, reason=f"{full.reason}, even with every layer on the CPU")
    fitted = check(meta, nearest, budget, mmproj=mmproj)
    return replace(fitted, nearest=nearest)


def _largest_sized(
    meta: ModelMeta, budget: Budget, mmproj: ModelMeta | None,
    cand: Callable[[int], LaunchSettings], *, lo: int, hi: int,
) -> int | None:  # fmt: skip
    """`largest(lo, hi, n -> cand(n) fits)` in a few full estimates, as max_context searches:
    each candidate is a new offload, whose compute buffers cost a compile of the scheduler's
    walk at first, so the bisection runs on the cheap part plus the compute buffers of
    `cand(hi)` (measured once, over the prompt graph: the guess needs no more), and full
    checks gallop from that guess, up or down, to the answer (the fits' own answer,
    whatever the guess)."""
    known: dict[int, bool] = {}

    def ok(n: int) -> bool:
        if n not in known:
            known[n] = _fits(meta, cand(n), budget, mmproj, new_offload=True)
        return known[n]

    extra: dict[str, int] = {}

    def cheap_ok(n: int) -> bool:
        s = cand(n)
        fp = estimate(meta, s, budget.gpus, compute=False, rules=budget.rules, mmproj=mmproj)
        return _within(fp, s, budget, extra)

    if not cheap_ok(lo):  # over a limit without any compute buffer: nothing fits
        return None
    with prompt_only():  # a guess: the prompt graph's buffers (the larger, as a rule) do
        top = estimate(meta, cand(hi), budget.gpus, rules=budget.rules, mmproj=mmproj)
    extra.update((d.name, d.compute) for d in top.devices)
    guess = largest(lo, hi, cheap_ok)
    x, step = (lo if guess is None else guess), 1
    if ok(x):  # the answer is x or above: up until a candidate fails
        while x + step <= hi and ok(x + step):
            x += step
            step *= 2
        return largest(x, min(x + step, hi), ok)
    while x - step >= lo and not ok(x - step):  # below x: down until one fits
        x -= step
        step *= 2
    return largest(max(x - step, lo), x - 1, ok)


def _nearest_offload(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, mmproj: ModelMeta | None = None
) -> LaunchSettings | None:
    if not budget.gpus:
        return None
    n_total = meta.n_layer + 1
    if meta.is_moe:
        # keep every layer on the GPU and move experts of the first N layers to the CPU
        def moe(n: int) -> LaunchSettings:
            return replace(settings, n_gpu_layers=n_total, n_cpu_moe=meta.n_layer - n)

        kept = _largest_sized(meta, budget, mmproj, moe, lo=0, hi=meta.n_layer)
        if kept is not None:
            return replace(settings, n_gpu_layers=n_total, n_cpu_moe=meta.n_layer - kept)

    def ngl_ok(n: int) -> bool:
        return _fits(meta, replace(settings, n_gpu_layers=n), budget, mmproj, new_offload=True)

    ngl = largest(0, n_total, ngl_ok)
    return None if ngl is None else replace(settings, n_gpu_layers=ngl)


@while_paused
def nearest_fit(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, *, mmproj: ModelMeta | None = None
) -> LaunchSettings | None:
    """The settings closest to `settings` that fit (the window's "Nearest fit", `qmgui plan`'s
    nearest line): fewer layers on the GPU (or MoE experts on the CPU) for this context, else
    the largest context with these layers; None when nothing does."""
    offload = offload_for_context(meta, settings, budget, mmproj=mmproj)
    if offload.fits and offload.nearest is not None:
        return offload.nearest
    shorter = max_context(meta, settings, budget, mmproj=mmproj)
    if shorter.fits:
        return shorter.settings
    return shorter.nearest


@while_paused
def max_slots(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget, *, ctx_per_slot: int, most: int = 64
) -> FitResult:
    """The most slots (`-np`, separate KV streams) of `ctx_per_slot` tokens each that fit."""

    def cand(n: int) -> LaunchSettings:
        return replace(settings, parallel=n, kv_unified=False, ctx_size=ctx_per_slot * n)

    best = largest(1, most, lambda n: _fits(meta, cand(n), budget))
    if best is None:
        one = check(meta, cand(1), budget)
        return replace(one, reason=f"not even one slot of {ctx_per_slot} tokens fits: {one.reason}")
    return check(meta, cand(best), budget)


@dataclass(frozen=True)
class KvOption:
    cache_type_k: str
    cache_type_v: str
    max_context: int | None  # None = does not fit at all, or the engine refuses the types
    kv_bytes_at_max: int
    refused: str | None = None  # why the engine would not load these types for this model


@while_paused
def kv_type_tradeoff(
    meta: ModelMeta, settings: LaunchSettings, budget: Budget
) -> tuple[KvOption, ...]:
    """The largest context for each KV cache type (quantized V turns flash attention on)."""
    out = []
    for k, v in KV_TYPE_LADDER:
        s = replace(
            settings,
            cache_type_k=k,
            cache_type_v=v,
            flash_attn="on" if v != "f16" else settings.flash_attn,
        )
        try:
            r = max_context(meta, s, budget)
        except SizingError as e:  # the engine would refuse these types for this model
            out.append(KvOption(k, v, None, 0, refused=str(e)))
            continue
        kv = sum(d.kv for d in r.footprint.devices)
        out.append(KvOption(k, v, r.footprint.settings.n_ctx if r.fits else None, kv))
    return tuple(out)


def gpus_from_sizes(sizes: Sequence[int]) -> tuple[Gpu, ...]:
    """What-if GPUs: `--gpu 24GiB --gpu 12GiB` -> GPU0, GPU1, all memory free."""
    return tuple(Gpu(name=f"GPU{i}", total_bytes=n) for i, n in enumerate(sizes))
