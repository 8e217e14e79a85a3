"""Header-only GGUF reader: metadata and tensor table without touching tensor data.

`gguf.GGUFReader` memory-maps the file and materialises every array, which costs seconds and
hundreds of MiB for a 150k-token vocabulary. Scanning a models folder needs only the header, so
this reader streams it in chunks, keeps small arrays, and records big ones (tokenizer tokens,
scores, merges) by element type and length only. Every length is checked against hard limits
and against the bytes left in the file before anything is allocated, so a truncated or hostile
file raises `ModelReadError` (naming the file, the offset and the problem) and never exhausts
memory. Reading a file is the only side effect; nothing is written.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol, Union

from qmgui.core.errors import ModelReadError
from qmgui.core.gguf_tables import GGML_TYPE_NAMES, GGML_TYPE_SIZES, GGUFValueType
from qmgui.core.safeio import open_regular

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32  # llama.cpp's GGUF_DEFAULT_ALIGNMENT when general.alignment is absent
GGML_MAX_DIMS = 4  # ggml tensors have at most four dimensions

# Hard limits. Real files stay far below them; a value beyond one is malformed or hostile.
MAX_KEY_LEN = 64 * 1024  # keys are dotted names; the longest real ones are ~60 bytes
MAX_STRING_LEN = 16 * 1024 * 1024  # chat templates reach a few hundred KiB
MAX_ARRAY_LEN = 1 << 20  # 4x the largest real vocabulary (Gemma 3: 262,144) or merge list
MAX_KV_COUNT = 1 << 16  # real files hold 20-60 keys
MAX_TENSOR_COUNT = 1 << 15  # merged-expert GGUFs hold ~1-2k tensors; old unmerged MoE up to ~30k
MAX_MATERIALISED_BYTES = 16 * 1024 * 1024  # total bytes of strings kept from one header
KEEP_ARRAY_MAX = 4096  # arrays longer than this are kept as ArrayInfo (type and length only)

_READ_CHUNK = 1 << 20  # bytes read per refill of the header window
_SKIP_WINDOW = 8 << 20  # window while skipping string arrays (a 150k vocabulary is ~2.5 MiB)
_SKIP_LOW_WATER = 1 << 20  # refill the skip window when less than this is left in it
_SKIP_BATCH = 4096  # strings per unchecked batch (a bad batch is redone by the checked loop)

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# value type -> (struct format char, size in bytes) for fixed-size scalars
_SCALARS: dict[int, tuple[str, int]] = {
    GGUFValueType.UINT8: ("B", 1),
    GGUFValueType.INT8: ("b", 1),
    GGUFValueType.UINT16: ("H", 2),
    GGUFValueType.INT16: ("h", 2),
    GGUFValueType.UINT32: ("I", 4),
    GGUFValueType.INT32: ("i", 4),
    GGUFValueType.FLOAT32: ("f", 4),
    GGUFValueType.BOOL: ("?", 1),
    GGUFValueType.UINT64: ("Q", 8),
    GGUFValueType.INT64: ("q", 8),
    GGUFValueType.FLOAT64: ("d", 8),
}
_SCALAR_STRUCTS = {t: struct.Struct("<" + fmt) for t, (fmt, _) in _SCALARS.items()}
_STRING = int(GGUFValueType.STRING)
# ggml type id -> (block size in elements, bytes per block)
_TYPE_SIZES: dict[int, tuple[int, int]] = GGML_TYPE_SIZES
_DIMS = {n: "<" + "Q" * n for n in range(1, GGML_MAX_DIMS + 1)}
_ARRAY = int(GGUFValueType.ARRAY)


@dataclass(frozen=True)
class ArrayInfo:
    """An array kept by element type and length only (e.g. the tokenizer's token list)."""

    elem_type: int
    count: int


MetaValue = Union[int, float, bool, str, tuple["MetaValue", ...], ArrayInfo]  # noqa: UP007 - a runtime alias needs Union on 3.10


class TensorInfo(NamedTuple):
    """One row of the tensor table; `shape` is in GGUF order (ne0, the row length, first).

    A named tuple rather than a dataclass: headers hold thousands of these, and building a
    tuple costs a fraction of a frozen dataclass's __init__."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int  # relative to the start of the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    """Everything in a GGUF file except the tensor data."""

    path: str
    version: int
    file_size: int
    metadata: Mapping[str, MetaValue]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # absolute offset of the data section

    def get(self, key: str, default: MetaValue | None = None) -> MetaValue | None:
        return self.metadata.get(key, default)


_TYPE_NAMES: dict[int, str] = GGML_TYPE_NAMES


def ggml_type_name(ggml_type: int) -> str:
    """The ggml type's name (Q4_K, F16...); a dict lookup, as headers ask thousands of times."""
    return _TYPE_NAMES.get(ggml_type, f"type{ggml_type}")


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of this type and shape (whole quantisation blocks along ne0)."""
    block, type_size = _TYPE_SIZES[ggml_type]
    n = 1
    for d in shape:
        n *= d
    return n // block * type_size


def read_gguf_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the header of one GGUF file; raises ModelReadError for anything malformed, and
    for a path that is not a regular file (a FIFO, socket or device is never opened)."""
    fspath = os.fspath(path)
    try:
        with open_regular(fspath) as f:
            size = os.fstat(f.fileno()).st_size
            return _Parser(f, fspath, size).parse()
    except ModelReadError:
        raise
    except (struct.error, OverflowError, ValueError) as e:
        # every length is checked before use, so this is a reader bug; still the user's
        # file is what triggered it, and the scan must go on
        raise ModelReadError(fspath, f"malformed header ({type(e).__name__}: {e})") from e
    except IsADirectoryError as e:
        raise ModelReadError(fspath, "is a folder, not a GGUF file") from e
    except FileNotFoundError as e:
        raise ModelReadError(fspath, "file vanished before it could be read; rescan") from e
    except PermissionError as e:
        raise ModelReadError(fspath, "permission denied; check the file's permissions") from e
    except OSError as e:
        raise ModelReadError(fspath, f"could not be read ({e.strerror or e})") from e


class ByteSource(Protocol):
    """Where the reader gets its bytes: a file opened for binary reading, or anything with the
    same two calls (qmgui.remote reads a URL's header with HTTP range requests through it).
    The reader seeks forward only and asks for windows of at least `_READ_CHUNK` bytes."""

    def seek(self, offset: int, /) -> object: ...

    def readinto(self, buffer: memoryview, /) -> int | None: ...


def read_gguf_header_from(source: ByteSource, name: str, size: int) -> GGUFHeader:
    """Read the header of a GGUF of `size` bytes from `source` (a byte-source seam for readers
    other than a local file); `name` is what errors and the header's `path` say. Raises
    ModelReadError for anything malformed; the source's own errors pass through."""
    try:
        return _Parser(source, name, size).parse()
    except ModelReadError:
        raise
    except (struct.error, OverflowError, ValueError) as e:
        raise ModelReadError(name, f"malformed header ({type(e).__name__}: {e})") from e


_local = threading.local()


def _scratch(size: int) -> bytearray:
    """A per-thread window buffer, reused across files: a fresh multi-MiB buffer per file costs
    more in page faults than parsing the header does."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < size:
        # one read's worth first (one small header: no 9 MiB to fault in); then it grows to
        # what the headers read on this thread needed, at least doubling
        grown = max(size, _READ_CHUNK, 2 * len(buf) if buf is not None else 0)
        buf = bytearray(min(grown, max(size, _SKIP_WINDOW + _READ_CHUNK)))
        _local.buf = buf
    return buf


class _Cursor:
    """A forward-only window over the file: `buf[pos]` is the byte at offset `base + pos`, and
    only `buf[:end]` holds this file's bytes (the buffer is reused, the rest is stale)."""

    __slots__ = ("base", "buf", "end", "file", "path", "pos", "size")

    def __init__(self, f: ByteSource, path: str, size: int) -> None:
        self.file = f
        self.path = path
        self.size = size
        self.buf = _scratch(0)
        self.end = 0
        self.base = 0
        self.pos = 0

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def fail(self, reason: str, offset: int | None = None) -> ModelReadError:
        return ModelReadError(self.path, reason, offset=self.offset if offset is None else offset)

    def truncated(self, what: str, n: int) -> ModelReadError:
        left = self.size - self.offset
        return self.fail(
            f"file ends inside {what} ({n} bytes needed, {left} left); the file is truncated, "
            "perhaps an unfinished download: download it again"
        )

    def need(self, n: int, what: str) -> None:
        """Make `n` bytes available at `pos`, reading more of the file if needed."""
        if self.pos + n <= self.end:
            return
        start = self.offset
        if start + n > self.size:
            raise self.truncated(what, n)
        keep = self.end - self.pos
        want = min(max(n - keep, _READ_CHUNK), self.size - start - keep)
        if keep + want > len(self.buf):
            grown = _scratch(keep + want)
            grown[:keep] = self.buf[self.pos : self.end]
            self.buf = grown
        elif keep:
            self.buf[:keep] = self.buf[self.pos : self.end]
        self.file.seek(start + keep)
        got = self.file.readinto(memoryview(self.buf)[keep : keep + want])
        self.base = start
        self.pos = 0
        self.end = keep + (got or 0)
        if self.end < n:  # the file shrank while we read it
            raise self.truncated(what, n)

    def jump(self, offset: int, what: str) -> None:
        """Move to an absolute offset at or after the current one."""
        if offset > self.size:
            raise self.truncated(what, offset - self.offset)
        if offset <= self.base + self.end:
            self.pos = offset - self.base
        else:
            self.end = 0
            self.base = offset
            self.pos = 0

    def scalar(self, vtype: int, what: str) -> int | float | bool:
        st = _SCALAR_STRUCTS[vtype]
        self.need(st.size, what)
        (v,) = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v  # type: ignore[no-any-return]

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v  # type: ignore[no-any-return]

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v  # type: ignore[no-any-return]

    def string(self, what: str, limit: int) -> str:
        at = self.offset
        n = self.u64(f"the length of {what}")
        if n > limit:
            raise self.fail(f"{what} claims {n} bytes, over the limit of {limit}", at)
        self.need(n, what)
        s = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_strings(self, count: int, what: str) -> None:
        """Skip `count` length-prefixed strings: the hot loop of a tokenizer-sized header.

        Batches run an unchecked, unrolled loop over the in-memory window (a bad length makes
        `unpack_from` fail or leaves `pos` outside the window); a batch that fails is redone by
        the checked loop, which refills the window and names the bad element.
        """
        unpack = _U64.unpack_from
        left = count
        while left:
            ahead = self.end - self.pos
            if ahead < _SKIP_LOW_WATER and self.offset + ahead < self.size:
                self.need(min(self.size - self.offset, _SKIP_WINDOW), what)
            batch = min(left, _SKIP_BATCH)
            buf = self.buf
            end = self.end
            pos = self.pos
            try:
                for _ in range(batch >> 3):
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                    pos += 8 + unpack(buf, pos)[0]
                for _ in range(batch & 7):
                    pos += 8 + unpack(buf, pos)[0]
            except (struct.error, OverflowError):  # a length ran outside the window
                pos = -1
            if 0 <= pos <= end:  # pos only grows, so a batch that ran past `end` ends past it
                self.pos = pos
            else:
                self.skip_strings_checked(batch, what)
            left -= batch

    def skip_strings_checked(self, count: int, what: str) -> None:
        for _ in range(count):
            at = self.offset
            n = self.u64(f"the length of a string in {what}")
            if n > MAX_STRING_LEN:
                raise self.fail(
                    f"a string in {what} claims {n} bytes, over the limit of {MAX_STRING_LEN}", at
                )
            self.jump(self.offset + n, what)


class _Parser:
    def __init__(self, f: ByteSource, path: str, size: int) -> None:
        self.c = _Cursor(f, path, size)
        self.kept_bytes = 0
        self.alignment_value = DEFAULT_ALIGNMENT

    def parse(self) -> GGUFHeader:
        c = self.c
        if c.size < 24:  # magic + version + two u64 counts
            raise c.fail(f"only {c.size} bytes long; a GGUF header needs at least 24", 0)
        c.need(4, "the magic")
        magic = bytes(c.buf[:4])
        c.pos = 4
        if magic != GGUF_MAGIC:
            raise c.fail(f"not a GGUF file (starts with {magic!r}, expected b'GGUF')", 0)
        version = c.u32("the version")
        if version not in SUPPORTED_VERSIONS:
            if version & 0xFFFF == 0 and version >> 16:
                raise c.fail("big-endian GGUF is not supported; use the little-endian file", 4)
            raise c.fail(f"GGUF version {version} is not supported (only 2 and 3)", 4)
        n_tensors = c.u64("the tensor count")
        n_kv = c.u64("the metadata key count")
        if n_tensors > MAX_TENSOR_COUNT:
            raise c.fail(f"claims {n_tensors} tensors, over the limit of {MAX_TENSOR_COUNT}", 8)
        if n_kv > MAX_KV_COUNT:
            raise c.fail(f"claims {n_kv} metadata keys, over the limit of {MAX_KV_COUNT}", 16)
        metadata = self.read_metadata(n_kv)
        alignment = self.alignment_value = self.alignment(metadata)
        tensors = self.read_tensor_infos(n_tensors)
        header_end = c.offset
        data_offset = -(-header_end // alignment) * alignment
        self.check_tensor_data(tensors, data_offset)
        return GGUFHeader(
            path=c.path,
            version=version,
            file_size=c.size,
            metadata=metadata,
            tensors=tensors,
            alignment=alignment,
            data_offset=data_offset,
        )

    def read_metadata(self, n_kv: int) -> dict[str, MetaValue]:
        c = self.c
        out: dict[str, MetaValue] = {}
        for i in range(n_kv):
            at = c.offset
            key = c.string(f"metadata key #{i}", MAX_KEY_LEN)
            if key in out:
                raise c.fail(f"duplicate metadata key {key!r}", at)
            vtype = c.u32(f"the type of {key!r}")
            out[key] = self.value(vtype, key, depth=0)
        return out

    def value(self, vtype: int, key: str, *, depth: int) -> MetaValue:
        c = self.c
        if vtype in _SCALAR_STRUCTS:
            return c.scalar(vtype, f"the value of {key!r}")
        if vtype == _STRING:
            at = c.offset
            s = c.string(f"the value of {key!r}", MAX_STRING_LEN)
            self.keep(len(s), key, at)
            return s
        if vtype == _ARRAY:
            return self.array(key, depth=depth)
        raise c.fail(f"unknown value type {vtype} for key {key!r}", c.offset - 4)

    def array(self, key: str, *, depth: int) -> MetaValue:
        c = self.c
        at = c.offset
        etype = c.u32(f"the element type of {key!r}")
        count = c.u64(f"the length of {key!r}")
        if count > MAX_ARRAY_LEN:
            raise c.fail(
                f"array {key!r} claims {count} elements, over the limit of {MAX_ARRAY_LEN}", at
            )
        if etype in _SCALARS:
            min_size = _SCALARS[etype][1]
        elif etype in (_STRING, _ARRAY):
            min_size = 8 if etype == _STRING else 12
        else:
            raise c.fail(f"unknown element type {etype} in array {key!r}", at)
        if count * min_size > c.size - c.offset:
            raise c.truncated(f"array {key!r} of {count} elements", count * min_size)
        keep = count <= KEEP_ARRAY_MAX and not key.startswith("tokenizer.ggml.")
        if etype in _SCALARS:
            fmt, size = _SCALARS[etype]
            if not keep:
                c.jump(c.offset + count * size, f"array {key!r}")
                return ArrayInfo(etype, count)
            c.need(count * size, f"array {key!r}")
            values = struct.unpack_from(f"<{count}{fmt}", c.buf, c.pos)
            c.pos += count * size
            return values
        if etype == _STRING:
            if not keep:
                c.skip_strings(count, f"array {key!r}")
                return ArrayInfo(etype, count)
            items = []
            for j in range(count):
                s_at = c.offset
                s = c.string(f"element {j} of {key!r}", MAX_STRING_LEN)
                self.keep(len(s), key, s_at)
                items.append(s)
            return tuple(items)
        # nested arrays: legal in GGUF, unused by real models; read them but keep only lengths
        if depth >= 2:
            raise c.fail(f"array {key!r} is nested more than two levels deep", at)
        for _ in range(count):
            self.array(key, depth=depth + 1)
        return ArrayInfo(etype, count)

    def keep(self, n: int, key: str, at: int) -> None:
        self.kept_bytes += n
        if self.kept_bytes > MAX_MATERIALISED_BYTES:
            raise self.c.fail(
                f"metadata strings exceed {MAX_MATERIALISED_BYTES} bytes (at key {key!r})", at
            )

    def alignment(self, metadata: Mapping[str, MetaValue]) -> int:
        value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or value <= 0
            or value & (value - 1)
        ):
            raise self.c.fail(f"general.alignment is {value!r}; it must be a power of two")
        return value

    def read_tensor_infos(self, n_tensors: int) -> tuple[TensorInfo, ...]:
        """The tensor table; inlined, because old MoE files carry tens of thousands of rows.
        Error texts are built only on failure."""
        c = self.c
        what = "the tensor table"
        # name length + name (>=1) + n_dims + one dim + type + offset
        if n_tensors * 33 > c.size - c.offset:
            raise c.truncated(f"the table of {n_tensors} tensors", n_tensors * 33)
        tensors: list[TensorInfo] = []
        seen: set[str] = set()
        u32 = _U32.unpack_from
        u64 = _U64.unpack_from
        sizes = _TYPE_SIZES
        for _ in range(n_tensors):
            at = c.base + c.pos
            c.need(8, what)
            nlen = u64(c.buf, c.pos)[0]
            if nlen > MAX_KEY_LEN:
                raise c.fail(f"a tensor name claims {nlen} bytes, over the limit", at)
            c.need(12 + nlen, what)
            buf = c.buf
            pos = c.pos + 8
            name = buf[pos : pos + nlen].decode("utf-8", errors="replace")
            pos += nlen
            n_dims = u32(buf, pos)[0]
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise c.fail(f"tensor {name!r} has {n_dims} dimensions (1 to 4 allowed)", at)
            c.pos = pos + 4
            c.need(8 * n_dims + 12, what)
            buf = c.buf
            pos = c.pos
            shape = struct.unpack_from(_DIMS[n_dims], buf, pos)
            pos += 8 * n_dims
            ggml_type = u32(buf, pos)[0]
            offset = u64(buf, pos + 4)[0]
            c.pos = pos + 12
            if name in seen:
                raise c.fail(f"duplicate tensor name {name!r}", at)
            seen.add(name)
            size = sizes.get(ggml_type)
            if size is None:
                raise c.fail(
                    f"tensor {name!r} has unknown type {ggml_type}; the file may need a newer "
                    "qmgui",
                    at,
                )
            n = 1
            for d in shape:
                n *= d
            if n >= 1 << 63:
                raise c.fail(f"tensor {name!r} shape {shape} overflows 63 bits", at)
            if shape[0] % size[0]:
                raise c.fail(
                    f"tensor {name!r} row of {shape[0]} is not a multiple of the "
                    f"{ggml_type_name(ggml_type)} block size {size[0]}",
                    at,
                )
            tensors.append(TensorInfo(name, ggml_type, shape, offset, n // size[0] * size[1]))
        return tuple(tensors)

    def check_tensor_data(self, tensors: tuple[TensorInfo, ...], data_offset: int) -> None:
        c = self.c
        data_size = c.size - data_offset
        for t in tensors:
            if t.offset % self.alignment_value:
                raise c.fail(
                    f"tensor {t.name!r} data offset {t.offset} is not a multiple of the "
                    f"alignment {self.alignment_value}"
                )
            if t.offset + t.nbytes > data_size:
                raise c.fail(
                    f"tensor {t.name!r} needs data up to byte {data_offset + t.offset + t.nbytes} "
                    f"but the file has {c.size}; the file is truncated, perhaps an unfinished "
                    "download: download it again",
                    data_offset + t.offset,
                )


# --- plain-data form, for the header cache ----------------------------------------------------


def header_to_data(h: GGUFHeader) -> dict[str, object]:
    """A JSON-safe form of a header (the cache stores it); `header_from_data` inverts it."""
    return {
        "v": h.version,
        "size": h.file_size,
        "align": h.alignment,
        "data": h.data_offset,
        "md": {k: _value_to_data(v) for k, v in h.metadata.items()},
        "t": [[t.name, t.ggml_type, list(t.shape), t.offset] for t in h.tensors],
    }


def header_from_data(path: str, d: Mapping[str, object]) -> GGUFHeader:
    md = d["md"]
    tensors = d["t"]
    if not isinstance(md, dict) or not isinstance(tensors, list):
        raise ValueError("not a cached GGUF header")
    return GGUFHeader(
        path=path,
        version=int(d["v"]),  # type: ignore[call-overload]
        file_size=int(d["size"]),  # type: ignore[call-overload]
        metadata={k: _value_from_data(v) for k, v in md.items()},
        tensors=tuple(
            TensorInfo(name, gt, tuple(shape), off, tensor_nbytes(gt, tuple(shape)))
            for name, gt, shape, off in tensors
        ),
        alignment=int(d["align"]),  # type: ignore[call-overload]
        data_offset=int(d["data"]),  # type: ignore[call-overload]
    )


def _value_to_data(v: MetaValue) -> object:
    if isinstance(v, ArrayInfo):
        return {"array": [v.elem_type, v.count]}
    if isinstance(v, tuple):
        return [_value_to_data(x) for x in v]
    return v


def _value_from_data(v: object) -> MetaValue:
    if isinstance(v, dict):
        elem_type, count = v["array"]
        return ArrayInfo(int(elem_type), int(count))
    if isinstance(v, list):
        return tuple(_value_from_data(x) for x in v)
    if not isinstance(v, (int, float, str)):
        raise ValueError(f"unexpected cached value {v!r}")
    return v
