"""vLLM launch sizing: the context, the share of the card and the KV pool, chosen before launch.

vLLM takes everything up front: the weights, a KV pool (sized from `--gpu-memory-utilization`,
or pinned with `--kv-cache-memory-bytes`), activations and CUDA graphs. It refuses to start
when the pool cannot hold one `--max-model-len` sequence, and when the card has less free
memory than `utilization × total`. `plan_vllm()` therefore derives every memory flag from the
model's header and the budget and returns a frozen `VllmPlan`: the flags as a list, a breakdown
naming the source of each number, and "does not fit" or "skipped" as data with a reason.

The rules are the product's reference design (shared/reference/001_*, "vllm": budget-derived
max-model-len, utilization rounded up and clamped, the KV pool pinned with a margin, what a
router charges, a tool-call parser per family, split GGUF skipped, Hugging Face folders
preferred). The KV arithmetic is vLLM's own: KV heads per tensor-parallel rank, one latent per
token for MLA, nothing for linear/recurrent layers, a fixed state per sequence for them.
All numbers are per GPU: under tensor parallelism each of the N cards holds one such share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from qmgui.core.errors import SizingError
from qmgui.core.meta import ModelClass, ModelMeta
from qmgui.core.units import GIB, format_bytes

# --- flags (vLLM `vllm serve --help`) ----------------------------------------------------------
FLAG_MAX_MODEL_LEN = "--max-model-len"
FLAG_GPU_UTIL = "--gpu-memory-utilization"
FLAG_KV_CACHE_BYTES = "--kv-cache-memory-bytes"
FLAG_TENSOR_PARALLEL = "--tensor-parallel-size"
FLAG_PIPELINE_PARALLEL = "--pipeline-parallel-size"
FLAG_QUANTIZATION = "--quantization"
FLAG_DTYPE = "--dtype"
FLAG_KV_CACHE_DTYPE = "--kv-cache-dtype"
FLAG_TOKENIZER = "--tokenizer"
FLAG_AUTO_TOOL_CHOICE = "--enable-auto-tool-choice"
FLAG_TOOL_CALL_PARSER = "--tool-call-parser"
# flags in a user's extra arguments that mean "I size vLLM's memory myself" (reference:
# hand-written memory flags predate the derived ones, and theirs stand)
_MEMORY_FLAGS = (FLAG_GPU_UTIL, "--kv-cache-memory")

# --- constants, each with its source ------------------------------------------------------------
# Reference 001 ("vllm", vllmOverheadGB): a flat 1.5 GiB reserve per GPU for activations, CUDA
# graphs and the profiling run's peak. vLLM's allocator is opaque before launch, so this is a
# reserve, not a model of it.
OVERHEAD_BYTES = 3 * GIB // 2
# Reference 001 (vllmDefaultGpuUtil): the utilization used when no card reading exists, since
# there is no total to take a fraction of. It is also vLLM's own default for the flag.
DEFAULT_GPU_UTIL_PCT = 90
# Reference 001 (vllmMinGpuUtil / vllmMaxGpuUtil): the floor keeps a tiny budget on a big card
# from granting less than the weights need; the ceiling leaves the display and compositor room,
# because vLLM measures the fraction against the TOTAL card and refuses to start when that much
# is not free.
MIN_GPU_UTIL_PCT = 10
MAX_GPU_UTIL_PCT = 95
# Reference 001: utilization is rounded UP to the 2 decimals it is printed with (steps of 1%);
# rounding to nearest can land under the footprint and a model sized to fit then refuses to
# start for lack of KV blocks. We keep it as an integer percentage so the rounding is exact.
GPU_UTIL_STEPS_PER_UNIT = 100
# Reference 000 (RoundedCtx): a derived context is rounded down to a multiple of 4096 (clean
# cache and rope boundaries), and 4096 is the smallest window worth serving: below it the model
# "does not fit" (the reference emits the floor with a note; we return fits=False).
CTX_ROUND = 4096
MIN_MAX_MODEL_LEN = 4096
# Reference 000 (vllmFallbackCtx): the window when the KV cost cannot be computed (attention dims
# missing) or nothing bounds it. Better a conservative window than the full trained context,
# which vLLM would otherwise try to hold in KV at start-up.
FALLBACK_MAX_MODEL_LEN = 32768
# Reference 001 (vllmKvMarginFrac / vllmKvMarginGB): the pinned pool is the predicted KV × 1.10
# + 0.25 GiB, because vLLM's paged layout (16-token blocks, per-group page sizes on hybrid
# models) does not match a linear per-token cost byte for byte, and a pool one block short
# means vLLM refuses to start.
KV_MARGIN_NUM, KV_MARGIN_DEN = 11, 10
KV_MARGIN_BYTES = GIB // 4
# Reference 000 (GetKvCostModel) and llama.cpp: recurrent / mamba state is charged as f32. vLLM's
# default mamba cache dtype follows the model (16-bit), so 4 bytes never under-counts.
STATE_BYTES_PER_ELEM = 4
# vLLM `--dtype` (its docs): "auto" runs BF16 checkpoints in BF16 and FP16/FP32 ones in FP16, so
# activations and an "auto" KV cache are 2 bytes per element unless FP32 is pinned.
MODEL_DTYPE_BYTES: dict[str, int] = {
    "auto": 2,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "float": 4,
    "float32": 4,
}
# vLLM `--kv-cache-dtype` choices (vllm/config/cache.py CacheDType); "auto" = the model dtype.
KV_CACHE_DTYPE_BYTES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "int8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
}
# vLLM's FlashMLA sparse cache ("fp8_ds_mla"): per token and layer 512 fp8 latent bytes, four
# fp32 scales and the 64-dim rope part kept in bf16 = 512 + 16 + 128 bytes (vLLM source).
FP8_DS_MLA_TOKEN_BYTES = 656

# Reference 001 (vllmToolParsers): vLLM answers every request carrying `tools` with a 400 unless
# it was started with `--enable-auto-tool-choice --tool-call-parser X`, and X is the family's
# tool-call format. The table is short on purpose: a WRONG parser fails silently (tool calls
# stay as text in the reply), which is worse than the 400. Keys are architecture names folded
# by `_arch_key` so the HF class name, HF model_type and GGUF spelling meet in one row.
TOOL_CALL_PARSERS: dict[str, str] = {
    "qwen2": "hermes",
    "qwen2moe": "hermes",
    "qwen3": "hermes",
    "qwen3moe": "hermes",
    "qwen3next": "hermes",
    "qwen35": "qwen3_coder",  # Qwen3.5 switched to the XML format Qwen3-Coder introduced
    "qwen35moe": "qwen3_coder",
    "llama": "llama3_json",
    "mistral": "mistral",
    "mistral3": "mistral",
    "gemma4": "gemma4",
    "glm4moe": "glm45",
    "deepseekv3": "deepseek_v3",
    "granite": "granite",
    "granitemoe": "granite",
    "minimaxm2": "minimax_m2",
    "olmo3": "olmo3",
}
# Qwen3 coder fine-tunes share the chat models' architecture but emit the XML format; the
# model's name breaks the tie (reference 001).
QWEN3_CODER_PARSER = "qwen3_coder"
PARSER_OFF = "none"  # a pinned parser of "none" turns tool calling off (reference 001)
_ARCH_SUFFIXES = ("forcausallm", "forconditionalgeneration", "lmheadmodel")


# --- values --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VllmPins:
    """What the user fixed for this model's vLLM launch; None means "derive it". Pins win over
    every derived value; the plan still says honestly whether the pinned launch fits."""

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # a fraction of the card, 0 < u <= 1
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int | None = None
    dtype: str | None = None  # --dtype
    kv_cache_dtype: str | None = None  # --kv-cache-dtype
    tool_call_parser: str | None = None  # "none" turns tool calling off
    tokenizer: str | None = None  # --tokenizer; never guessed (reference 001)
    # appended as given; memory or parser flags here replace ours, pinned or derived (reference
    # 001: hand-written flags predate the derived ones, and a second copy reads as a bug)
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class SizeTerm:
    """One number of the breakdown and where it comes from."""

    nbytes: int
    source: str


@dataclass(frozen=True)
class VllmBreakdown:
    """What one GPU holds, term by term (each tensor-parallel rank holds the same)."""

    weights: SizeTerm
    kv_per_token: SizeTerm  # full-attention layers: bytes per token of context
    swa_per_token: SizeTerm  # sliding-window layers: per token, up to `swa_window` tokens
    swa_window: int | None
    state: SizeTerm  # recurrent / mamba state of one sequence, independent of context
    kv: SizeTerm  # one max-model-len sequence (0 when the cost is unknown)
    kv_pool: SizeTerm  # the pool vLLM allocates: pinned (KV + margin), or the KV itself
    overhead: SizeTerm
    footprint: SizeTerm  # what the process holds on this GPU
    budget: SizeTerm | None  # the per-GPU share the plan was sized against
    kv_dtype_bytes: int
    attention_layers: int
    sliding_layers: int
    recurrent_layers: int


@dataclass(frozen=True)
class VllmPlan:
    """A vLLM launch for one model: flags as a list (never a shell string) and the sizing.

    `skipped` means vLLM cannot serve the model at all (args is empty); `fits` False with a
    `reason` means the launch as planned does not fit the budget or would be refused.
    """

    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    charge_bytes: int  # what a router should charge on each of the GPUs the launch uses
    tensor_parallel: int
    args: tuple[str, ...]
    fits: bool
    reason: str | None
    breakdown: VllmBreakdown | None
    tool_call_parser: str | None = None
    tool_calling: bool = False  # a parser is set (ours or one in the extra arguments)
    skipped: bool = False
    notes: tuple[str, ...] = ()
    pipeline_parallel: int = 1  # pipeline stages (one per node in a multi-node launch)

    @property
    def charge_total_bytes(self) -> int:
        """The charge over every GPU the launch occupies."""
        return self.charge_bytes * self.tensor_parallel * self.pipeline_parallel


# --- KV cost -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _KvModel:
    """KV of one sequence as `full × ctx + swa × min(ctx, window) + state` bytes per GPU."""

    full_per_token: int
    swa_per_token: int
    window: int | None
    state: int
    known: bool  # False when attention layers exist but their dimensions are missing
    attention_layers: int
    sliding_layers: int
    recurrent_layers: int
    full_source: str
    notes: tuple[str, ...]

    def bytes_for(self, ctx: int) -> int:
        swa = self.swa_per_token * min(ctx, self.window) if self.window else 0
        return self.full_per_token * ctx + swa + self.state

    def max_ctx(self, allowance: int) -> int | None:
        """The largest context whose KV fits `allowance`; None when longer context costs nothing
        (no full-attention layer), so memory does not bound it."""
        if allowance < self.state:
            return 0
        left = allowance - self.state
        full, swa, window = self.full_per_token, self.swa_per_token, self.window
        if swa and window:
            if (full + swa) * window > left:
                return left // (full + swa)  # the answer lies inside the window
            # past the window, sliding layers cost a constant `swa × window`
            return (left - swa * window) // full if full else None
        return left // full if full else None


def _recurrent_state_elems(meta: ModelMeta) -> int | None:
    """Elements of one recurrent layer's state for one sequence (llama.cpp's shapes, which
    vLLM's mamba / short-conv caches match); None when the header gives no dimensions."""
    if meta.ssm is not None:
        s = meta.ssm
        # conv state over x, B and C, plus the SSM state: Mamba-2 / gated delta net shapes
        conv = max(0, s.conv_kernel - 1) * (s.inner_size + 2 * s.group_count * s.state_size)
        return conv + s.state_size * s.inner_size
    if meta.rwkv is not None:
        return meta.n_embd * (meta.rwkv.token_shift_count + meta.rwkv.head_size)
    if meta.shortconv_l_cache:
        return meta.n_embd * max(0, meta.shortconv_l_cache - 1)
    return None


