"""Hostile model files for the attack tests: GGUF headers with any value in any key, and the
whole path a file takes through qmgui (header -> ModelMeta -> plan -> argv), measured.

`gguf_file` writes metadata of any Python value with the GGUF type that holds it (negative
ints as int64, huge ones as uint64, floats as float64, lists as arrays), and an optional
tensor table whose data really is in the file, so only the values are hostile, never the
framing. `through_qmgui` runs one path the way the CLI and the window do and returns how long
it took and the peak of traced memory; anything but a QmguiError propagates (a test failure).
"""

from __future__ import annotations

import contextlib
import math
import struct
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from qmgui.core.discovery import ModelEntry, entry_for_path
from qmgui.core.emit.llama import emit_llama
from qmgui.core.emit.vllm import emit_vllm
from qmgui.core.errors import QmguiError
from qmgui.core.fit import Budget, check, max_context
from qmgui.core.footprint import Gpu
from qmgui.core.launch import LaunchSettings
from qmgui.core.vllm import plan_vllm
from tests.core.gguf_bytes import gstr, header

GIB = 1 << 30

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


def _scalar_type(v: Any) -> int:
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        if 0 <= v < 1 << 32:
            return U32
        if 0 <= v < 1 << 64:
            return U64
        return I64
    if isinstance(v, float):
        return F64
    if isinstance(v, str):
        return STRING
    raise TypeError(f"no GGUF type for {v!r}")


_FMT = {BOOL: "?", U32: "I", U64: "Q", I64: "q", F64: "d", I32: "i", F32: "f"}


def _scalar(vtype: int, v: Any) -> bytes:
    if vtype == STRING:
        return gstr(v)
    return struct.pack("<" + _FMT[vtype], v)


def _elem_type(values: Sequence[Any]) -> int:
    types = {_scalar_type(v) for v in values}
    if not types:
        return U32
    if types <= {U32, U64, I64}:
        return I64 if I64 in types else (U64 if U64 in types else U32)
    if len(types) == 1:
        return types.pop()
    return F64 if types <= {U32, U64, I64, F64} else STRING


def kv(key: str, value: Any) -> bytes:
    """One metadata pair; an int beyond int64/uint64 is clipped into range (GGUF cannot hold
    it), a list becomes an array of one element type."""
    if isinstance(value, (list, tuple)):
        et = _elem_type(value)
        vals = [_coerce(et, v) for v in value]
        body = b"".join(_scalar(et, v) for v in vals)
        return gstr(key) + struct.pack("<IIQ", ARRAY, et, len(vals)) + body
    vt = _scalar_type(_clip(value))
    return gstr(key) + struct.pack("<I", vt) + _scalar(vt, _clip(value))


