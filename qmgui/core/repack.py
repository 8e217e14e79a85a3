"""CPU weight repacking: which weights ggml's CPU backend copies into a buffer of its own.

With repacking on (llama-server's default; `-nr`/`--no-repack` turns it off) the CPU backend
offers "extra" buffer types ahead of its plain one (ggml-cpu.cpp,
`ggml_backend_cpu_get_extra_buffer_types`: AMX first, then KleidiAI, then CPU_REPACK), and
llama.cpp's loader puts every CPU-resident weight into the first buffer type whose
`supports_op` accepts the op the weight is used by (llama-model-loader.cpp,
`select_weight_buft` / `weight_buft_supported`). A weight placed there is a copy: the file
stays mapped (`CPU_Mapped`, the span of the weights left in the plain buffer) and the
repacked layout lives in `CPU_REPACK` or `AMX`, allocated and resident.

The rule table below is read from ggml's source at llama.cpp b10435 and b11434 (the two
builds the accuracy matrix runs); each rule names its file and function. Features are the
names the build's `system_info` line prints (`AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | ...`):
ggml's `ggml_cpu_has_*` answer for the *compiled* variant, so the line the engine prints is
the truth for a launch on this machine; for other hardware (what-if) an explicit feature set
stands in for it, and each rule says where it comes from.

Sizes: CPU_REPACK's buffer type has no `get_alloc_size` (repack.cpp: "defaults to
ggml_nbytes"), so a repacked weight takes its own size; AMX packs quantized weights into VNNI
tiles (amx/mmq.cpp, `ggml_backend_amx_get_alloc_size`). Both align every tensor to
TENSOR_ALIGNMENT (32 bytes) and the buffer is the sum of the padded sizes
(ggml-backend.cpp / ggml-alloc.c, `alloc_ctx_tensors_from_buft`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

REPACK_BUFFER = "CPU_REPACK"
AMX_BUFFER = "AMX"
TENSOR_ALIGNMENT = 32  # ggml-impl.h; both extra buffer types return it as their alignment

# the oldest build the rules were checked on (b10434: the test wheel's recorded AMX runs,
# docs/accuracy.json; b10435 and b11434: read and measured); older builds charge a bound
FIRST_KNOWN_BUILD = 10434

_REPACK_SRC = "ggml/src/ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type"
_AMX_SRC = "ggml/src/ggml-cpu/amx/amx.cpp, extra_buffer_type::supports_op"

# weight ops (llama-arch.cpp LLM_TENSOR_INFOS; the loader tries each buffer type with the op)
MUL_MAT = "mul_mat"
MUL_MAT_ID = "mul_mat_id"
OTHER = "other"  # GET_ROWS, SSM_CONV, IM2COL, ROPE, ...: no extra buffer type takes these

# GGUF names of weights whose op is not a matrix multiplication (llama-arch.cpp)
_NOT_MATMUL = re.compile(
    r"(^|\.)(token_embd|position_embd|token_types|per_layer_token_embd|rope_freqs|"
    r"rope_factors_long|rope_factors_short|ple_conv1d|attn_compressor_ape|attn_sinks|act|"
    r"ssm_conv1d|ssm_a|time_mix_first|attn_rel_b|cross_attn_rel_b|conv1d|conv1|conv2|dw|"
    r"conv|indexer_compressor_ape|ffn_gate_tid2eid|embed_tokens|masked_embd_centroids|"
    r"masked_embd_ordering|d2t|markov_w1|selector_predecessor|selector_successor)\.weight$"
)
_EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch)?exps\.")


def weight_op(name: str, shape: Sequence[int]) -> str:
    """The op llama.cpp's loader tests a weight with: MUL_MAT_ID for expert stacks, MUL_MAT
    for the other matrices, OTHER for embeddings, convolutions, norms and vectors."""
    if len([d for d in shape if d != 1]) < 2 or _NOT_MATMUL.search(name):
        return OTHER
    if _EXPERTS.search(name + "."):
        return MUL_MAT_ID
    return MUL_MAT


@dataclass(frozen=True)
class CpuTarget:
    """The CPU features a launch's CPU backend runs with, in `system_info` spelling.

    `source` says where they come from: "system_info" (the build's own line on this machine),
    "host" (this machine's CPU, the build assumed to run its best variant for it) or "what-if"
    (given for hardware that is not present)."""

    features: frozenset[str]
    source: str = "what-if"
    sve_cnt: int = 0  # SVE vector length in bytes (SVE_CNT); 0 when not SVE
    build: int | None = None  # llama.cpp build number; None: a recent build

    @property
    def repack_compiled(self) -> bool:
        return "REPACK" in self.features

    @property
    def amx(self) -> bool:
        # ggml-cpu.cpp adds the AMX buffer type only when built with __AMX_INT8__ and
        # __AVX512VNNI__ (and, on Linux, the kernel grants the tile state: ggml_amx_init)
        return "AMX_INT8" in self.features and "AVX512_VNNI" in self.features

    @property
    def known(self) -> bool:
        """Whether the rule table covers this build."""
        return self.build is None or self.build >= FIRST_KNOWN_BUILD


def parse_system_info(text: str) -> CpuTarget | None:
    """The features of a `system_info:` line (`CPU : SSE3 = 1 | AVX2 = 1 | ... | REPACK = 1 |`),
    the last one in `text`. None when there is none."""
    line = None
    for raw in text.splitlines():
        if "system_info:" in raw:
            line = raw
    if line is None:
        return None
    feats: set[str] = set()
    sve_cnt = 0
    for m in re.finditer(r"([A-Z][A-Z0-9_]*) = ([0-9]+)", line):
        key, value = m.group(1), int(m.group(2))
        if key == "SVE_CNT":
            sve_cnt = value
        elif key not in ("n_threads",) and value:
            feats.add(key)
    return CpuTarget(frozenset(feats), source="system_info", sve_cnt=sve_cnt)


def target_from_capabilities(
    capabilities: Mapping[str, object], build: int | None = None
) -> CpuTarget | None:
    """The CPU features a probe stored for a registered build (`ProbeResult.capabilities`:
    `cpu_features`, `sve_cnt`, from its system_info line); None when it stored none."""
    feats = capabilities.get("cpu_features")
    if not isinstance(feats, (list, tuple)) or not all(isinstance(f, str) for f in feats):
        return None
    sve = capabilities.get("sve_cnt")
    sve_cnt = sve if isinstance(sve, int) and not isinstance(sve, bool) else 0
    return CpuTarget(frozenset(feats), source="system_info", sve_cnt=sve_cnt, build=build)


# /proc/cpuinfo flag (x86 "flags", ARM "Features") -> system_info name, for a CPU whose build
# picks its best variant (GGML_BACKEND_DL builds score the variants by these features)
CPUINFO_FLAGS: dict[str, str] = {
    "sse3": "SSE3",  # x86 /proc/cpuinfo spells SSE3 "pni"; both are accepted
    "pni": "SSE3",
    "ssse3": "SSSE3",
    "avx": "AVX",
    "avx_vnni": "AVX_VNNI",
    "avx2": "AVX2",
    "f16c": "F16C",
    "fma": "FMA",
    "bmi2": "BMI2",
    "avx512f": "AVX512",
    "avx512_vbmi": "AVX512_VBMI",
    "avx512vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI",
    "avx512vnni": "AVX512_VNNI",
    "avx512_bf16": "AVX512_BF16",
    "amx_int8": "AMX_INT8",
    "asimd": "NEON",
    "neon": "NEON",
    "asimddp": "DOTPROD",
    "i8mm": "MATMUL_INT8",
    "sve": "SVE",
    "sme": "SME",
}


# the features a what-if CPU may be given (every one some rule or buffer type reads)
WHAT_IF_FEATURES = frozenset(
    {"AVX2", "AVX512", "AVX512_VNNI", "AMX_INT8", "NEON", "DOTPROD", "MATMUL_INT8", "SVE", "VXE"}
)


def target_from_cpuinfo(flags: Iterable[str], *, build: int | None = None) -> CpuTarget:
    """A CpuTarget from /proc/cpuinfo flags, for a build with repacking compiled in (ggml's
    default, GGML_CPU_REPACK=ON) that runs the best variant for this CPU."""
    feats = {CPUINFO_FLAGS[f] for f in flags if f in CPUINFO_FLAGS}
    feats.add("REPACK")
    return CpuTarget(frozenset(feats), source="host", build=build)


@dataclass(frozen=True)
class Rule:
    """One layout a ggml type is repacked into: taken when the CPU has every feature in
    `needs` and the weight's rows (ne[1]) are a multiple of `rows`."""

    dtype: str
    layout: str
    needs: frozenset[str]
    rows: int
    source: str
    since: int | None = None  # first build it was read in (None: every known build)
    sve_cnt: int = 0  # also needs this SVE vector length (Q4_0 8x8 on 256-bit SVE)


def _r(dtype: str, layout: str, needs: str, rows: int, *, since: int | None = None,
       sve_cnt: int = 0) -> Rule:  # fmt: skip
    return Rule(dtype, layout, frozenset(needs.split()), rows, _REPACK_SRC, since, sve_cnt)


# ggml_repack_get_optimal_repack_type, in its order (the first rule that holds wins). RISC-V
# vector layouts (16x1, only with __riscv_zvfh and 256-bit vectors) are not listed: plans for
# RISC-V charge the bound.
REPACK_RULES: tuple[Rule, ...] = (
    _r("Q4_0", "q4_0_8x8_q8_0", "AVX2", 8),
    _r("Q4_0", "q4_0_8x8_q8_0", "SVE MATMUL_INT8", 8, sve_cnt=32),
    _r("Q4_0", "q4_0_4x8_q8_0", "NEON MATMUL_INT8", 4),
    _r("Q4_0", "q4_0_4x4_q8_0", "NEON DOTPROD", 4),
    _r("Q4_0", "q4_0_4x4_q8_0", "VXE", 4, since=11434),
    _r("Q4_K", "q4_K_8x8_q8_K", "AVX2", 8),
    _r("Q4_K", "q4_K_8x8_q8_K", "NEON MATMUL_INT8", 8),
    _r("Q4_K", "q4_K_8x4_q8_K", "NEON DOTPROD", 8),
    _r("Q2_K", "q2_K_8x8_q8_K", "AVX512", 8),
    _r("Q5_K", "q5_K_8x8_q8_K", "NEON MATMUL_INT8", 8),
    _r("Q5_K", "q5_K_8x4_q8_K", "NEON DOTPROD", 8),
    _r("Q6_K", "q6_K_8x8_q8_K", "NEON MATMUL_INT8", 8),
    _r("Q6_K", "q6_K_8x4_q8_K", "NEON DOTPROD", 8),
    _r("IQ4_NL", "iq4_nl_8x8_q8_0", "AVX2", 8),
    _r("IQ4_NL", "iq4_nl_4x4_q8_0", "NEON DOTPROD", 4),
    _r("MXFP4", "mxfp4_8x8_q8_0", "AVX2", 8),
    _r("MXFP4", "mxfp4_4x4_q8_0", "NEON DOTPROD", 4),
    _r("Q8_0", "q8_0_4x8_q8_0", "NEON MATMUL_INT8", 4),
    _r("Q8_0", "q8_0_4x4_q8_0", "NEON DOTPROD", 4),
    _r("Q1_0", "q1_0_4x8_q8_0", "NEON MATMUL_INT8", 4, since=11434),
    _r("Q1_0", "q1_0_4x4_q8_0", "NEON DOTPROD", 4, since=11434),
)

# AMX (amx/amx.cpp supports_op): MUL_MAT only (not MUL_MAT_ID), ne[1] a multiple of
# TILE_N * 2 = 32, ne[0] a multiple of the type's alignment; F16 is taken but not packed.
# Packed sizes (amx/mmq.cpp get_row_size): per block of the type, its bytes plus int32
# compensation for Q8_0, 4 bytes for Q4_K/Q5_K, 2 for IQ4_XS.
# type -> (ne[0] alignment, elements per block, packed bytes per block; 0: not packed)
AMX_TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (32, 32, 18),
    "Q4_1": (32, 32, 20),
    "Q8_0": (32, 32, 34 + 4),
    "Q4_K": (256, 256, 144 + 4),
    "Q5_K": (256, 256, 176 + 4),
    "Q6_K": (256, 256, 210),
    "IQ4_XS": (256, 256, 136 + 2),
    "F16": (16, 1, 0),
}
AMX_TILE_ROWS = 32  # TILE_N * 2 (amx/common.h TILE_N = 16)


@dataclass(frozen=True)
class Weight:
    """A CPU-resident weight as the loader sees it: name, ggml type, shape (ne order), ggml
    bytes, and the op it is used by (weight_op)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    op: str


@dataclass(frozen=True)
class Placed:
    """Where one weight went: its extra buffer, layout, allocated bytes and the rule's source."""

    name: str
    buffer: str
    layout: str
    bytes: int
    source: str


@dataclass(frozen=True)
class Repacked:
    """The extra buffers of one launch: bytes per buffer (CPU_REPACK, AMX) and every weight
    placed in them."""

    buffers: dict[str, int] = field(default_factory=dict)
    weights: tuple[Placed, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.buffers.values())

    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.weights)


