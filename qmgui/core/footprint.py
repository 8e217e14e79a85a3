"""Footprint: what one llama-server launch allocates, per device and in host memory.

Exact parts mirror llama.cpp's allocation rules and are checked against the real engine by
`bench/accuracy.py`:
- weights: placed tensor by tensor with llama.cpp's layer -> device map (`-ngl` counts the
  output layer and offloads from the end; the input layer stays on the CPU; `--n-cpu-moe`
  keeps the experts of the first N layers on the CPU; layers split across GPUs in proportion
  to free memory or `-ts`); a memory-mapped CPU buffer spans the file region of its tensors;
- KV cache: per layer with attention KV, per stream, exact row sizes of the cache types, the
  sliding-window cache size, MLA's single latent, V padded to the widest layer without flash
  attention;
- recurrent state: F32 conv and SSM/WKV states per sequence, not growing with context;
- output buffer: logits (and embeddings) for `n_seq` outputs.
The compute buffer is an estimate (`qmgui.core.compute`), calibrated on the CPU backend.
Buffers with no model (a graph without a layout, a projector's encoder) are charged as upper
bounds (`qmgui.core.bounds`), each listed in `Footprint.bounds`: never a silent zero.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import NamedTuple

from qmgui.core.bounds import Bound, compute_bound, compute_bound_why, projector_compute_bound
from qmgui.core.compute import MIXED_BATCH_BUILD, compute_buffer_bytes, is_embedding
from qmgui.core.errors import SizingError
from qmgui.core.gcpause import while_paused
from qmgui.core.gguf_tables import GGML_SIZES_BY_NAME
from qmgui.core.graph.dims import swa_cells
from qmgui.core.launch import LaunchSettings, Resolved, pad, resolve, row_bytes
from qmgui.core.meta import DSV4_CSA_RATIO, DSV4_HCA_RATIO, ModelMeta, TensorEntry, tensor_places
from qmgui.core.repack import (
    FIRST_KNOWN_BUILD,
    MUL_MAT,
    CpuTarget,
    Repacked,
    Weight,
    place,
    weight_op,
)
from qmgui.core.sched import Offload, _unfused_delta_net_bound, sched_compute_bytes
from qmgui.core.units import MIB, format_bytes

# ggml type name -> (elements per block, bytes per block), from qmgui's copy of gguf's table
QUANT_BLOCKS: dict[str, tuple[int, int]] = GGML_SIZES_BY_NAME

CPU = "CPU"
# architectures llama.cpp creates no KV memory for (llama_model::create_memory: encoders and
# diffusion LMs that attend to the whole batch at once)
NO_MEMORY_ARCHS = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
        "clef",
    }
)
MAPPED_ALIGNMENT = 32  # GGUF data alignment when general.alignment is absent
REPACK_ALIGNMENT = 256  # per-tensor padding bound in repack buffers (see _repack_bound)

# What the GPU backend itself holds on every card the engine uses, outside the buffers the
# engine logs (charged as the card's `other`), measured on one NVIDIA H200, driver 580.159.04
# (CUDA 13.0), docs/gpu/:
# - cuda: a bare CUDA context (cuda-bindings: primary context and a 1 MiB allocation) raised
#   NVML's used memory by 554,500,096 bytes (520 MiB in the process's own line): 528 MiB
#   without the allocation, rounded up. A context grows with the card (it holds per-SM state)
#   and moves between driver versions: smaller cards and other drivers take less or more, and
#   llama.cpp's CUDA backend adds cuBLAS and its kernels on first use, which this does not
#   count. ROCm (the CUDA backend on HIP) is charged the same, unmeasured.
# - vulkan: llama-server's peak on the card (NVML) less its logged GPU buffers, 53.6-56.5 MiB
#   over 90 launches of tiny to 30B models (docs/gpu/gpu_check.json, docs/gpu/holdout): 57 MiB.
#   (One more launch, qwen3next with recurrent layers on the CPU, took 127.6 MiB.)
# Other backends (metal, a CPU rpc-server) are not charged.
CONTEXT_BYTES: dict[str, int] = {"cuda": 528 * MIB, "vulkan": 57 * MIB}


def context_bytes(gpu: Gpu) -> int:
    """The backend's own memory on this card (its context), outside the logged buffers."""
    return CONTEXT_BYTES.get(gpu.backend, 0)


def _context_note(gpus: Sequence[Gpu]) -> list[str]:
    charged = sorted({(g.backend, context_bytes(g)) for g in gpus if context_bytes(g)})
    if not charged:
        return []
    each = ", ".join(f"{format_bytes(n)} {b.upper()}" for b, n in charged)
    return [
        f"other: the GPU backend's own context on each card ({each}; measured on an H200, "
        "other cards and drivers differ)"
    ]


@dataclass(frozen=True)
class Gpu:
    """A GPU to plan for: a real card's reading or a what-if budget."""

    name: str
    total_bytes: int
    free_bytes: int | None = None  # None = all of total is free
    backend: str = "cuda"  # whose allocation rules apply: cuda (also ROCm), vulkan, metal
    # a llama.cpp `rpc-server` (host:port) that offers this device over the network: llama.cpp
    # sizes its buffers with the remote backend's rules (`backend`: a CPU rpc-server allocates
    # like any non-CUDA backend) and lists RPC devices before the local GPUs
    endpoint: str | None = None
    # the names of the GPUs NVLink joins this one to; None: not known (what-if cards)
    nvlink: frozenset[str] | None = None

    @property
    def available(self) -> int:
        return self.total_bytes if self.free_bytes is None else self.free_bytes

    @property
    def remote(self) -> bool:
        """A device on an rpc-server (`--rpc host:port`), not in this machine."""
        return self.endpoint is not None


