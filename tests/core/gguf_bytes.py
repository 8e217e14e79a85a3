"""Tiny helpers that write GGUF bytes by hand, for malformed and hostile inputs."""

from __future__ import annotations

import struct

U32 = 4
U64 = 10
STRING = 8
ARRAY = 9


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def kv_u32(key: str, value: int) -> bytes:
    return gstr(key) + struct.pack("<II", U32, value)


def kv_str(key: str, value: str) -> bytes:
    return gstr(key) + struct.pack("<I", STRING) + gstr(value)


def kv_array_header(key: str, elem_type: int, count: int) -> bytes:
    return gstr(key) + struct.pack("<IIQ", ARRAY, elem_type, count)


def tensor_info(name: str, shape: tuple[int, ...], ggml_type: int = 0, offset: int = 0) -> bytes:
    return (
        gstr(name)
        + struct.pack("<I", len(shape))
        + b"".join(struct.pack("<Q", d) for d in shape)
        + struct.pack("<IQ", ggml_type, offset)
    )