def _clip(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        return max(-(1 << 63), min(v, (1 << 64) - 1))
    return v


def _coerce(et: int, v: Any) -> Any:
    if et == STRING:
        return v if isinstance(v, str) else repr(v)
    if et == F64:
        return float(v)
    if et == BOOL:
        return bool(v)
    if et == I64:
        return max(-(1 << 63), min(int(v), (1 << 63) - 1))
    return int(v)


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    ggml_type: int = 0  # F32


_TYPE_BYTES = {0: 4, 1: 2}  # F32, F16


def gguf_file(
    path: Path,
    metadata: dict[str, Any] | Iterable[tuple[str, Any]],
    tensors: Sequence[Tensor] = (),
) -> Path:
    """A GGUF v3 file with exactly these keys (in order) and tensors (zero data, aligned)."""
    pairs = list(metadata.items() if isinstance(metadata, dict) else metadata)
    out = bytearray(header(len(tensors), len(pairs)))
    for key, value in pairs:
        out += kv(key, value)
    offset = 0
    sizes = []
    for t in tensors:
        n = math.prod(t.shape) * _TYPE_BYTES[t.ggml_type]
        out += gstr(t.name) + struct.pack("<I", len(t.shape))
        out += b"".join(struct.pack("<Q", d) for d in t.shape)
        out += struct.pack("<IQ", t.ggml_type, offset)
        sizes.append(n)
        offset += -(-n // 32) * 32
    out += b"\0" * (-len(out) % 32)
    out += b"\0" * offset
    path.write_bytes(bytes(out))
    return path


def model_tensors(n_layer: int, n_embd: int, n_vocab: int) -> list[Tensor]:
    """A minimal table: the embeddings and one norm per layer (the block groups the header's
    block_count is checked against)."""
    out = [Tensor("token_embd.weight", (n_embd, n_vocab), 1)]
    out += [Tensor(f"blk.{il}.attn_norm.weight", (n_embd,)) for il in range(n_layer)]
    out.append(Tensor("output_norm.weight", (n_embd,)))
    return out


# --- the whole path ---------------------------------------------------------------------------

GPU24 = Gpu("GPU0", 24 * GIB)
PLANS: tuple[tuple[LaunchSettings, tuple[Gpu, ...]], ...] = (
    (LaunchSettings(), ()),  # CPU only
    (LaunchSettings(), (GPU24,)),  # one GPU, all layers
    (LaunchSettings(n_gpu_layers=2), (GPU24,)),  # partial offload
    (LaunchSettings(cache_type_k="q8_0", cache_type_v="q8_0", flash_attn="on"), ()),
    (LaunchSettings(parallel=2, kv_unified=False), (GPU24, replace(GPU24, name="GPU1"))),
)


def cli_plan(entry: ModelEntry) -> None:
    """What `qmgui plan` and `preview` do with one entry on a machine without GPUs: one plan
    and the command. Only a QmguiError may come out (and a step that raises one lets the next
    run)."""
    meta = entry.meta
    if meta is None:
        assert entry.error, "an entry without metadata must say why"
        return
    if entry.format == "gguf":
        _quietly(lambda: check(meta, LaunchSettings(), Budget()))
        _quietly(lambda: emit_llama(entry, LaunchSettings(), executable="llama-server", port=8080))
    else:
        _quietly(lambda: _vllm(entry, None))


def more_plans(entry: ModelEntry) -> None:
    """The other plans the window and `plan --gpu` make: GPUs, partial offload, separate KV
    streams, the largest context that fits."""
    meta = entry.meta
    if meta is None:
        return
    if entry.format == "gguf":
        for settings, gpus in PLANS:
            _quietly(lambda s=settings, g=gpus: check(meta, s, Budget(gpus=g)))
        _quietly(lambda: max_context(meta, LaunchSettings(), Budget(gpus=(GPU24,))))
    else:
        _quietly(lambda: _vllm(entry, GPU24.total_bytes))


def _vllm(entry: ModelEntry, total: int | None) -> None:
    assert entry.meta is not None
    plan = plan_vllm(entry.meta, gpu_total_bytes=total, budget_bytes=None)
    emit_vllm(entry, plan, executable="vllm", port=8000)


def _quietly(step: Callable[[], object]) -> None:
    with contextlib.suppress(QmguiError):
        step()


@dataclass(frozen=True)
class Measured:
    ms: float  # header -> metadata -> one plan -> argv (what `qmgui plan` does)
    full_ms: float  # the same and every plan in `more_plans`
    mib: float  # peak traced memory over all of it
    entry: ModelEntry


def through_qmgui(path: Path | str) -> Measured:
    """Read `path` as `plan` does (entry_for_path), plan and emit it, timed; then every other
    plan, timed; then all of it again under tracemalloc for the peak of memory allocated."""
    t0 = time.perf_counter()
    entry = entry_for_path(path)
    cli_plan(entry)
    t1 = time.perf_counter()
    more_plans(entry)
    t2 = time.perf_counter()
    tracemalloc.start()
    try:
        again = entry_for_path(path)
        cli_plan(again)
        more_plans(again)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return Measured((t1 - t0) * 1000, (t2 - t0) * 1000, peak / (1 << 20), entry)


@dataclass
class Worst:
    """The largest time and memory one file took, over a test module."""

    ms: float = 0.0
    full_ms: float = 0.0
    mib: float = 0.0
    files: int = 0
    slowest: str = ""

    def add(self, m: Measured, what: str) -> None:
        self.files += 1
        if m.ms > self.ms:
            self.ms, self.slowest = m.ms, what
        self.full_ms = max(self.full_ms, m.full_ms)
        self.mib = max(self.mib, m.mib)

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.files} files; slowest read + plan + argv {self.ms:.0f} ms "
            f"({self.slowest[:100]}); with every other plan {self.full_ms:.0f} ms; peak "
            f"traced memory {self.mib:.1f} MiB"
        )