@dataclass(frozen=True)
class DeviceFootprint:
    name: str
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int = 0
    output: int = 0
    other: int = 0  # on a GPU: the backend's own context (context_bytes), not a logged buffer
    # CPU weight repacking (qmgui.core.repack): the CPU_REPACK and AMX copies of matmul
    # weights, allocated and resident, counted in `total`; the file stays mapped besides
    repack: int = 0
    # the part of `weights` that is a memory-mapped file span (host, mmap on): it is counted
    # in `total` as the engine reports it, but the kernel can reclaim it (see `resident`)
    mapped: int = 0
    # the most the copies can add, not counted in `total` (already in it as `repack`): equal
    # to `repack` where the rules know the CPU and build, else every CPU-resident matmul
    # weight (readers that compare a bound with the engine's repack buffers keep working)
    repack_bound: int = 0

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.kv
            + self.recurrent
            + self.compute
            + self.output
            + self.other
            + self.repack
        )

    @property
    def resident(self) -> int:
        """Allocated memory that is not a mapped file span."""
        return self.total - self.mapped

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "weights": self.weights,
            "kv": self.kv,
            "recurrent": self.recurrent,
            "compute": self.compute,
            "output": self.output,
            "other": self.other,
            "repack": self.repack,
            "mapped": self.mapped,
            "repack_bound": self.repack_bound,
            "resident": self.resident,
            "total": self.total,
        }


@dataclass(frozen=True)
class Footprint:
    settings: Resolved
    n_gpu_layers: int
    layer_devices: tuple[str, ...]  # device of each layer, then of the output layer
    devices: tuple[DeviceFootprint, ...]  # the GPUs in order, then "CPU" (host memory)
    notes: tuple[str, ...] = field(default=())
    # buffers charged as upper bounds (no exact model): which part, where, how much, why
    bounds: tuple[Bound, ...] = field(default=())

    def bounded(self, device: str) -> int:
        """Bytes of `device`'s total that are upper bounds, not estimates."""
        return sum(b.bytes for b in self.bounds if b.device == device)

    def device(self, name: str) -> DeviceFootprint:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def host(self) -> DeviceFootprint:
        return self.device(CPU)


def layer_device_map(
    meta: ModelMeta, gpus: Sequence[Gpu], n_gpu_layers: int, tensor_split: Sequence[float] = ()
) -> tuple[str, ...]:
    """Device of layers 0..n_layer-1 and of the output layer (index n_layer), as llama.cpp's
    load_tensors assigns them."""
    n_layer = meta.n_layer
    if not gpus or n_gpu_layers <= 0:
        return (CPU,) * (n_layer + 1)
    weights = list(tensor_split) if any(tensor_split) else [float(g.available) for g in gpus]
    if len(weights) != len(gpus):
        raise SizingError(f"--tensor-split has {len(weights)} values for {len(gpus)} GPUs")
    total = sum(weights)
    if total <= 0:
        raise SizingError("--tensor-split values must not all be zero")
    splits = []
    acc = 0.0
    for w in weights:
        acc += w
        splits.append(acc / total)
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    last = len(gpus) - 1
    ordered = all(a <= b for a, b in pairwise(splits))
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(CPU)
            continue
        x = (il - i_gpu_start) / act
        # std::upper_bound: the first split above x (a bisection where the cumulative splits
        # are sorted, as they are unless a --tensor-split value is negative)
        if ordered:
            gpu = bisect_right(splits, x)
        else:
            gpu = next((i for i, s in enumerate(splits) if s > x), last)
        out.append(gpus[min(gpu, last)].name)
    return tuple(out)


_INPUT, _LAYER, _OUTPUT = 0, 1, 2


class _Placed(NamedTuple):
    """A tensor reduced to what placement needs (built once per model, see _table; a tuple:
    a model has thousands)."""

    role: int  # _INPUT, _LAYER or _OUTPUT
    layer: int
    expert: bool
    offset: int
    nbytes: int
    file_index: int
    cuda_nbytes: int  # what a CUDA buffer allocates for it (quantized rows padded)
    # an SSM scan's A whose state size Vulkan has no kernel for: llama.cpp keeps it on the CPU
    # when the layer is on a Vulkan GPU (weight_buft_supported: no device supports the op)
    vulkan_cpu: bool = False


_A_NOSCAN = frozenset({"qwen3next", "qwen35", "qwen35moe", "kimi-linear"})


def _scan_state(meta: ModelMeta, t: TensorEntry) -> int:
    """The state size llama.cpp's loader tries an SSM scan with for this A tensor."""
    first = t.shape[0] if t.shape else 1
    return (meta.ssm.state_size if meta.ssm else 0) if first == 1 else first


_TABLES: dict[int, tuple[ModelMeta, tuple[_Placed, ...]]] = {}
_TABLES_KEPT = 32  # a fit search asks for the same model dozens of times