def _pad(n: int, align: int = TENSOR_ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def _dims(shape: Sequence[int]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count (at least 1)."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def amx_place(w: Weight) -> Placed | None:
    """The AMX buffer's copy of `w`, or None when AMX's supports_op refuses it."""
    spec = AMX_TYPES.get(w.dtype)
    if spec is None or w.op != MUL_MAT or len(w.shape) < 2:
        return None
    align, block, packed = spec
    k, n = w.shape[0], w.shape[1]
    if n % AMX_TILE_ROWS or k % align:
        return None
    size = w.nbytes if packed == 0 else n * (k // block) * packed
    layout = "vnni" if packed else "plain"
    return Placed(w.name, AMX_BUFFER, layout, _pad(size), _AMX_SRC)


def repack_rule(w: Weight, cpu: CpuTarget) -> Rule | None:
    """The CPU_REPACK layout `w` gets, or None (the type has no layout on this CPU, the rows
    do not divide, or the op is not a 2D MUL_MAT / 3D MUL_MAT_ID)."""
    dims = _dims(w.shape)
    if not ((w.op == MUL_MAT and dims == 2) or (w.op == MUL_MAT_ID and dims == 3)):
        return None
    rows = w.shape[1]
    for rule in REPACK_RULES:
        if rule.dtype != w.dtype or not rule.needs <= cpu.features:
            continue
        if rule.since is not None and cpu.build is not None and cpu.build < rule.since:
            continue
        if rule.sve_cnt and cpu.sve_cnt != rule.sve_cnt:
            continue
        if rows % rule.rows == 0:
            return rule
    return None


def place(weights: Iterable[Weight], cpu: CpuTarget) -> Repacked:
    """The extra buffers the CPU backend allocates for `weights` (the CPU-resident ones, a
    tied output's duplicate included) and which weights they hold."""
    buffers: dict[str, int] = {}
    placed: list[Placed] = []
    for w in weights:
        p = amx_place(w) if cpu.amx else None
        if p is None and cpu.repack_compiled:
            rule = repack_rule(w, cpu)
            if rule is not None:
                p = Placed(w.name, REPACK_BUFFER, rule.layout, _pad(w.nbytes), rule.source)
        if p is not None:
            placed.append(p)
            buffers[p.buffer] = buffers.get(p.buffer, 0) + p.bytes
    return Repacked(buffers, tuple(placed))


def rules_table() -> list[dict[str, object]]:
    """The rule table as rows (type, layout, needs, rows, source), for docs and `--json`."""
    rows: list[dict[str, object]] = [
        {
            "type": r.dtype,
            "buffer": REPACK_BUFFER,
            "layout": r.layout,
            "needs": sorted(r.needs) + ([f"SVE_CNT={r.sve_cnt}"] if r.sve_cnt else []),
            "rows_multiple_of": r.rows,
            "since": r.since,
            "source": r.source,
        }
        for r in REPACK_RULES
    ]
    for dtype, (align, _, packed) in AMX_TYPES.items():
        rows.append(
            {
                "type": dtype,
                "buffer": AMX_BUFFER,
                "layout": "vnni" if packed else "plain",
                "needs": ["AMX_INT8", "AVX512_VNNI"],
                "rows_multiple_of": AMX_TILE_ROWS,
                "k_multiple_of": align,
                "since": None,
                "source": _AMX_SRC,
            }
        )
    return rows
