"""``gguf.GGUFWriter`` with a faster encoder for large string / integer arrays.

The stock writer packs arrays one element at a time through ``struct`` (several Python calls
per token); a 150k-token vocabulary with its merges then takes seconds. This subclass produces
byte-identical output for little-endian arrays of strings, ints and floats, and defers to the
stock code for everything else.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import gguf
import numpy as np
from gguf import GGUFValueType as V

_NUMERIC = {
    V.UINT8: "<u1",
    V.INT8: "<i1",
    V.UINT16: "<u2",
    V.INT16: "<i2",
    V.UINT32: "<u4",
    V.INT32: "<i4",
    V.FLOAT32: "<f4",
    V.UINT64: "<u8",
    V.INT64: "<i8",
    V.FLOAT64: "<f8",
}
_MIN_FAST = 64  # short arrays: the stock path is fine


class FastGGUFWriter(gguf.GGUFWriter):
    def _pack_val(self, val: Any, vtype: V, add_vtype: bool, sub_type: V | None = None) -> bytes:
        if (
            vtype != V.ARRAY
            or self.endianess != gguf.GGUFEndian.LITTLE
            or not isinstance(val, Sequence)
            or isinstance(val, (str, bytes))
            or len(val) < _MIN_FAST
        ):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = sub_type if sub_type is not None else V.get_type(val[0])
        head = (struct.pack("<I", V.ARRAY) if add_vtype else b"") + struct.pack(
            "<IQ", ltype, len(val)
        )
        if ltype == V.STRING:
            encoded = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in val]
            lengths = np.fromiter((len(e) for e in encoded), dtype="<u8", count=len(encoded))
            # interleave the 8-byte length prefixes with the payloads
            parts: list[bytes] = [b""] * (2 * len(encoded))
            parts[0::2] = [x.tobytes() for x in lengths]
            parts[1::2] = encoded
            return head + b"".join(parts)
        if ltype in _NUMERIC:
            return head + np.asarray(val, dtype=_NUMERIC[ltype]).tobytes()
        return super()._pack_val(val, vtype, add_vtype, sub_type)