def _table(meta: ModelMeta) -> tuple[_Placed, ...]:
    hit = _TABLES.get(id(meta))
    if hit is not None and hit[0] is meta:
        return hit[1]
    rows = []
    # Vulkan's SSM scan has kernels for states of 128 and 256 values (ggml-vulkan.cpp); the
    # loader tries the scan with A's first dimension, or the header's state size when that is
    # 1 (Mamba-2); gated-delta-net models use their A in a multiplication (SSM_A_NOSCAN)
    vk_scan_cpu = meta.ssm is not None and meta.architecture not in _A_NOSCAN
    n_layer = meta.n_layer
    new = tuple.__new__  # _Placed's fields in order, without its __new__'s Python frame
    for t, (il, expert) in zip(meta.tensors, tensor_places(meta), strict=True):
        if il < 0:
            role, layer = _INPUT, -1
        elif il >= n_layer:
            role, layer = _OUTPUT, -1  # output layer, and blocks beyond the model's layers
        else:
            role, layer = _LAYER, il
        size = t.nbytes
        shape = t.shape
        # _cuda_alloc_size, inline: the padding of a quantized row is the rare case
        rem = shape[0] % CUDA_ROW_PADDING if shape else 0
        cuda = (
            _cuda_alloc_size(t)
            if rem and t.dtype not in _UNQUANTIZED
            else -(-size // CUDA_ALIGNMENT) * CUDA_ALIGNMENT
        )
        scan_cpu = (
            vk_scan_cpu and t.name.endswith(".ssm_a") and _scan_state(meta, t) not in (128, 256)
        )
        row = (role, layer, expert and role == _LAYER, t.offset, size, t.file_index, cuda, scan_cpu)
        rows.append(new(_Placed, row))
    table = tuple(rows)
    if len(_TABLES) >= _TABLES_KEPT:
        _TABLES.clear()
    _TABLES[id(meta)] = (meta, table)
    return table


# ggml-cuda: MATRIX_ROW_PADDING pads the last row of a quantized matrix to 512 values, and
# its buffers align every tensor to 128 bytes (ggml_backend_cuda_buffer_type_get_alignment)
CUDA_ROW_PADDING = 512
CUDA_ALIGNMENT = 128
_UNQUANTIZED = frozenset({"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"})


def _cuda_alloc_size(t: TensorEntry) -> int:
    size = t.nbytes
    rem = t.shape[0] % CUDA_ROW_PADDING if t.shape else 0
    if rem and t.dtype not in _UNQUANTIZED:
        block_type = QUANT_BLOCKS.get(t.dtype)
        if block_type is not None:
            block, type_size = block_type
            size += (CUDA_ROW_PADDING - rem) // block * type_size
    return pad(size, CUDA_ALIGNMENT)


@dataclass(frozen=True)
class _Group:
    """Tensors that are placed together (one role, layer, expert flag and Vulkan SSM rule)
    in one file: their bytes as each kind of buffer counts them, and the span they cover."""

    role: int
    layer: int
    expert: bool
    vulkan_cpu: bool
    file_index: int
    nbytes: int
    cuda_nbytes: int
    mapped: int  # padded as a non-mapped host buffer keeps them
    lo: int
    hi: int


def _groups(meta: ModelMeta, repacked: frozenset[str]) -> tuple[_Group, ...]:
    """_kept's tensors summed per group: a placement then costs one step a group, not a
    tensor (a fit search over offloads places ~n_layer candidates of ~600-900 tensors)."""
    key = ("groups", id(meta), repacked)
    hit = _placed_get(key, meta)
    if isinstance(hit, tuple):
        return hit
    acc: dict[tuple[int, int, bool, bool, int], list[int]] = {}
    get = acc.get
    for role, layer, expert, start, n, file_index, cuda, vk_cpu in _kept(meta, repacked):
        k = (role, layer, expert, vk_cpu, file_index)
        a = get(k)
        end = start + n
        mapped = -(-n // MAPPED_ALIGNMENT) * MAPPED_ALIGNMENT  # launch.pad, inline
        if a is None:
            acc[k] = [n, cuda, mapped, start, end]
        else:
            a[0] += n
            a[1] += cuda
            a[2] += mapped
            if start < a[3]:  # noqa: PLR1730 - min() and max() cost a call per tensor
                a[3] = start
            if end > a[4]:  # noqa: PLR1730
                a[4] = end
    groups = tuple(_Group(*k, *a) for k, a in acc.items())
    _placed_put(key, meta, groups)
    return groups


def _kept(meta: ModelMeta, repacked: frozenset[str]) -> Sequence[_Placed]:
    table = _table(meta)
    if not repacked:
        return table
    return [p for t, p in zip(meta.tensors, table, strict=True) if t.name not in repacked]


# weight placement per model and placement (not the context): a context slider or a context
# search asks for the same placement again and again. Keyed as _TABLES (the model by id, its
# entry checked by identity), bounded, and filled whole or not at all (threads only race to
# compute the same value)
_PLACED: dict[tuple[object, ...], tuple[ModelMeta, object]] = {}
_PLACED_KEPT = 256  # a fit search over offloads asks ~n_layer placements of one model


def _placed_get(key: tuple[object, ...], meta: ModelMeta) -> object | None:
    hit = _PLACED.get(key)
    return hit[1] if hit is not None and hit[0] is meta else None


def _placed_put(key: tuple[object, ...], meta: ModelMeta, value: object) -> None:
    if len(_PLACED) >= _PLACED_KEPT:
        _PLACED.clear()
    _PLACED[key] = (meta, value)


def _weights(
    meta: ModelMeta,
    layer_dev: Sequence[str],
    s: LaunchSettings,
    backends: dict[str, str],
    repacked: frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Weight bytes per device. CPU tensors of a memory-mapped file count as the file span
    they cover (llama.cpp maps [first tensor, last tensor end) of each file); `repacked` CPU
    tensors live in an extra buffer instead and leave the span (their own buffer's context)."""
    key = (
        "weights",
        id(meta),
        tuple(layer_dev),
        s.cpu_moe,
        s.n_cpu_moe,
        s.mmap,
        tuple(sorted(backends.items())),
        repacked,
    )
    hit = _placed_get(key, meta)
    if not isinstance(hit, dict):
        hit = _place_weights(meta, layer_dev, s, backends, repacked)
        _placed_put(key, meta, hit)
    return dict(hit)  # a copy: the kept one is never handed out


def _place_weights(
    meta: ModelMeta,
    layer_dev: Sequence[str],
    s: LaunchSettings,
    backends: dict[str, str],
    repacked: frozenset[str],
) -> dict[str, int]:
    per: dict[str, int] = {}
    cpu_spans: dict[int, list[int]] = {}
    out_dev = layer_dev[meta.n_layer]
    for g in _groups(meta, repacked):
        dev = _device(g.role, g.layer, g.expert, layer_dev, s)
        if g.vulkan_cpu and backends.get(dev) == "vulkan":
            dev = CPU
        if dev == CPU and s.mmap:
            lo_hi = cpu_spans.setdefault(g.file_index, [g.lo, g.hi])
            lo_hi[0] = min(lo_hi[0], g.lo)
            lo_hi[1] = max(lo_hi[1], g.hi)
        elif dev == CPU:
            per[CPU] = per.get(CPU, 0) + g.mapped
        elif backends.get(dev) == "cuda":
            per[dev] = per.get(dev, 0) + g.cuda_nbytes
        else:
            per[dev] = per.get(dev, 0) + g.nbytes
    if cpu_spans:
        per[CPU] = per.get(CPU, 0) + sum(hi - lo for lo, hi in cpu_spans.values())
    if meta.tied_embeddings and out_dev != CPU:
        # no output.weight: llama.cpp duplicates token_embd onto the output device
        embd = next((t for t in meta.tensors if t.name == "token_embd.weight"), None)
        if embd is not None:
            per[out_dev] = per.get(out_dev, 0) + embd.nbytes
    return per


@dataclass(frozen=True)
class EngineRules:
    """Allocation rules that moved between llama.cpp builds; `build` None = a recent build."""

    build: int | None = None
    # the CPU backend's features (qmgui.core.repack): which weights it repacks; None: not
    # known, the copies are only bounded
    cpu: CpuTarget | None = None

    @property
    def mla_keeps_v(self) -> bool:
        # before ~b7832 an MLA cache also held a V row of kv_lora_rank (SIZING.md)
        return self.build is not None and self.build < 7832

    @property
    def mixed_batch(self) -> bool:
        """build_inp_embd builds (and ggml-alloc keeps) the mixed token/embedding branch:
        from core.compute.MIXED_BATCH_BUILD on. Opt-in: None keeps the test engine's graph
        (b10435), which the measured fixtures pin."""
        return self.build is not None and self.build >= MIXED_BATCH_BUILD


def kv_layers(meta: ModelMeta) -> list[int]:
    """Layers that keep attention KV: attention heads, not recurrent, not sharing KV."""
    if meta.architecture in NO_MEMORY_ARCHS:
        return []
    n_kv_own = meta.n_layer - meta.shared_kv_layers
    arch = meta.architecture
    # llama_model::create_memory's hybrid filters: falcon-h1 keeps KV in every layer beside its
    # SSM state; nemotron_h only in layers with no feed-forward (`!is_recr(il) && n_ff(il) == 0`)
    both = arch == "falcon-h1"
    ff_free = arch in ("nemotron_h", "nemotron_h_moe")
    return [
        il
        for il in range(meta.n_layer)
        if meta.n_head_kv[il] > 0
        and (both or not (meta.recurrent_layers and meta.recurrent_layers[il]))
        and not (ff_free and meta.n_ff and meta.n_ff[il])
        and il < n_kv_own
    ]


def kv_cells(meta: ModelMeta, r: Resolved, il: int) -> int:
    """Cells of layer il's cache (per stream)."""
    if meta.swa_layers and il < len(meta.swa_layers) and meta.swa_layers[il]:
        return swa_cells(meta, r)
    return r.n_ctx_seq


def _head_dims(meta: ModelMeta) -> tuple[int, int]:
    k = meta.head_dim_k or 0
    v = meta.head_dim_v or 0
    return k, v


def kv_bytes_per_layer(
    meta: ModelMeta, r: Resolved, rules: EngineRules = EngineRules()
) -> dict[int, int]:
    if meta.architecture == "deepseek4" and meta.compress_ratios:
        return _dsv4_kv_bytes(meta, r)
    layers = kv_layers(meta)
    hk, hv = _head_dims(meta)
    # a re-converted MLA GGUF (with key_length_mla) caches one latent per token
    mla = meta.mla is not None and meta.mla.key_length_mla is not None and not rules.mla_keeps_v
    v_widths = [hv * meta.n_head_kv[il] for il in layers]
    v_max = max(v_widths, default=0)
    out = {}
    for il in layers:
        cells = kv_cells(meta, r, il) * r.n_stream
        k = row_bytes(r.cache_type_k, hk * meta.n_head_kv[il]) * cells
        if mla:
            v = 0  # MLA caches one latent (K); recent builds keep no V
        else:
            # without flash attention V is stored transposed, every layer as wide as the widest
            width = hv * meta.n_head_kv[il] if r.flash_attn else v_max
            v = row_bytes(r.cache_type_v, width) * cells
        out[il] = k + v
    if meta.indexer_dim and meta.architecture not in NO_MEMORY_ARCHS:
        # the sparse-attention indexer's own cache: one key head per cell (and a V row where
        # the model is not MLA), in the cache types of K and V
        for il, own in enumerate(meta.indexer_layers):
            if not own:
                continue
            cells = kv_cells(meta, r, il) * r.n_stream
            n = row_bytes(r.cache_type_k, meta.indexer_dim) * cells
            if meta.indexer_v_dim:
                n += row_bytes(r.cache_type_v, meta.indexer_v_dim) * cells
            out[il] = out.get(il, 0) + n
    return out


def _dsv4_kv_bytes(meta: ModelMeta, r: Resolved) -> dict[int, int]:
    """DeepSeek-V4's caches (llama-kv-cache-dsv4.cpp), K only, one stream per sequence even
    when the server's cache is unified: the raw sliding-window cache of every layer (an iswa
    cache of n_swa + n_ubatch cells), and on compressing layers a cache of one entry per
    `ratio` cells (padded to 256), which on CSA layers the indexer's key cache shares.
    The compressor states beside them are separate buffers, not counted here."""
    n_stream = r.n_seq
    base = r.n_ctx_seq
    swa = swa_cells(meta, r)  # used where a layer slides (a sliding window is set)
    hk = meta.head_dim_k or 0
    out: dict[int, int] = {}
    for il in kv_layers(meta):
        width = row_bytes(r.cache_type_k, hk * meta.n_head_kv[il])
        slides = bool(meta.swa_layers and meta.swa_layers[il] and meta.sliding_window)
        n = width * (swa if slides else base)
        ratio = meta.compress_ratios[il] if il < len(meta.compress_ratios) else 0
        if ratio in (DSV4_CSA_RATIO, DSV4_HCA_RATIO):
            comp = pad(max(1, -(-base // ratio)), 256)
            n += width * comp
            if meta.indexer_layers and meta.indexer_layers[il]:
                n += row_bytes(r.cache_type_k, meta.indexer_dim) * comp
        out[il] = n * n_stream
    return out


def recurrent_row_floats(meta: ModelMeta) -> tuple[int, int]:
    """(conv/shift state, SSM/WKV state) floats per sequence of one recurrent layer."""
    if meta.rwkv is not None:
        return (meta.rwkv.token_shift_count * meta.n_embd, meta.n_embd * meta.rwkv.head_size)
    if meta.shortconv_l_cache:
        return (meta.n_embd * (meta.shortconv_l_cache - 1), 0)
    la = meta.linear_attn
    if la is not None:
        # llama_hparams::n_embd_r / n_embd_s: KDA convolves Q, K and V (d_conv - 1, 3 when
        # unset) over n_head() x head_dim; both keep a head_dim x head_dim state per head
        d_inner = la.n_head * la.head_dim
        conv = 3 * (la.conv_kernel - 1 if la.conv_kernel > 0 else 3) * d_inner if la.kda else 0
        return (conv, la.head_dim * la.head_dim * la.n_head)
    if meta.ssm is not None:
        ssm = meta.ssm
        conv = max(ssm.conv_kernel - 1, 0) * (ssm.inner_size + 2 * ssm.group_count * ssm.state_size)
        return (conv, ssm.state_size * ssm.inner_size)
    return (0, 0)


def recurrent_bytes_per_layer(meta: ModelMeta, r: Resolved) -> dict[int, int]:
    if not meta.is_recurrent:
        return {}
    rows = max(1, r.n_seq)
    conv, state = recurrent_row_floats(meta)
    per = (conv + state) * 4 * rows  # both states are F32
    out = {il: per for il, rec in enumerate(meta.recurrent_layers) if rec}
    for il, ple in enumerate(meta.ple_layers):
        if ple and il in out:  # a PLE layer's n-gram conv history, F32, beside its states
            out[il] += meta.ple_conv_floats * 4 * rows
    return out


def output_bytes(meta: ModelMeta, r: Resolved, *, embeddings: bool) -> int:
    """llama_context::output_reserve: logits (and embeddings) of n_seq outputs, F32."""
    n_out = r.n_seq
    logits = (meta.vocab_size or 0) * n_out
    embd = meta.n_embd * n_out if embeddings else 0
    return (logits + embd) * 4


@while_paused
def estimate(
    meta: ModelMeta,
    settings: LaunchSettings = LaunchSettings(),  # noqa: B008 - frozen, shared safely
    gpus: Sequence[Gpu] = (),
    *,
    embeddings: bool | None = None,
    mmproj: ModelMeta | None = None,
    mmproj_offload: bool = True,
    rules: EngineRules = EngineRules(),
    compute: bool = True,
    cpu: CpuTarget | None = None,
) -> Footprint:
    """Every buffer one launch allocates, per GPU and in host memory.

    `compute=False` leaves the compute buffers at zero: the cheap part of a plan, which fit
    searches use to narrow down before confirming with the full estimate.
    `mmproj` is the projector's metadata: its weights go to the first GPU (llama-server's
    default `--mmproj-offload`) or to the CPU.
    `cpu` is the CPU backend's features (`qmgui.core.repack`): with them the repacked copies
    are exact (`repack`, in the host total); without them only bounded (`repack_bound`)."""
    if embeddings is None:
        # the server's --embedding mode: embedding and rerank models, pooled models; a
        # non-causal LLM (the diffusion models) is started without it
        embeddings = is_embedding(meta)
    r = resolve(meta, settings, embeddings=embeddings)
    n_gpu_layers = (
        meta.n_layer + 1
        if settings.n_gpu_layers is None or settings.n_gpu_layers < 0
        else settings.n_gpu_layers
    )
    if not gpus:
        n_gpu_layers = 0
    layer_dev = layer_device_map(meta, gpus, n_gpu_layers, settings.tensor_split)
    names = [g.name for g in gpus] + [CPU]
    acc: dict[str, dict[str, int]] = {n: {} for n in names}

    def add(dev: str, kind: str, n: int) -> None:
        acc[dev][kind] = acc[dev].get(kind, 0) + n

    backends = {g.name: g.backend for g in gpus}
    notes: list[str] = []
    cpu = _cpu_of(cpu, rules)
    repacked = _repacked(meta, layer_dev, settings, gpus=gpus, cpu=cpu, notes=notes)
    for dev, n in _weights(meta, layer_dev, settings, backends, repacked.names()).items():
        add(dev, "weights", n)
    # the host's weights are the mapped span with mmap on; the copies are their own part
    add(CPU, "mapped", acc[CPU].get("weights", 0) if settings.mmap else 0)
    add(CPU, "repack", repacked.total)
    add(CPU, "repack_bound", repacked.total)
    for il, n in kv_bytes_per_layer(meta, r, rules).items():
        add(layer_dev[il] if settings.kv_offload else CPU, "kv", n)
    for il, n in recurrent_bytes_per_layer(meta, r).items():
        add(layer_dev[il] if settings.kv_offload else CPU, "recurrent", n)
    add(CPU, "output", output_bytes(meta, r, embeddings=embeddings))
    bounds: list[Bound] = []
    proj_dev = gpus[0].name if gpus and mmproj_offload else CPU
    add(proj_dev, "weights", mmproj.weight_bytes if mmproj is not None else 0)
    if compute:
        found = _compute(
            meta,
            r,
            layer_dev,
            embeddings=embeddings,
            notes=notes,
            gpus=gpus,
            settings=settings,
            mixed_batch=rules.mixed_batch,
            bounds=bounds,
        )
        for b in _projector_compute(mmproj, proj_dev, settings):
            bounds.append(b)
            found[b.device] = found.get(b.device, 0) + b.bytes
        for dev, n in found.items():
            add(dev, "compute", n)
    for g in gpus:  # the backend's context on every card (0 for backends not charged)
        add(g.name, "other", context_bytes(g))
    notes.extend(_context_note(gpus))
    unknown = cpu is None or not cpu.known
    repack = _repack_bound(meta, layer_dev, settings) if settings.repack and unknown else 0
    if repack:
        # which matmul weights a CPU repacks depends on its features and the build: without
        # them the copies are only bounded, beside the total (the span stays in it)
        add(CPU, "repack_bound", repack)
        notes.append(
            f"CPU repacking may copy up to {format_bytes(repack)} of weights into buffers of "
            "their own (the CPU's features are not known to the plan); --no-repack turns "
            "it off"
        )
    devices = tuple(DeviceFootprint(name=n, **acc[n]) for n in names)
    return Footprint(
        settings=r,
        n_gpu_layers=n_gpu_layers,
        layer_devices=layer_dev,
        devices=devices,
        notes=tuple(notes),
        bounds=tuple(bounds),
    )


def _projector_compute(mmproj: ModelMeta | None, device: str, s: LaunchSettings) -> list[Bound]:
    """clip.cpp's own compute buffer, on the projector's device (its warm-up reserves it, the
    largest image grows it): not modelled, charged as a bound. None: no projector."""
    if mmproj is None:
        return []
    n, why = projector_compute_bound(mmproj, flash_attn=s.flash_attn)
    return [Bound("projector compute", device, n, why)]


# GPU backends with a host buffer type (ggml_backend_dev_host_buffer_type): llama.cpp's
# make_cpu_buft_list puts the first one ahead of the CPU's extra buffer types, so the CPU
# layers' matmul weights go there (and, with mmap, back to the plain CPU buffer:
# llama_model_loader::create_tensor, "avoid using a host buffer when using mmap") and are
# never repacked. Metal, RPC and the CPU have none.
HOST_BUFFER_BACKENDS = frozenset({"cuda", "rocm", "hip", "vulkan", "sycl", "cann"})


TIED_OUTPUT = "output.weight (token_embd.weight, tied)"


def _on_cpu(
    meta: ModelMeta, layer_dev: Sequence[str], s: LaunchSettings
) -> Iterator[tuple[TensorEntry, _Placed]]:
    """The weights that stay in host memory (a layer on the CPU, its experts on the CPU with
    --cpu-moe/--n-cpu-moe, the output on the CPU), token embeddings left out (gathered, not
    multiplied)."""
    for t, p in zip(meta.tensors, _table(meta), strict=True):
        if p.role != _INPUT and _device(p.role, p.layer, p.expert, layer_dev, s) == CPU:
            yield t, p


def _device(
    role: int, layer: int, expert: bool, layer_dev: Sequence[str], s: LaunchSettings
) -> str:
    """Where llama.cpp's loader puts a tensor: the input layer on the CPU, the output layer
    on its device, experts on the CPU under --cpu-moe / --n-cpu-moe, the rest with their
    layer (layer_dev: per layer, and the output layer last)."""
    if role == _INPUT:
        return CPU
    if role == _OUTPUT:
        return layer_dev[-1]
    if expert and (s.cpu_moe or layer < s.n_cpu_moe):
        return CPU
    return layer_dev[layer]


def cpu_weights(meta: ModelMeta, layer_dev: Sequence[str], s: LaunchSettings) -> list[Weight]:
    """The weights llama.cpp's loader offers the CPU's buffer types, with the op each is used
    by; a tied output (no output.weight) adds the token embedding's duplicate as a matmul."""
    out = [
        Weight(t.name, t.dtype, t.shape, t.nbytes, weight_op(t.name, t.shape))
        for t, _ in _on_cpu(meta, layer_dev, s)
    ]
    if meta.tied_embeddings and layer_dev[meta.n_layer] == CPU:
        embd = next((t for t in meta.tensors if t.name == "token_embd.weight"), None)
        if embd is not None:
            # created again under the output layer (TENSOR_DUPLICATED), tried with MUL_MAT
            out.append(Weight(TIED_OUTPUT, embd.dtype, embd.shape, embd.nbytes, MUL_MAT))
    return out


def _repacked(
    meta: ModelMeta,
    layer_dev: Sequence[str],
    s: LaunchSettings,
    *,
    gpus: Sequence[Gpu],
    cpu: CpuTarget | None,
    notes: list[str],
) -> Repacked:
    """The CPU_REPACK / AMX copies of this launch (none without `cpu`, with --no-repack, or
    behind a GPU's host buffer type)."""
    if not s.repack or cpu is None:
        return Repacked()
    if not cpu.known:
        notes.append(
            f"CPU repacking rules start at llama.cpp b{FIRST_KNOWN_BUILD}; this build's copies "
            "are not predicted"
        )
        return Repacked()
    host_buft = next((g for g in gpus if g.backend in HOST_BUFFER_BACKENDS and not g.remote), None)
    if host_buft is not None:
        if CPU in layer_dev:
            notes.append(
                f"the CPU layers' weights go through {host_buft.name}'s host buffer type and "
                "are not repacked (llama.cpp's make_cpu_buft_list; not measured here)"
            )
        return Repacked()
    got = place(cpu_weights(meta, layer_dev, s), cpu)
    if got.total:
        kinds = sorted({f"{p.buffer} {p.layout}" for p in got.weights})
        notes.append(
            f"CPU repacking copies {len(got.weights)} weights ({format_bytes(got.total)}: "
            f"{', '.join(kinds)}) on a CPU with {_feature_text(cpu)} ({cpu.source}); "
            "--no-repack turns it off"
        )
    return got


def _cpu_of(cpu: CpuTarget | None, rules: EngineRules) -> CpuTarget | None:
    """The given CPU, else the rules' one, with the rules' build where it names none."""
    cpu = cpu if cpu is not None else rules.cpu
    if cpu is not None and cpu.build is None and rules.build is not None:
        cpu = replace(cpu, build=rules.build)
    return cpu


def _feature_text(cpu: CpuTarget) -> str:
    shown = [f for f in _SHOWN_FEATURES if f in cpu.features]
    return "+".join(shown) if shown else "no repacking features"


_SHOWN_FEATURES = ("AVX2", "AVX512", "AVX512_VNNI", "AMX_INT8", "NEON", "DOTPROD", "MATMUL_INT8")


def _repack_bound(meta: ModelMeta, layer_dev: Sequence[str], s: LaunchSettings) -> int:
    """Bytes of the CPU-resident weights a repacking CPU backend may copy: every layer and
    output tensor (token embeddings are gathered, not multiplied), each padded."""
    key = ("repack_bound", id(meta), tuple(layer_dev), s.cpu_moe, s.n_cpu_moe)
    hit = _placed_get(key, meta)
    if not isinstance(hit, int):
        hit = _bound_repack(meta, layer_dev, s)
        _placed_put(key, meta, hit)
    return hit


def _bound_repack(meta: ModelMeta, layer_dev: Sequence[str], s: LaunchSettings) -> int:
    """_on_cpu's weights summed, each padded, a group (role, layer, experts) at a time."""
    return sum(
        n
        for (role, layer, expert), n in _repack_groups(meta).items()
        if _device(role, layer, expert, layer_dev, s) == CPU
    )


def _repack_groups(meta: ModelMeta) -> dict[tuple[int, int, bool], int]:
    """Per (role, layer, expert) group of the layer and output tensors, their bytes each
    padded as a repack buffer aligns a copy (256 bytes a tensor bounds the padding)."""
    key = ("repack_groups", id(meta))
    hit = _placed_get(key, meta)
    if isinstance(hit, dict):
        return hit
    groups: dict[tuple[int, int, bool], int] = {}
    get = groups.get
    for role, layer, expert, _offset, n, _file, _cuda, _vk in _table(meta):
        if role != _INPUT:  # token embeddings are gathered, not multiplied
            k = (role, layer, expert)
            groups[k] = get(k, 0) - (-n // REPACK_ALIGNMENT) * REPACK_ALIGNMENT  # pad, inline
    _placed_put(key, meta, groups)
    return groups


def _compute(
    meta: ModelMeta,
    r: Resolved,
    layer_dev: Sequence[str],
    *,
    embeddings: bool,
    notes: list[str],
    gpus: Sequence[Gpu] = (),
    settings: LaunchSettings = LaunchSettings(),  # noqa: B008 - frozen, shared safely
    mixed_batch: bool = False,
    bounds: list[Bound] | None = None,
) -> dict[str, int]:
    """Compute buffers: one per backend that runs part of the graph.

    CPU only: the replayed graph (`core.compute`, exact on the CPU backend). One local GPU:
    llama.cpp's scheduler replayed over that graph (`core.sched`: the GPU's buffer and the
    host's, exact on an H200 with Vulkan, partial offload included); CUDA keeps at least the
    older figure below until a CUDA run measures it. Several GPUs or RPC devices: each GPU
    gets the graph's size, plus under partial offload a copy of the largest CPU-resident
    weight, which llama.cpp moves into the GPU's compute buffer for large-batch matmuls;
    remote (RPC) devices do not.
    Where the graph has no layout (SizingError), every device that runs part of it is charged
    `core.bounds.compute_bound` instead, each listed in `bounds`.
    """
    if bounds is None:
        bounds = []
    graph, why = _graph_or_bound(meta, r, embeddings=embeddings, mixed_batch=mixed_batch)
    devices = list(dict.fromkeys(layer_dev))
    used = [d for d in devices if d != CPU]
    if not used:
        if why is not None:
            bounds.append(Bound("compute", CPU, graph, why))
        return {CPU: graph}
    remote = frozenset(g.name for g in gpus if g.remote)
    copy = 0
    if CPU in devices:
        copy = max(
            (t.nbytes for t in _table(meta) if t.role == _LAYER and layer_dev[t.layer] == CPU),
            default=0,
        )
    local = [g for g in gpus if g.name in used and not g.remote]
    if why is None and len(used) == 1 and len(local) == 1:
        try:
            return _one_gpu(
                meta,
                r,
                layer_dev,
                local[0],
                older=graph + copy,
                embeddings=embeddings,
                notes=notes,
                s=settings,
                mixed_batch=mixed_batch,
                bounds=bounds,
            )
        except SizingError as e:
            # the scheduler's walk could not be replayed: the graph bounds each device instead
            why = compute_bound_why(str(e))
            graph = max(graph, compute_bound(meta, r, embeddings=embeddings))
    if why is None:
        notes.append("GPU compute buffers are estimated from the CPU graph (not measured on a GPU)")
    # the copy is the local GPU backends' choice (offload_op); an RPC device gets none
    # (measured on loopback: its compute buffer stays below the graph under partial offload)
    out = {g: graph + (0 if g in remote else copy) for g in used}
    if CPU in devices:
        out[CPU] = graph
    if why is not None:
        bounds.extend(Bound("compute", d, n, why) for d, n in out.items())
    if CPU in devices:
        return out
    # every layer on GPUs: the host keeps the graph's inputs (an estimate, the same for all)
    if kv_layers(meta) or meta.is_recurrent:
        out[CPU] = host_inputs_bytes(meta, r)
    else:
        # encoders (no KV cache): the token embeddings gathered on the CPU and the outputs
        # copied back (small, not measured here)
        out[CPU] = (meta.n_embd * r.n_ubatch + (meta.vocab_size or 0) * r.n_seq) * 4
    return out


def _graph_or_bound(
    meta: ModelMeta, r: Resolved, *, embeddings: bool, mixed_batch: bool
) -> tuple[int, str | None]:
    """The CPU graph's compute buffer and None, or where it has no layout, its bound and why."""
    try:
        return compute_buffer_bytes(meta, r, embeddings=embeddings, mixed_batch=mixed_batch), None
    except SizingError as e:
        return compute_bound(meta, r, embeddings=embeddings), compute_bound_why(str(e))


def _one_gpu(
    meta: ModelMeta,
    r: Resolved,
    layer_dev: Sequence[str],
    gpu: Gpu,
    *,
    older: int,
    embeddings: bool,
    notes: list[str],
    s: LaunchSettings,
    mixed_batch: bool = False,
    bounds: list[Bound] | None = None,
) -> dict[str, int]:
    """One local GPU and the host: the scheduler's walk (core.sched). `older` is the CPU
    graph plus the largest CPU-resident weight, the figure used before the walk existed.
    Raises SizingError where the walk cannot be replayed. The bound the walk adds for an
    unfused delta net (recurrent layers in host memory) goes to `bounds`."""
    n = meta.n_layer
    host_layers = frozenset(il for il in range(n) if layer_dev[il] == CPU)
    offload = Offload(
        backend=gpu.backend,
        host_layers=host_layers,
        host_experts=frozenset(range(n)) if s.cpu_moe else frozenset(range(min(s.n_cpu_moe, n))),
        host_caches=host_layers if s.kv_offload else frozenset(range(n)),
        output_on_host=layer_dev[n] == CPU,
    )
    found = sched_compute_bytes(meta, r, offload, embeddings=embeddings, mixed_batch=mixed_batch)
    for note in found.notes:
        if "carries a bound" in note and bounds is not None:  # sched's unfused delta net
            extra = _unfused_delta_net_bound(meta, r, embeddings)
            bounds.append(Bound("compute", gpu.name, extra, note))
        else:
            notes.append(note)
    gpu_bytes = found.gpu
    if gpu.backend != "vulkan" or not s.kv_offload:
        # measured with Vulkan and the KV cache on the GPU; elsewhere (CUDA: no reordering,
        # its own kernels; -nkvo: llama.cpp pins attention to the CPU) keep the older figure
        # as a floor
        gpu_bytes = max(gpu_bytes, older)
        notes.append(
            f"{gpu.name} compute buffer: llama.cpp's scheduler replayed, not measured on "
            f"{'this backend' if s.kv_offload else 'a KV cache in host memory'}"
        )
    return {gpu.name: gpu_bytes, CPU: found.host}


# below the 0.01 MiB a buffer line prints: positions, output ids and such, per mask (fitted)
_HOST_INPUTS_SMALL = 8 * 1024


def host_inputs_bytes(meta: ModelMeta, r: Resolved) -> int:
    """The host compute buffer when every layer runs on GPUs (`Vulkan_Host`, `CUDA_Host`, or a
    plain CPU buffer for RPC devices): the graph's inputs and the activations copied between
    host and device: two of n_embd x n_ubatch F32 (three without flash attention), and the
    attention masks, one over a stream's cells for the full-attention layers and one over the
    sliding-window cache's cells (F16 with flash attention, F32 without).

    Fitted on the CPU rpc-server here (flash attention on and off, 512-2048 cells, ubatch 256
    and 512) and checked against the H200 run in docs/gpu (Vulkan: dense, MoE, MLA, hybrid and
    sliding-window models, 1024-32768 tokens, 1-4 slots, full-size 4B-30B headers): exact to
    the printed 0.01 MiB. Pure recurrent models (no mask) come out ~1.1 MiB low; CUDA is not
    measured."""
    mask_elem = 2 if r.flash_attn else 4
    cells = {
        (
            bool(meta.swa_layers and meta.swa_layers[il] and meta.sliding_window),
            kv_cells(meta, r, il),
        )
        for il in kv_layers(meta)
    }
    mask = sum(n for _, n in cells) * r.n_ubatch * mask_elem
    acts = (2 if r.flash_attn else 3) * meta.n_embd * r.n_ubatch * 4
    return acts + mask + r.n_ubatch * 4 + _HOST_INPUTS_SMALL * max(len(cells), 1)
