"""Reading what a user's disk holds without being stalled or flooded by it.

- `open_regular`: opens a path for reading only when it is (after following symlinks) a
  regular file. A FIFO, socket or device is reported, never opened: opening a FIFO blocks
  until some other process writes to it (a scan would hang forever), and a device can be
  endless or have side effects on open. The check is `os.stat` before the open; the open
  itself uses `O_NONBLOCK` and is checked again with `fstat`, so a file swapped for a FIFO
  between the two steps cannot block either.
- `loads_json`: the stdlib parser with limits a hostile file cannot get past: nesting depth,
  number of values (checked on the raw bytes before parsing, so memory stays bounded by the
  input size), digits of a number, and no `NaN` / `Infinity` (JSON has none; Python's parser
  accepts them, and `1e999` parses to infinity).

Both raise `ModelReadError` with a sentence naming the file; nothing else escapes.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from typing import IO, Any

from qmgui.core.errors import ModelReadError

# JSON limits. Real model configs nest 3-5 levels and hold a few hundred values; a
# safetensors header holds ~10 values per tensor (tens of thousands of tensors at most).
MAX_JSON_DEPTH = 64
# commas and brackets of one document: a safetensors header spends ~8 per tensor, so this is
# ~64k tensors in one file (GGUF allows 32k); a hostile document of this many values still
# parses into well under 64 MiB
MAX_JSON_ITEMS = 1 << 19
MAX_JSON_INT_DIGITS = 24  # a u64 has 20 digits; Python refuses to parse past 4,300
MAX_JSON_FLOAT_CHARS = 64  # rope_theta 1e6, eps 1e-6, 0.02: a few characters


def kind_of(mode: int) -> str | None:
    """What a non-regular file is, in words (None for a regular file)."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def not_regular(path: str, mode: int) -> ModelReadError | None:
    """The error for a path that is not a regular file (None when it is one)."""
    kind = kind_of(mode)
    if kind is None:
        return None
    if kind == "a folder":
        return ModelReadError(path, "is a folder, not a file")
    if kind == "not a regular file":
        return ModelReadError(path, "is not a regular file; not opened")
    return ModelReadError(path, f"is {kind}, not a regular file; not opened")


def _os_error(path: str, e: OSError) -> ModelReadError:
    if isinstance(e, FileNotFoundError):
        if os.path.islink(path):
            return ModelReadError(path, "is a broken symlink; its target is gone")
        return ModelReadError(path, "file vanished before it could be read; rescan")
    if isinstance(e, PermissionError):
        return ModelReadError(path, "permission denied; check the file's permissions")
    if isinstance(e, IsADirectoryError):
        return ModelReadError(path, "is a folder, not a file")
    return ModelReadError(path, f"could not be read ({e.strerror or e})")


_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
_FLAGS |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def open_regular(path: str | os.PathLike[str]) -> io.FileIO:
    """`path` opened for unbuffered binary reading; ModelReadError when it is not a regular
    file (nothing is opened then) or cannot be read."""
    fspath = os.fspath(path)
    try:
        st = os.stat(fspath)
    except OSError as e:
        raise _os_error(fspath, e) from e
    bad = not_regular(fspath, st.st_mode)
    if bad is not None:
        raise bad
    try:
        fd = os.open(fspath, _FLAGS)
    except OSError as e:
        raise _os_error(fspath, e) from e
    try:
        bad = not_regular(fspath, os.fstat(fd).st_mode)
        if bad is not None:
            raise bad
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """At most `limit` + 1 bytes of a regular file (one more than `limit` says "too big")."""
    fspath = os.fspath(path)
    with open_regular(fspath) as f:
        try:
            return read_upto(f, limit + 1)
        except OSError as e:
            raise _os_error(fspath, e) from e


def read_upto(f: IO[bytes], n: int) -> bytes:
    parts: list[bytes] = []
    left = n
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class JsonLimitError(ValueError):
    """A JSON document over one of the limits (a sentence for the user)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise JsonLimitError(f"a number of {len(text)} digits (at most {MAX_JSON_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_JSON_FLOAT_CHARS:
        raise JsonLimitError(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise JsonLimitError(f"a number out of range ({text})")
    return value


def _parse_constant(text: str) -> Any:
    raise JsonLimitError(f"{text}, which is not a JSON number")


def _depth_over(value: Any, limit: int) -> bool:
    """Whether `value` nests deeper than `limit` (iterative: no recursion to exhaust)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def loads_json(raw: bytes, path: str, *, what: str = "is", offset: int | None = None) -> Any:
    """Parse `raw` as JSON within the limits above; ModelReadError("<what> not valid JSON
    (...)") naming `path` otherwise. `what` starts the sentence ("header is", "is")."""
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > MAX_JSON_ITEMS:
        raise ModelReadError(
            path,
            f"{what} JSON with more than {MAX_JSON_ITEMS:,} values; not a model file",
            offset=offset,
        )
    try:
        value = json.loads(
            raw,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except JsonLimitError as e:
        raise ModelReadError(path, f"{what} not usable JSON: it holds {e}", offset=offset) from e
    except RecursionError as e:
        raise ModelReadError(
            path, f"{what} JSON nested too deeply (at most {MAX_JSON_DEPTH} levels)", offset=offset
        ) from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelReadError(path, f"{what} not valid JSON ({e})", offset=offset) from e
    except ValueError as e:  # anything else the parser refuses
        raise ModelReadError(path, f"{what} not valid JSON ({e})", offset=offset) from e
    if _depth_over(value, MAX_JSON_DEPTH):
        raise ModelReadError(
            path, f"{what} JSON nested too deeply (at most {MAX_JSON_DEPTH} levels)", offset=offset
        )
    return value