def _attention_token_bytes(
    meta: ModelMeta, kv_heads: int, *, tp: int, elem_bytes: int, kv_cache_dtype: str
) -> int | None:
    """Bytes per token of one attention layer on one GPU; None when dimensions are missing."""
    if meta.mla is not None:
        # MLA caches one compressed latent (kv_lora_rank) plus the shared rope key per token:
        # no separate K and V, hence ×1, and the latent is replicated on every rank, not split.
        if kv_cache_dtype == "fp8_ds_mla":
            return FP8_DS_MLA_TOKEN_BYTES
        return (meta.mla.kv_lora_rank + (meta.mla.rope_dim or 0)) * elem_bytes
    if not meta.head_dim_k or not meta.head_dim_v:
        return None
    # vLLM splits KV heads over tensor-parallel ranks and replicates them when there are fewer
    # heads than ranks (vLLM ModelConfig.get_num_kv_heads: max(1, heads // tp)). K and V are
    # each heads × head_dim: the "2 ×" of the rule, written as k + v for models where they differ.
    per_rank = max(1, kv_heads // tp)
    return per_rank * (meta.head_dim_k + meta.head_dim_v) * elem_bytes


def pp_stages(n_layer: int, pp: int) -> tuple[range, ...]:
    """The layers of each pipeline stage as vLLM splits them (`get_pp_indices`): equal parts,
    the remainder one each to the stages before the last (the last also holds the LM head)."""
    parts = [n_layer // pp] * pp
    for i in range(2, n_layer % pp + 2):
        parts[-i] += 1
    out, start = [], 0
    for n in parts:
        out.append(range(start, start + n))
        start += n
    return tuple(out)


def _kv_model(
    meta: ModelMeta,
    *,
    tp: int,
    elem_bytes: int,
    kv_cache_dtype: str,
    layers: range | None = None,
) -> _KvModel:
    """KV of the layers one GPU holds: all of them, or one pipeline stage's (`layers`)."""
    notes: list[str] = []
    # Reference 001 (Hugging Face metadata): config.json does not say reliably which layers
    # slide or how vLLM pages them, so sliding-window layers of an HF folder are charged as
    # full attention, deliberately conservative. A GGUF's per-layer pattern is the engine's
    # own, so there a sliding layer costs at most its window (SIZING.md, "vLLM").
    window = meta.sliding_window if meta.format == "gguf" else None
    if meta.format != "gguf" and any(meta.swa_layers):
        notes.append("sliding-window layers charged as full attention (config.json is ambiguous)")
    shared_from = meta.n_layer - meta.shared_kv_layers if meta.shared_kv_layers else meta.n_layer
    state_elems = _recurrent_state_elems(meta)
    full = swa = state = attn = sliding = recurrent = 0
    known = True
    for il in layers if layers is not None else range(meta.n_layer):
        if il < len(meta.recurrent_layers) and meta.recurrent_layers[il]:
            # a recurrent layer keeps a fixed state per sequence, whatever the context
            recurrent += 1
            # (not divided over tensor-parallel ranks: a conservative simplification)
            state += (state_elems or 0) * STATE_BYTES_PER_ELEM
        heads = meta.n_head_kv[il] if il < len(meta.n_head_kv) else 0
        if heads <= 0 or il >= shared_from:
            continue  # linear / recurrent / MLP-only layer, or one reusing an earlier layer's KV
        per_token = _attention_token_bytes(
            meta, heads, tp=tp, elem_bytes=elem_bytes, kv_cache_dtype=kv_cache_dtype
        )
        if per_token is None:
            known = False
            continue
        attn += 1
        if window and il < len(meta.swa_layers) and meta.swa_layers[il]:
            sliding += 1
            swa += per_token
        else:
            full += per_token
    if recurrent and state_elems is None:
        notes.append("recurrent layers without state dimensions in the header: state not counted")
    if meta.mla is not None and meta.mla.rope_dim is None:
        notes.append("MLA rope dimension missing from the header: latent counted without it")
    if meta.mla is not None:
        source = f"MLA latent (kv_lora_rank + rope dim) × {elem_bytes} B over {attn} layers"
    else:
        source = (
            f"2 × KV heads per rank (of {tp}) × head_dim × {elem_bytes} B "
            f"over {attn - sliding} full-attention layers"
        )
    return _KvModel(
        full_per_token=full,
        swa_per_token=swa,
        window=window if sliding else None,
        state=state,
        known=known,
        attention_layers=attn,
        sliding_layers=sliding,
        recurrent_layers=recurrent,
        full_source=source,
        notes=tuple(notes),
    )


def with_kv_margin(kv_bytes: int) -> int:
    """The pool to pin for `kv_bytes` of predicted KV: × 1.10 + 0.25 GiB (reference 001)."""
    return -(-kv_bytes * KV_MARGIN_NUM // KV_MARGIN_DEN) + KV_MARGIN_BYTES


def _without_kv_margin(pool_bytes: int) -> int:
    """The most KV whose margined pool still fits `pool_bytes` (inverse of `with_kv_margin`)."""
    return max(0, (pool_bytes - KV_MARGIN_BYTES) * KV_MARGIN_DEN // KV_MARGIN_NUM)


# --- tool calling and routing --------------------------------------------------------------------


def _arch_key(architecture: str) -> str:
    """`Qwen3_5MoeForConditionalGeneration`, `qwen3_5_moe` and `qwen35moe` all fold to
    `qwen35moe`."""
    key = architecture.strip().lower()
    for suffix in _ARCH_SUFFIXES:
        key = key.removesuffix(suffix)
    return key.replace("_", "").replace("-", "").replace(".", "")


def tool_call_parser(meta: ModelMeta, *, pinned: str | None = None) -> tuple[str | None, str]:
    """The `--tool-call-parser` for a model and why (a pin, the family table, or none)."""
    if pinned is not None and pinned.strip():
        if pinned.strip().lower() == PARSER_OFF:
            return None, "tool calling turned off"
        return pinned.strip(), "pinned"
    key = _arch_key(meta.architecture)
    parser = TOOL_CALL_PARSERS.get(key)
    if parser is None:
        return None, (
            f"no tool-call parser known for {meta.architecture!r}; vLLM rejects requests "
            "carrying tools until one is set"
        )
    if parser == "hermes" and key.startswith("qwen3") and "coder" in meta.name.lower():
        parser = QWEN3_CODER_PARSER
    return parser, "from the architecture"


def vllm_preferred(meta: ModelMeta) -> bool:
    """Whether vLLM should win over a default llama.cpp backend: Hugging Face folders, which
    llama.cpp cannot read at all (reference 001, "Routing")."""
    return meta.format == "hf"


# --- planning ------------------------------------------------------------------------------------


def _check_inputs(
    gpu_total_bytes: int | None,
    budget_bytes: int | None,
    tensor_parallel: int,
    pins: VllmPins,
    pipeline_parallel: int = 1,
) -> None:
    """Inconsistent inputs are errors (SizingError); "does not fit" is a result, not one."""
    if gpu_total_bytes is not None and gpu_total_bytes <= 0:
        raise SizingError(f"GPU total memory must be positive, got {gpu_total_bytes}")
    if budget_bytes is not None and budget_bytes <= 0:
        raise SizingError(f"VRAM budget must be positive, got {budget_bytes}")
    pinned_tp = pins.tensor_parallel_size
    if tensor_parallel < 1 or (pinned_tp is not None and pinned_tp < 1):
        raise SizingError("tensor-parallel size must be at least 1")
    if pipeline_parallel < 1:
        raise SizingError("pipeline-parallel size must be at least 1")
    util = pins.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise SizingError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    if pins.max_model_len is not None and pins.max_model_len < 1:
        raise SizingError(f"--max-model-len must be at least 1, got {pins.max_model_len}")
    if pins.kv_cache_memory_bytes is not None and pins.kv_cache_memory_bytes < 1:
        raise SizingError(
            f"--kv-cache-memory-bytes must be at least 1, got {pins.kv_cache_memory_bytes}"
        )
    if pins.dtype is not None and pins.dtype not in MODEL_DTYPE_BYTES:
        raise SizingError(
            f"unknown vLLM --dtype {pins.dtype!r}; one of {sorted(MODEL_DTYPE_BYTES)}"
        )
    kvd = pins.kv_cache_dtype
    if kvd is not None and kvd != "auto" and kvd not in KV_CACHE_DTYPE_BYTES:
        raise SizingError(
            f"unknown vLLM --kv-cache-dtype {kvd!r}; auto or one of {sorted(KV_CACHE_DTYPE_BYTES)}"
        )


def kv_elem_bytes(pins: VllmPins) -> int:
    """Bytes per KV element: the pinned cache dtype, else (auto) the model's dtype."""
    kvd = pins.kv_cache_dtype
    if kvd is not None and kvd != "auto":
        return KV_CACHE_DTYPE_BYTES[kvd]
    return MODEL_DTYPE_BYTES[pins.dtype or "auto"]


def _fraction_of(total: int, util: float) -> Fraction:
    # str() gives the shortest decimal that round-trips, so 0.72 is exactly 72/100 here
    return total * Fraction(str(util))


def _share(gpu_total: int | None, budget: int | None, pins: VllmPins) -> int | None:
    """The memory one GPU may give this model: a pinned utilization's share of the card, else
    the budget capped at the 0.95 ceiling, else that ceiling; None with no reading at all."""
    if gpu_total is not None and pins.gpu_memory_utilization is not None:
        return math.floor(_fraction_of(gpu_total, pins.gpu_memory_utilization))
    if gpu_total is not None:
        ceiling = gpu_total * MAX_GPU_UTIL_PCT // GPU_UTIL_STEPS_PER_UNIT
        return min(budget, ceiling) if budget is not None else ceiling
    return budget


def _share_source(gpu_total: int | None, budget: int | None, pins: VllmPins) -> str:
    if gpu_total is not None and pins.gpu_memory_utilization is not None:
        return "pinned utilization × card"
    if gpu_total is not None:
        return "budget, capped at 0.95 × card" if budget is not None else "0.95 × card"
    return "budget (no card reading)"


def _floor_ctx(trained: int | None) -> int:
    """The shortest window worth serving: 4096, or the whole trained context if shorter."""
    return min(MIN_MAX_MODEL_LEN, trained) if trained else MIN_MAX_MODEL_LEN


def _fitted_ctx(raw: int | None, trained: int | None) -> int:
    """A memory-bounded context made a launch value: capped at the trained context (no
    rounding needed there), else rounded down to a multiple of 4096."""
    if raw is None:  # memory does not bound it: the trained context, else the default
        return trained or FALLBACK_MAX_MODEL_LEN
    if trained and raw >= trained:
        return trained
    return raw // CTX_ROUND * CTX_ROUND


@dataclass(frozen=True)
class _Ctx:
    value: int
    note: str
    problem: str | None = None


def _budget_ctx(meta: ModelMeta, kv: _KvModel, *, share: int, weights: int, pin_pool: bool) -> _Ctx:
    trained = meta.context_length
    floor = _floor_ctx(trained)
    avail = share - weights - OVERHEAD_BYTES
    if avail <= 0:
        return _Ctx(
            floor,
            "weights over budget",
            f"the weights ({format_bytes(weights)}) and vLLM's {format_bytes(OVERHEAD_BYTES)} "
            f"reserve exceed the {format_bytes(share)} budget per GPU; pick a smaller quant, "
            "raise the budget or add GPUs (tensor parallel)",
        )
    # With the pool pinned, the margin is part of what the process holds, so the context is
    # sized for KV + margin to fit (the reference sizes on bare KV and lets the margin spill
    # over the budget; we keep the footprint inside it).
    allowance = _without_kv_margin(avail) if pin_pool else avail
    raw = kv.max_ctx(allowance)
    ctx = _fitted_ctx(raw, trained)
    if ctx < floor:
        return _Ctx(
            floor,
            "below the floor",
            f"the budget leaves {format_bytes(avail)} for the KV pool, room for {raw} tokens "
            f"after its margin; vLLM needs one {floor}-token sequence at least: raise the "
            "budget or use an fp8 KV cache",
        )
    if raw is None:
        return _Ctx(ctx, "longer context costs no memory; trained context (or the default)")
    if trained and ctx == trained:
        return _Ctx(ctx, "trained context")
    return _Ctx(ctx, f"sized to {format_bytes(allowance)} of KV left in the budget")


def _max_model_len(
    meta: ModelMeta,
    kv: _KvModel,
    *,
    share: int | None,
    weights: int,
    pins: VllmPins,
    pin_pool: bool,
) -> _Ctx:
    trained = meta.context_length
    if pins.max_model_len is not None:
        note = "pinned"
        if trained and pins.max_model_len > trained:
            note += (
                f"; beyond the trained {trained} tokens vLLM refuses unless "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set"
            )
        return _Ctx(pins.max_model_len, note)
    fallback = min(trained, FALLBACK_MAX_MODEL_LEN) if trained else FALLBACK_MAX_MODEL_LEN
    if not kv.known:
        return _Ctx(fallback, "no KV cost model (attention dims missing); conservative default")
    if pins.kv_cache_memory_bytes is not None:
        raw = kv.max_ctx(pins.kv_cache_memory_bytes)
        ctx = _fitted_ctx(raw, trained)
        floor = _floor_ctx(trained)
        if ctx < floor:
            return _Ctx(
                floor,
                "pinned KV pool",
                f"the pinned KV pool ({format_bytes(pins.kv_cache_memory_bytes)}) holds {raw} "
                f"tokens; vLLM refuses to start below one {floor}-token sequence",
            )
        return _Ctx(ctx, "sized to the pinned KV pool")
    if share is None:
        return _Ctx(fallback, "no budget or card reading; conservative default")
    return _budget_ctx(meta, kv, share=share, weights=weights, pin_pool=pin_pool)


def _utilization_pct(footprint: int, gpu_total: int) -> int:
    pct = -(-footprint * GPU_UTIL_STEPS_PER_UNIT // gpu_total)  # rounded UP
    return min(MAX_GPU_UTIL_PCT, max(MIN_GPU_UTIL_PCT, pct))


def _utilization(footprint: int, gpu_total: int | None, pins: VllmPins) -> tuple[float, str]:
    if pins.gpu_memory_utilization is not None:
        return pins.gpu_memory_utilization, "pinned"
    if gpu_total is None:
        return DEFAULT_GPU_UTIL_PCT / GPU_UTIL_STEPS_PER_UNIT, "no GPU reading; flat default"
    pct = _utilization_pct(footprint, gpu_total)
    return pct / GPU_UTIL_STEPS_PER_UNIT, (
        f"{format_bytes(footprint)} of a {format_bytes(gpu_total)} card, rounded up"
    )


def _fit_problem(
    meta: ModelMeta,
    *,
    tp: int,
    need: int,
    share: int | None,
    kv_bytes: int,
    pool: int | None,
    pinned_pool: bool,
    ctx: int,
) -> str | None:
    heads = max(meta.n_head, default=0)
    if tp > 1 and heads and heads % tp:
        return (
            f"{heads} attention heads do not divide over {tp} GPUs; vLLM requires the "
            "tensor-parallel size to divide the head count"
        )
    if pinned_pool and pool is not None and pool < kv_bytes:
        return (
            f"the pinned KV pool ({format_bytes(pool)}) cannot hold one {ctx}-token sequence "
            f"({format_bytes(kv_bytes)}), so vLLM refuses to start: raise "
            f"{FLAG_KV_CACHE_BYTES} or lower {FLAG_MAX_MODEL_LEN}"
        )
    if share is not None and need > share:
        return (
            f"max-model-len {ctx} needs {format_bytes(need)} per GPU but the budget allows "
            f"{format_bytes(share)}; lower max-model-len, use an fp8 KV cache or raise the budget"
        )
    return None


def _sets_memory(extra: tuple[str, ...]) -> bool:
    return any(a.split("=", 1)[0].startswith(_MEMORY_FLAGS) for a in extra)


def _sets_parser(extra: tuple[str, ...]) -> bool:
    return any(a.split("=", 1)[0] == FLAG_TOOL_CALL_PARSER for a in extra)


def _args(
    meta: ModelMeta,
    *,
    ctx: int,
    util: float,
    pool: int | None,
    tp: int,
    pins: VllmPins,
    parser: str | None,
    pp: int = 1,
) -> tuple[str, ...]:
    args: list[str] = []
    if meta.format == "gguf":
        # vLLM loads the same .gguf llama.cpp uses; an HF folder names its own quantization in
        # config.json, and forcing gguf there makes vLLM look for a file that is not there.
        args += [FLAG_QUANTIZATION, "gguf"]
    args += [FLAG_MAX_MODEL_LEN, str(ctx)]
    if not _sets_memory(pins.extra_args):
        # emitted even beside a pinned pool: vLLM checks free >= utilization × card at start-up
        # either way, and without the flag that check uses its 0.90 default (reference 001)
        args += [FLAG_GPU_UTIL, format(util, "g")]
        if pool is not None:
            args += [FLAG_KV_CACHE_BYTES, str(pool)]
    if tp > 1:
        args += [FLAG_TENSOR_PARALLEL, str(tp)]
    if pp > 1:
        args += [FLAG_PIPELINE_PARALLEL, str(pp)]
    if pins.dtype and pins.dtype != "auto":
        args += [FLAG_DTYPE, pins.dtype]
    if pins.kv_cache_dtype and pins.kv_cache_dtype != "auto":
        args += [FLAG_KV_CACHE_DTYPE, pins.kv_cache_dtype]
    if pins.tokenizer:
        args += [FLAG_TOKENIZER, pins.tokenizer]
    if parser and not _sets_parser(pins.extra_args):
        args += [FLAG_AUTO_TOOL_CHOICE, FLAG_TOOL_CALL_PARSER, parser]
    return (*args, *pins.extra_args)


def _skip_reason(meta: ModelMeta, is_split_gguf: bool) -> str | None:
    if meta.format == "gguf" and is_split_gguf:
        # Discovery represents a split set by its first shard, which is all llama.cpp needs;
        # vLLM would load that shard's share of the weights and fail further on (reference 001).
        return (
            "vLLM cannot load split GGUF shards; merge them with `llama-gguf-split --merge` "
            "or serve the model with llama-server"
        )
    if meta.model_class != ModelClass.LLM:
        # the reference emits vLLM generate commands only; other classes stay with their engines
        return f"vLLM plans cover chat models; this is a {meta.model_class.value} model"
    return None


def _breakdown(
    kv: _KvModel,
    *,
    tp: int,
    pp: int,
    weights: int,
    ctx: int,
    kv_bytes: int,
    pool: int | None,
    pool_pinned: bool,
    footprint: int,
    share: int | None,
    share_source: str,
    elem: int,
) -> VllmBreakdown:
    if pool_pinned:
        pool_source = "pinned by the user"
    elif pool is not None:
        pool_source = "KV × 1.10 + 256 MiB (reference margin for paged blocks)"
    else:
        pool_source = "not pinned: vLLM fills its share with KV blocks"
    return VllmBreakdown(
        weights=SizeTerm(
            weights, f"model tensors (ModelMeta.weight_bytes) split over {tp * pp} GPU(s)"
        ),
        kv_per_token=SizeTerm(kv.full_per_token, kv.full_source),
        swa_per_token=SizeTerm(
            kv.swa_per_token, f"{kv.sliding_layers} sliding-window layers, up to the window"
        ),
        swa_window=kv.window,
        state=SizeTerm(
            kv.state, f"f32 state of {kv.recurrent_layers} recurrent layers, one sequence"
        ),
        kv=SizeTerm(kv_bytes, f"one {ctx}-token sequence"),
        kv_pool=SizeTerm(pool if pool is not None else kv_bytes, pool_source),
        overhead=SizeTerm(
            OVERHEAD_BYTES, "flat reserve: activations, CUDA graphs, profiling peak (reference)"
        ),
        footprint=SizeTerm(footprint, "weights + KV pool + reserve"),
        budget=SizeTerm(share, share_source) if share is not None else None,
        kv_dtype_bytes=elem,
        attention_layers=kv.attention_layers,
        sliding_layers=kv.sliding_layers,
        recurrent_layers=kv.recurrent_layers,
    )


def budget_per_gpu(pinned: object, *, available: int | None, reserve: int) -> int | None:
    """The VRAM per GPU a vLLM launch is sized for: the model's budget (`vllm_budget_bytes`,
    saved or given) when it is one, else the card's free memory less the headroom `reserve`
    (`--reserve`, the window's GPU reserve), at least one byte; None with no card reading.
    `qmgui plan`, `preview`, `export`, `serve` and the window all size through this."""
    if isinstance(pinned, int) and not isinstance(pinned, bool) and pinned > 0:
        return pinned
    if available is None:
        return None
    return max(available - reserve, 1)


def plan_vllm(
    meta: ModelMeta,
    *,
    gpu_total_bytes: int | None,
    budget_bytes: int | None,
    tensor_parallel: int = 1,
    pins: VllmPins = VllmPins(),  # frozen, so one shared default is safe
    is_split_gguf: bool = False,
    pipeline_parallel: int = 1,
) -> VllmPlan:
    """Plan a vLLM launch of `meta` on GPUs of `gpu_total_bytes` each (None: no reading) with
    `budget_bytes` per GPU (None: the card's 0.95 ceiling). Raises SizingError only for
    inconsistent inputs; a launch that does not fit is a plan with `fits=False` and a reason.

    `pipeline_parallel` stages (one per node, each with `tensor_parallel` GPUs): every GPU
    holds weights / (TP × PP) and the KV of its stage's layers, sized for the stage with the
    most KV (vLLM gives the remainder layers to the stages before the last)."""
    _check_inputs(gpu_total_bytes, budget_bytes, tensor_parallel, pins, pipeline_parallel)
    skip = _skip_reason(meta, is_split_gguf)
    if skip is not None:
        return VllmPlan(
            max_model_len=0,
            gpu_memory_utilization=0.0,
            kv_cache_memory_bytes=None,
            charge_bytes=0,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            args=(),
            fits=False,
            reason=skip,
            breakdown=None,
            skipped=True,
        )
    tp = pins.tensor_parallel_size if pins.tensor_parallel_size is not None else tensor_parallel
    kv_dtype = pins.kv_cache_dtype or "auto"
    elem = kv_elem_bytes(pins)
    pp = pipeline_parallel
    if pp > max(meta.n_layer, 1):
        raise SizingError(
            f"{pp} pipeline stages for {meta.n_layer} layers: each stage needs a layer"
        )
    kv = max(
        (
            _kv_model(meta, tp=tp, elem_bytes=elem, kv_cache_dtype=kv_dtype, layers=stage)
            for stage in (pp_stages(meta.n_layer, pp) if pp > 1 else (None,))
        ),
        key=lambda k: (k.bytes_for(meta.context_length or FALLBACK_MAX_MODEL_LEN), k.state),
    )
    # weights are split evenly over the ranks (each stage's embedding or LM head aside)
    weights = -(-meta.weight_bytes // (tp * pp))
    share = _share(gpu_total_bytes, budget_bytes, pins)
    memory_in_extra = _sets_memory(pins.extra_args)
    # Reference 001: the pool is pinned unless the user pinned a utilization (fill-the-share,
    # and the escape hatch for vLLM < 0.11, which lacks the flag), their extra arguments size
    # memory themselves, or there is no KV cost to size it from.
    pin_pool = (
        pins.kv_cache_memory_bytes is None
        and pins.gpu_memory_utilization is None
        and not memory_in_extra
        and kv.known
    )
    ctx = _max_model_len(meta, kv, share=share, weights=weights, pins=pins, pin_pool=pin_pool)
    kv_bytes = kv.bytes_for(ctx.value) if kv.known else 0
    if memory_in_extra:
        pool = None
    elif pins.kv_cache_memory_bytes is not None:
        pool = pins.kv_cache_memory_bytes
    else:
        pool = with_kv_margin(kv_bytes) if pin_pool else None
    need = weights + (pool if pool is not None else kv_bytes) + OVERHEAD_BYTES
    # Reference 001 (footprint): with a pinned pool the process holds weights + pool + reserve,
    # uncapped. Without one vLLM fills its whole share with KV blocks, so the footprint is the
    # need capped at the share (and the share itself when the KV cost is unknown).
    if pool is not None or share is None:
        footprint = need
    else:
        footprint = min(need, share) if kv.known else share
    util, util_note = _utilization(footprint, gpu_total_bytes, pins)
    # Reference 001 (estVramGB): a router charges what vLLM really takes, util × card (so the
    # 0.10 floor and a pinned utilization are charged too), or the footprint with no card.
    charge = (
        math.ceil(_fraction_of(gpu_total_bytes, util)) if gpu_total_bytes is not None else footprint
    )
    problem = ctx.problem or _fit_problem(
        meta,
        tp=tp,
        need=need,
        share=share,
        kv_bytes=kv_bytes,
        pool=pool,
        pinned_pool=pins.kv_cache_memory_bytes is not None,
        ctx=ctx.value,
    )
    parser, parser_note = tool_call_parser(meta, pinned=pins.tool_call_parser)
    notes = [f"max-model-len: {ctx.note}", f"gpu-memory-utilization: {util_note}", *kv.notes]
    notes.append(f"tool-call parser: {parser_note}")
    if meta.format == "gguf" and not pins.tokenizer:
        # Reference 001: vLLM recommends the base model's tokenizer over the one converted out
        # of the GGUF, but a local folder name is not a verified HF id, so it is never guessed.
        notes.append("GGUF: vLLM recommends the base model's tokenizer; set one to use it")
    breakdown = _breakdown(
        kv,
        tp=tp,
        pp=pp,
        weights=weights,
        ctx=ctx.value,
        kv_bytes=kv_bytes,
        pool=pool,
        pool_pinned=pins.kv_cache_memory_bytes is not None,
        footprint=footprint,
        share=share,
        share_source=_share_source(gpu_total_bytes, budget_bytes, pins),
        elem=elem,
    )
    return VllmPlan(
        max_model_len=ctx.value,
        gpu_memory_utilization=util,
        kv_cache_memory_bytes=pool,
        charge_bytes=charge,
        tensor_parallel=tp,
        args=_args(
            meta, ctx=ctx.value, util=util, pool=pool, tp=tp, pins=pins, parser=parser, pp=pp
        ),
        pipeline_parallel=pp,
        fits=problem is None,
        reason=problem,
        breakdown=breakdown,
        tool_call_parser=parser,
        tool_calling=parser is not None or _sets_parser(pins.extra_args),
        notes=tuple(notes),
    )
